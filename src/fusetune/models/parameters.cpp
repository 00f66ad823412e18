#include "fusetune/models/parameters.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "fusetune/util/error.h"
#include "fusetune/util/mix64.h"

namespace fusetune {

std::vector<ParamInfo> graph_parameters(const Graph& g) {
  std::vector<ParamInfo> out;
  std::set<std::string> seen;
  for (const Node& n : g.nodes())
    if (n.op == Op::Param && seen.insert(n.name).second)
      out.push_back({n.name, n.outputs[0].shape, n.trainable});
  return out;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

uint64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The stream key of one parameter.
uint64_t stream_key(uint64_t seed, const std::string& name) {
  return mix64(mix64(seed + kMix64Gamma) ^ name_hash(name));
}

inline float as_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint32_t as_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The values are F32 in the end, so the normals are computed in float (twice the SIMD lanes
// of double) with polynomials accurate to float; no libm calls but sqrt, and every step
// branch-free integer or float arithmetic, so that loops over pairs vectorize. Plain
// multiplies and adds in a fixed order (the build has -ffp-contract=off): the same bits on
// any machine and for any thread count.

// ln(x) for x in [2^-32, 1]: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s),
// s = (m - 1) / (m + 1), |s| <= 0.172, by its series to s^9 (relative error below 3e-9).
inline float ln_unit(float x) {
  const uint32_t b = as_bits(x);
  float e = float(int32_t(b >> 23) - 127);
  float m = as_float((b & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  // m > sqrt(2) (positive floats order like their bits) as a mask: m /= 2, e += 1 there.
  const uint32_t big = -uint32_t(as_bits(m) > 0x3fb504f3u);  // sqrt(2)
  m = as_float((as_bits(m * 0.5f) & big) | (as_bits(m) & ~big));
  e = e + as_float(big & 0x3f800000u);  // + 1 or + 0
  const float sv = (m - 1.0f) / (m + 1.0f), s2 = sv * sv;
  float p = 1.0f / 9;
  p = p * s2 + 1.0f / 7;
  p = p * s2 + 1.0f / 5;
  p = p * s2 + 1.0f / 3;
  p = p * s2 + 1.0f;
  return e * 0.693147182f + 2.0f * sv * p;
}

// cos and sin of y, |y| <= pi/4, by their Taylor series to y^10 / y^9 (error below 3e-9).
inline void sincos_quarter(float y, float* c, float* s) {
  const float y2 = y * y;
  float cp = -1.0f / 3628800;  // -1/10!
  cp = cp * y2 + 1.0f / 40320;
  cp = cp * y2 - 1.0f / 720;
  cp = cp * y2 + 1.0f / 24;
  cp = cp * y2 - 0.5f;
  *c = cp * y2 + 1.0f;
  float sp = 1.0f / 362880;  // 1/9!
  sp = sp * y2 - 1.0f / 5040;
  sp = sp * y2 + 1.0f / 120;
  sp = sp * y2 - 1.0f / 6;
  *s = y * (sp * y2 + 1.0f);
}

// Normals 2j and 2j+1 of a stream: SplitMix64 at counter j + 1 gives 64 random bits, 31 for
// u1 in [2^-32, 1] (so |z| <= sqrt(2 ln 2^32) = 6.66, beyond which a normal falls once in
// 4e10 draws) and 32 for the angle; Box-Muller turns them into two independent standard
// normals r cos(psi), r sin(psi) with r = sqrt(-2 ln u1) and psi uniform on a full turn.
inline void normal_pair(uint64_t key, uint64_t j, float* a, float* b) {
  const uint64_t bits = mix64(key + (j + 1) * kMix64Gamma);
  // Signed 31-bit integers: their conversion to float is one instruction on every SIMD ISA.
  const float u1 = (float(int32_t(bits >> 33)) + 0.5f) * 0x1p-31f;
  // The low 32 bits: the quadrant q (2 bits), then the angle within it (30 bits).
  const uint32_t lo = uint32_t(bits), q = (lo >> 30) & 3u;
  const float f = float(int32_t(lo & 0x3fffffffu)) * 0x1p-30f;  // [0, 1]
  float c, s;
  sincos_quarter((f - 0.5f) * 1.57079637f, &c, &s);
  // Rotate (c, s) by q quarter turns: q = 0 (c, s), 1 (-s, c), 2 (-c, -s), 3 (s, -c); as
  // selections and sign flips on the bits, without branches.
  const uint32_t odd = -(q & 1u);  // all ones or zero
  const uint32_t cb = as_bits(c), sb = as_bits(s);
  const uint32_t crb = (sb & odd) | (cb & ~odd), srb = (cb & odd) | (sb & ~odd);
  const float r = std::sqrt(-2.0f * ln_unit(u1));
  *a = r * as_float(crb ^ (((q ^ (q >> 1)) & 1u) << 31));
  *b = r * as_float(srb ^ ((q >> 1) << 31));
}

enum class InitKind { Ones, Zeros, Normal };

InitKind init_kind(const std::string& name, bool norms_at_zero) {
  if (ends_with(name, "norm.weight")) return norms_at_zero ? InitKind::Zeros : InitKind::Ones;
  if (ends_with(name, ".bias")) return InitKind::Zeros;
  return InitKind::Normal;
}

// Elements per block: 16 KiB of F32, in L1 between being generated and being stored. Even,
// so that each normal pair lies in one block.
constexpr int64_t kInitBlock = int64_t(1) << 12;

// Elements [first, first + m) of a parameter as F32 (m <= kInitBlock, first even): the pairs by a
// loop that vectorizes, then interleaved and scaled.
void init_block(InitKind kind, uint64_t key, float sd, int64_t first, int64_t m, float* out) {
  if (kind != InitKind::Normal) {
    std::fill(out, out + m, kind == InitKind::Ones ? 1.0f : 0.0f);
    return;
  }
  float za[kInitBlock / 2], zb[kInitBlock / 2];
  const int64_t pairs = (m + 1) / 2;
  const uint64_t j0 = uint64_t(first / 2);
#pragma omp simd
  for (int64_t k = 0; k < pairs; ++k) normal_pair(key, j0 + uint64_t(k), &za[k], &zb[k]);
  for (int64_t k = 0; k < m / 2; ++k) {
    out[2 * k] = sd * za[k];
    out[2 * k + 1] = sd * zb[k];
  }
  if (m % 2) out[m - 1] = sd * za[m / 2];
}

// Elements [first, first + n) of a parameter, `first` even, a block at a time (OpenMP over
// blocks): each block is made as F32 and handed to `put(offset, values, m)`, which writes it
// in the destination's dtype, so no buffer larger than a block ever exists.
template <class Put>
void fill(InitKind kind, uint64_t key, double std, int64_t first, int64_t n, Put put) {
  const float sd = float(std);
  const int64_t blocks = (n + kInitBlock - 1) / kInitBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * kInitBlock, m = std::min(n - lo, kInitBlock);
    float v[kInitBlock];
    init_block(kind, key, sd, first + lo, m, v);
    put(lo, v, m);
  }
}

}  // namespace

void init_parameter(const std::string& name, uint64_t seed, double std, Tensor& out,
                    bool norms_at_zero) {
  const InitKind kind = init_kind(name, norms_at_zero);
  const uint64_t key = stream_key(seed, name);
  const int64_t n = out.numel();
  switch (out.dtype()) {
    case DType::F64: {
      double* d = out.data<double>();
      fill(kind, key, std, 0, n, [d](int64_t lo, const float* v, int64_t m) {
        for (int64_t i = 0; i < m; ++i) d[lo + i] = double(v[i]);
      });
      break;
    }
    case DType::F32: {
      float* d = out.data<float>();
      fill(kind, key, std, 0, n,
           [d](int64_t lo, const float* v, int64_t m) { std::memcpy(d + lo, v, size_t(m) * 4); });
      break;
    }
    case DType::BF16: {
      uint16_t* d = out.data<uint16_t>();
      // f32_to_bf16's round to nearest even, inline so that it vectorizes (values are finite).
      fill(kind, key, std, 0, n, [d](int64_t lo, const float* v, int64_t m) {
#pragma omp simd
        for (int64_t i = 0; i < m; ++i) {
          const uint32_t bits = as_bits(v[i]);
          d[lo + i] = uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
        }
      });
      break;
    }
    case DType::F16: {
      uint16_t* d = out.data<uint16_t>();
      fill(kind, key, std, 0, n, [d](int64_t lo, const float* v, int64_t m) {
        for (int64_t i = 0; i < m; ++i) d[lo + i] = f32_to_f16(v[i]);
      });
      break;
    }
    default:
      throw Error("cannot initialize parameter '" + name + "' as " + dtype_name(out.dtype()) +
                  " (not a float type)");
  }
}

TensorMap init_parameters(const std::vector<ParamInfo>& params, uint64_t seed, DType dtype,
                          double std, ParamSink* sink, bool norms_at_zero) {
  FT_CHECK(
      dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16 || dtype == DType::F16,
      std::string("cannot initialize parameters as ") + dtype_name(dtype) + " (not a float type)");
  TensorMap out;
  for (const ParamInfo& p : params) {
    if (sink && sink->takes(p.name)) {
      const InitKind kind = init_kind(p.name, norms_at_zero);
      const uint64_t key = stream_key(seed, p.name);
      sink->put(p.name, p.shape, [&](int64_t first, int64_t n, float* dst) {
        FT_CHECK(first % 2 == 0, "init: a parameter range must start at an even element");
        fill(kind, key, std, first, n, [dst](int64_t lo, const float* v, int64_t m) {
          std::memcpy(dst + lo, v, size_t(m) * 4);
        });
      });
      continue;
    }
    Tensor t = Tensor::empty(p.shape, dtype);
    init_parameter(p.name, seed, std, t, norms_at_zero);
    out[p.name] = std::move(t);
  }
  return out;
}

}  // namespace fusetune
