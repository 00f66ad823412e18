#include "fusetune/recipes/grad_sync.h"

#include <map>

#include "fusetune/core/dtype.h"
#include "fusetune/util/error.h"

namespace fusetune {

void accumulate_gradient(TensorMap& grads, const std::string& name, Tensor g, bool first) {
  Tensor& acc = grads[name];
  if (first) {
    acc = std::move(g);
  } else if (acc.dtype() == DType::BF16) {
    // bf16 gradients: each sum in fp32, rounded to nearest back to bf16 once per
    // micro-batch (at most half an ulp per micro-batch; no fp32 copy is held).
    uint16_t* a = acc.data<uint16_t>();
    const uint16_t* d = g.data<uint16_t>();
    for (int64_t i = 0; i < acc.numel(); ++i)
      a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(d[i]));
  } else {
    float* a = acc.data<float>();
    const float* d = g.data<float>();
    for (int64_t i = 0; i < acc.numel(); ++i) a[i] += d[i];
  }
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
