#include "fusetune/dist/grad_allreduce.h"

#include <algorithm>

#include "fusetune/runtime/dtype.h"
#include "fusetune/util/error.h"

namespace fusetune::dist {
namespace {

// Copies between a gradient (fp32 or bf16) and fp32 bucket space.
void to_f32(const Tensor& t, int64_t begin, int64_t n, float* out) {
  if (t.dtype() == DType::F32) {
    std::copy_n(t.data<float>() + begin, n, out);
  } else {
    const uint16_t* src = t.data<uint16_t>() + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
  }
}

void from_f32(const float* in, int64_t begin, int64_t n, Tensor& t) {
  if (t.dtype() == DType::F32) {
    std::copy_n(in, n, t.data<float>() + begin);
  } else {
    uint16_t* dst = t.data<uint16_t>() + begin;
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(in[i]);
  }
}

}  // namespace

void allreduce_gradients(Communicator& comm, const std::vector<Tensor*>& grads,
                         const std::string& what, int64_t bucket_elements) {
  if (comm.size() == 1) return;
  for (const Tensor* g : grads)
    FT_CHECK(g->dtype() == DType::F32 || g->dtype() == DType::BF16,
             "gradient all-reduce: unsupported gradient dtype");
  std::vector<float> bucket;
  std::vector<Tensor*> pending;  // the tensors packed in `bucket`, in order
  auto flush = [&]() {
    if (pending.empty()) return;
    comm.allreduce_sum(bucket.data(), int64_t(bucket.size()), what);
    int64_t at = 0;
    for (Tensor* t : pending) {
      from_f32(bucket.data() + at, 0, t->numel(), *t);
      at += t->numel();
    }
    bucket.clear();
    pending.clear();
  };
  for (Tensor* g : grads) {
    const int64_t n = g->numel();
    if (n >= bucket_elements) {
      // Large: fp32 in place; bf16 through the bucket space, a bucket at a time.
      if (g->dtype() == DType::F32) {
        comm.allreduce_sum(g->data<float>(), n, what);
        continue;
      }
      flush();
      std::vector<float> chunk;
      for (int64_t begin = 0; begin < n; begin += bucket_elements) {
        const int64_t len = std::min(bucket_elements, n - begin);
        chunk.resize(size_t(len));
        to_f32(*g, begin, len, chunk.data());
        comm.allreduce_sum(chunk.data(), len, what);
        from_f32(chunk.data(), begin, len, *g);
      }
      continue;
    }
    if (int64_t(bucket.size()) + n > bucket_elements) flush();
    const size_t at = bucket.size();
    bucket.resize(at + size_t(n));
    to_f32(*g, 0, n, bucket.data() + at);
    pending.push_back(g);
  }
  flush();
}

}  // namespace fusetune::dist
