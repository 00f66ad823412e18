#include "fusetune/kernels/cpu/bf16_matmul.h"

#include "fusetune/kernels/cpu/decode_gemv.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>

#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

constexpr const char* kEnv = "FUSETUNE_BF16_MATMUL";

enum class Request { Auto, Widening, OneDnn };

Request requested_path() {
  const char* v = std::getenv(kEnv);
  if (!v || !*v || std::strcmp(v, "auto") == 0) return Request::Auto;
  if (std::strcmp(v, "widening") == 0) return Request::Widening;
  if (std::strcmp(v, "onednn") == 0) return Request::OneDnn;
  throw Error(std::string(kEnv) + "=" + v +
              ": expected auto (oneDNN where the CPU has bf16 dot products), widening or onednn");
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "no bf16 dot products";
  }
}

// A matmul's primitive, made once per shape and thread count (oneDNN splits the work when it
// builds it): oneDNN's own cache keeps primitives, but building the descriptor again costs
// more than a small GEMM.
struct Prepared {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};
// (trans_a, trans_b, M, N, K, c_bf16, threads, lda, ldb, ldc, accumulate)
using Key =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, bool, int, int64_t, int64_t, int64_t, bool>;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// At most kCacheSize shapes are kept (decode meets a new prompt length per request): past that
// the cache starts over; a caller holds its own reference.
constexpr size_t kCacheSize = 256;

std::shared_ptr<const Prepared> prepared(const Key& key) {
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Prepared>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const auto [ta, tb, M, N, K, c_bf16, threads, lda, ldb, ldc, accumulate] = key;
  (void)threads;  // oneDNN reads it from OpenMP itself
  using dt = dnnl::memory::data_type;
  // Row-major operands, a transposed one described by its strides: no copy.
  const dnnl::memory::desc a_md({M, K}, dt::bf16,
                                ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const dnnl::memory::desc b_md({K, N}, dt::bf16,
                                tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const dnnl::memory::desc c_md({M, N}, c_bf16 ? dt::bf16 : dt::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // our counted buffer, not oneDNN's
  if (accumulate) {  // C += A B: oneDNN's sum post-op reads C before it writes it
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
  dnnl::matmul prim(pd);
  if (cache.size() >= kCacheSize) cache.clear();
  return cache.emplace(key, std::make_shared<const Prepared>(Prepared{pd, prim})).first->second;
}

int64_t batch_of(const Tensor& t) {
  int64_t b = 1;
  for (int i = 0; i + 2 < t.rank(); ++i) b *= t.dim(i);
  return b;
}

}  // namespace

bool cpu_has_bf16_dot_products() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

Bf16MatmulPath bf16_matmul_path() {
  switch (requested_path()) {
    case Request::Widening:
      return Bf16MatmulPath::Widening;
    case Request::OneDnn:
      FT_CHECK(cpu_has_bf16_dot_products(),
               std::string(kEnv) + "=onednn, but this CPU has no bf16 dot products (oneDNN sees " +
                   isa_name(dnnl::get_effective_cpu_isa()) + "): unset it or use widening");
      return Bf16MatmulPath::OneDnn;
    case Request::Auto:
      break;
  }
  return cpu_has_bf16_dot_products() ? Bf16MatmulPath::OneDnn : Bf16MatmulPath::Widening;
}

std::string bf16_matmul_description() {
  const Request r = requested_path();
  if (bf16_matmul_path() == Bf16MatmulPath::OneDnn) {
    const dnnl::version_t* v = dnnl::version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + " (" + isa_name(dnnl::get_effective_cpu_isa()) +
           "), fp32 accumulation: matmuls, fused LM heads, NF4 and fake-quantized tiles" +
           (r == Request::OneDnn ? " (" + std::string(kEnv) + "=onednn)" : "");
  }
  return std::string("widening to fp32 for OpenBLAS (") +
         (r == Request::Widening ? std::string(kEnv) + "=widening"
                                 : std::string("the CPU has no bf16 dot products")) +
         ")";
}

namespace {

// oneDNN's row strides for a product whose layout leaves some at 0 (contiguous).
Key key_of(bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool c_bf16,
           const Bf16MatmulLayout& l) {
  return Key{ta,
             tb,
             M,
             N,
             K,
             c_bf16,
             omp_get_max_threads(),
             l.lda > 0 ? l.lda : (ta ? M : K),
             l.ldb > 0 ? l.ldb : (tb ? K : N),
             l.ldc > 0 ? l.ldc : N,
             l.accumulate};
}

void run_onednn(const Key& key, const uint16_t* A, const uint16_t* B, void* C) {
  const std::shared_ptr<const Prepared> p = prepared(key);
  dnnl::engine& engine = cpu_engine();
  const dnnl::memory::desc scratch_md = p->pd.scratchpad_desc();
  Tensor scratch;  // counted, freed when the call ends
  if (scratch_md.get_size() > 0)
    scratch = Tensor::empty({int64_t((scratch_md.get_size() + 3) / 4)}, DType::F32);
  dnnl::memory a(p->pd.src_desc(), engine, const_cast<uint16_t*>(A));
  dnnl::memory b(p->pd.weights_desc(), engine, const_cast<uint16_t*>(B));
  dnnl::memory c(p->pd.dst_desc(), engine, C);
  dnnl::memory s(scratch_md, engine, scratch.defined() ? scratch.raw() : nullptr);
  dnnl::stream stream(engine);
  p->prim.execute(
      stream,
      {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, s}});
  stream.wait();
}

}  // namespace

void matmul_bf16_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const uint16_t* A, const uint16_t* B, void* C, bool c_bf16) {
  FT_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul_bf16_onednn: negative size");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: zeros (+0 in bf16 too)
    std::memset(C, 0, size_t(M * N) * (c_bf16 ? 2 : 4));
    return;
  }
  run_onednn(key_of(trans_a, trans_b, M, N, K, c_bf16, {}), A, B, C);
}

