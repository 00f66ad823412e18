#include "fusetune/distributed/grad_allreduce.h"

#include <algorithm>
#include <cmath>

#include "fusetune/core/dtype.h"
#include "fusetune/distributed/row_sparse_allreduce.h"
#include "fusetune/util/error.h"

namespace fusetune::dist {

void gradient_to_f32(const Tensor& t, int64_t begin, int64_t n, float* out) {
  if (t.dtype() == DType::F32) {
    std::copy_n(t.data<float>() + begin, n, out);
  } else {
    const uint16_t* src = t.data<uint16_t>() + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
  }
}

void gradient_from_f32(const float* in, int64_t begin, int64_t n, Tensor& t) {
  if (t.dtype() == DType::F32) {
    std::copy_n(in, n, t.data<float>() + begin);
  } else {
    uint16_t* dst = t.data<uint16_t>() + begin;
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(in[i]);
  }
}

void allreduce_in_pieces(Communicator& comm, Tensor& g, float* buffer, int64_t buffer_elements,
                         const std::string& what) {
  for (int64_t begin = 0; begin < g.numel(); begin += buffer_elements) {
    const int64_t len = std::min(buffer_elements, g.numel() - begin);
    gradient_to_f32(g, begin, len, buffer);
    comm.allreduce_sum(buffer, len, what);
    gradient_from_f32(buffer, begin, len, g);
  }
}

int64_t bucket_elements_of_mib(double mib) {
  return std::max<int64_t>(1, std::llround(mib * double(1 << 20) / double(sizeof(float))));
}

int64_t allreduce_buffer_elements(const std::vector<int64_t>& numels,
                                  const std::vector<DType>& dtypes, int64_t bucket_elements) {
  int64_t small = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] < bucket_elements)
      small += numels[i];
    else if (dtypes[i] != DType::F32)
      return bucket_elements;  // a large bf16 gradient goes through it a bucket at a time
  }
  return std::min(small, bucket_elements);
}

void allreduce_gradients(Communicator& comm, const std::vector<Tensor*>& grads,
                         const std::string& what, int64_t bucket_elements) {
  if (comm.size() == 1) return;
  std::vector<int64_t> numels;
  std::vector<DType> dtypes;
  for (const Tensor* g : grads) {
    FT_CHECK(g->dtype() == DType::F32 || g->dtype() == DType::BF16,
             "gradient all-reduce: unsupported gradient dtype");
    numels.push_back(g->numel());
    dtypes.push_back(g->dtype());
  }
  // Gradients with row sets are summed as the prefix their rows are packed into; whether one
  // goes through a bucket is still decided by its whole size, so the bucket space is as planned.
  std::vector<PackedRows> packed = pack_row_sets(comm, grads, what);
  const int64_t space = allreduce_buffer_elements(numels, dtypes, bucket_elements);
  Tensor buffer = space > 0 ? Tensor::empty({space}, DType::F32) : Tensor();
  float* bucket = space > 0 ? buffer.data<float>() : nullptr;
  int64_t used = 0;
  std::vector<Tensor*> pending;  // the tensors packed in `bucket`, in order
  auto flush = [&]() {
    if (pending.empty()) return;
    comm.allreduce_sum(bucket, used, what);
    int64_t at = 0;
    for (Tensor* t : pending) {
      gradient_from_f32(bucket + at, 0, t->numel(), *t);
      at += t->numel();
    }
    used = 0;
    pending.clear();
  };
  for (PackedRows& p : packed) {
    Tensor* g = &p.packed;
    const int64_t n = g->numel();
    if (n == 0) continue;  // a row set that no rank touched
    if (p.grad->numel() >= bucket_elements) {
      // Large: fp32 in place; bf16 through the bucket space, a bucket at a time.
      if (g->dtype() == DType::F32) {
        comm.allreduce_sum(g->data<float>(), n, what);
        continue;
      }
      flush();
      allreduce_in_pieces(comm, *g, bucket, bucket_elements, what);
      continue;
    }
    if (used + n > bucket_elements) flush();
    gradient_to_f32(*g, 0, n, bucket + used);
    used += n;
    pending.push_back(g);
  }
  flush();
  unpack_row_sets(packed);
}

}  // namespace fusetune::dist
