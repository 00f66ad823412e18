#include "fusetune/recipes/grad_sync.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>

#include "fusetune/core/dtype.h"
#include "fusetune/util/error.h"

namespace fusetune {

namespace {

// acc[begin, begin + n) += g[begin, begin + n) (bf16: each sum in fp32, rounded to nearest back
// to bf16 once per micro-batch: at most half an ulp per micro-batch, no fp32 copy is held).
void add_gradient_range(Tensor& acc, const Tensor& g, int64_t begin, int64_t n) {
  if (acc.dtype() == DType::BF16) {
    uint16_t* a = acc.data<uint16_t>() + begin;
    const uint16_t* d = g.data<uint16_t>() + begin;
    for (int64_t i = 0; i < n; ++i) a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(d[i]));
  } else {
    float* a = acc.data<float>() + begin;
    const float* d = g.data<float>() + begin;
    for (int64_t i = 0; i < n; ++i) a[i] += d[i];
  }
}

// The rows either row set names, sorted; null when either is dense or their rows differ.
std::shared_ptr<const RowSet> union_of_rows(const Tensor& a, const Tensor& b) {
  const RowSet *x = a.nonzero_rows().get(), *y = b.nonzero_rows().get();
  if (!x || !y || x->row_bytes != y->row_bytes) return nullptr;
  auto u = std::make_shared<RowSet>();
  u->row_bytes = x->row_bytes;
  std::set_union(x->rows.begin(), x->rows.end(), y->rows.begin(), y->rows.end(),
                 std::back_inserter(u->rows));
  return u;
}

}  // namespace

void accumulate_gradient(TensorMap& grads, const std::string& name, Tensor g, bool first) {
  Tensor& acc = grads[name];
  if (first) {
    acc = std::move(g);
    return;
  }
  std::shared_ptr<const RowSet> rows = union_of_rows(acc, g);
  if (!rows) {
    add_gradient_range(acc, g, 0, acc.numel());
    acc.drop_nonzero_rows();
    return;
  }
  // Row sets (an embedding's gradient): outside the union both are +0, whose sum is +0, so
  // adding the union's rows alone is bitwise the dense sum.
  const int64_t row_elems = rows->row_bytes / int64_t(dtype_size(acc.dtype()));
  for (int32_t r : rows->rows) add_gradient_range(acc, g, int64_t(r) * row_elems, row_elems);
  acc.storage()->set_nonzero_rows(std::move(rows));
}

std::vector<std::string> rank0_order(const GradSyncContext& c, const std::vector<std::string>& mine,
                                     const std::string& what) {
  const std::vector<std::string>& trainable = *c.trainable;
  std::map<std::string, int32_t> position;
  for (size_t i = 0; i < trainable.size(); ++i) position[trainable[i]] = int32_t(i);
  std::vector<int32_t> order;
  for (const std::string& name : mine)
    if (auto it = position.find(name); it != position.end()) order.push_back(it->second);
  int64_t n = int64_t(order.size());
  c.comm->broadcast(&n, sizeof n, 0, what);
  order.resize(size_t(n));
  c.comm->broadcast(order.data(), n * int64_t(sizeof(int32_t)), 0, what);
  std::vector<std::string> names;
  for (int32_t i : order) {
    FT_CHECK(i >= 0 && size_t(i) < trainable.size(), what + ": a bad parameter index");
    names.push_back(trainable[size_t(i)]);
  }
  return names;
}

std::unique_ptr<GradSync> choose_grad_sync(const GradSyncContext& c, TrainingStep& step,
                                           int64_t zero_stage, bool overlap, bool in_bwd,
                                           const std::string& recipe) {
  if (zero_stage >= 2) return make_owned(c, step);
  if (c.world > 1 && !in_bwd && overlap) {
    if (!c.comm->serialized_threads()) {
      c.log(
          "overlap_grad_allreduce: the MPI library does not provide MPI_THREAD_MULTIPLE: "
          "gradients are summed after the backward");
    } else if (auto streamed = make_streamed(c, step)) {
      return streamed;
    } else {
      c.log("overlap_grad_allreduce: the " + recipe +
            " recipe's step sums its gradients after the backward");
    }
  }
  return make_sum_after_backward(c);
}

}  // namespace fusetune