void matmul_bf16_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const uint16_t* A, const uint16_t* B, float* C,
                        const Bf16MatmulLayout& layout) {
  FT_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul_bf16_onednn: negative size");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: zeros, or C unchanged
    const int64_t ldc = layout.ldc > 0 ? layout.ldc : N;
    if (!layout.accumulate)
      for (int64_t i = 0; i < M; ++i) std::memset(C + i * ldc, 0, sizeof(float) * size_t(N));
    return;
  }
  run_onednn(key_of(trans_a, trans_b, M, N, K, false, layout), A, B, C);
}

int64_t matmul_bf16_onednn_scratch_bytes(bool trans_a, bool trans_b, int64_t M, int64_t N,
                                         int64_t K, const Bf16MatmulLayout& layout) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  const size_t bytes =
      prepared(key_of(trans_a, trans_b, M, N, K, false, layout))->pd.scratchpad_desc().get_size();
  return int64_t((bytes + 3) / 4 * 4);  // as run_onednn allocates it: fp32 elements
}

bool matmul_bf16_native(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, Tensor& c) {
  if (a.dtype() != DType::BF16 || b.dtype() != DType::BF16) return false;
  if (c.dtype() != DType::BF16 && c.dtype() != DType::F32) return false;
  if (a.rank() < 2 || b.rank() < 2 || batch_of(a) != 1 || batch_of(b) != 1) return false;
  const int ra = a.rank(), rb = b.rank();
  const int64_t M = trans_a ? a.dim(ra - 1) : a.dim(ra - 2);
  const int64_t K = trans_a ? a.dim(ra - 2) : a.dim(ra - 1);
  const int64_t N = trans_b ? b.dim(rb - 2) : b.dim(rb - 1);
  FT_CHECK((trans_b ? b.dim(rb - 1) : b.dim(rb - 2)) == K && c.numel() == M * N,
           "matmul_bf16_native: operand shapes do not match");
  const bool onednn = bf16_matmul_path() == Bf16MatmulPath::OneDnn;
  const bool decode_rows = !trans_a && trans_b && M <= kDecodeGemvMaxRows;  // a decode's x W^T
  if (decode_rows && onednn && M >= kDecodeAmxMinRows && amx_tiles_usable()) {
    decode_gemv_bf16_amx(M, N, K, a.data<uint16_t>(), b.data<uint16_t>(), c.raw(),
                         c.dtype() == DType::BF16);
    return true;
  }
  if (decode_rows && (!onednn || M <= kDecodeGemvRowsBeforeOneDnn)) {
    decode_gemv_bf16_weight(M, N, K, a.data<uint16_t>(), true, b.data<uint16_t>(), c.raw(),
                            c.dtype() == DType::BF16);
    return true;
  }
  if (!onednn) return false;
  matmul_bf16_onednn(trans_a, trans_b, M, N, K, a.data<uint16_t>(), b.data<uint16_t>(), c.raw(),
                     c.dtype() == DType::BF16);
  return true;
}

}  // namespace fusetune::kernels
