#pragma once
// Data parallelism's gradient sum: every rank's gradients replaced by the sum over the ranks.
// Small tensors are packed into flat fp32 buckets so that one collective moves many of them
// (a layer's norms and adapters are a few KB each: one call per tensor would be latency-bound);
// a tensor at least as large as a bucket is summed in place. bf16 gradients are summed in
// fp32 and rounded back once. The bucket space is one counted tensor (core/memory.h), so
// the logged peak memory includes it and `fusetune plan --nproc_per_node` predicts it
// (allreduce_buffer_elements).
#include <cstdint>
#include <string>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/distributed/communicator.h"

namespace fusetune::dist {

// Elements per bucket (16 MiB of fp32): bucket_cap_mb's default.
inline constexpr int64_t kBucketElements = int64_t(4) << 20;
// The fp32 elements of a bucket of `mib` MiB (bucket_cap_mb), at least one.
int64_t bucket_elements_of_mib(double mib);

// Copies elements [begin, begin + n) of a gradient (fp32 or bf16) to fp32 bucket space, and
// back (bf16 rounded to nearest).
void gradient_to_f32(const Tensor& t, int64_t begin, int64_t n, float* out);
void gradient_from_f32(const float* in, int64_t begin, int64_t n, Tensor& t);
// Sums a gradient over the ranks through `buffer` (fp32, `buffer_elements` long), a piece at a
// time: how a bf16 gradient larger than a bucket is all-reduced.
void allreduce_in_pieces(Communicator& comm, Tensor& g, float* buffer, int64_t buffer_elements,
                         const std::string& what);

// `grads` in the same order on every rank (the loop passes them sorted by parameter name).
void allreduce_gradients(Communicator& comm, const std::vector<Tensor*>& grads,
                         const std::string& what, int64_t bucket_elements = kBucketElements);

// The fp32 elements of the bucket space allreduce_gradients allocates for gradients of these
// element counts and dtypes (F32 or BF16): the small ones' total up to one bucket, a whole
// bucket when a large bf16 gradient goes through it in pieces; 0 when nothing needs it.
int64_t allreduce_buffer_elements(const std::vector<int64_t>& numels,
                                  const std::vector<DType>& dtypes,
                                  int64_t bucket_elements = kBucketElements);

}  // namespace fusetune::dist
