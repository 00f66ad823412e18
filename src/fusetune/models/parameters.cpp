#include "fusetune/models/parameters.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "fusetune/util/error.h"

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

// SplitMix64's output function: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;  // SplitMix64's increment

uint64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The stream key of one parameter.
uint64_t stream_key(uint64_t seed, const std::string& name) {
  return mix64(mix64(seed + kGamma) ^ name_hash(name));
}

inline double as_double(uint64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

inline uint64_t as_bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

// ln(x) for x in (0, 1], x normal: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m =
// 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172, by its series to s^19 (relative error
// below 1e-15). Branch-free integer and float steps, so that loops of it vectorize.
inline double ln_unit(double x) {
  const uint64_t b = as_bits(x);
  // The biased exponent as a double, without an int -> double conversion.
  double e = as_double((b >> 52) | 0x4330000000000000ull) - 4503599627370496.0 - 1023.0;
  double m = as_double((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  // m > sqrt(2), compared on the bits (positive doubles order like their bits) into a mask,
  // so that no branch is needed: m /= 2, e += 1 where it holds.
  const uint64_t big = -uint64_t(as_bits(m) > 0x3ff6a09e667f3bcdull);  // sqrt(2)
  m = as_double((as_bits(m * 0.5) & big) | (as_bits(m) & ~big));
  e = e + as_double(big & 0x3ff0000000000000ull);  // + 1.0 or + 0.0
  const double sv = (m - 1.0) / (m + 1.0), s2 = sv * sv;
  double p = 1.0 / 19;
  p = p * s2 + 1.0 / 17;
  p = p * s2 + 1.0 / 15;
  p = p * s2 + 1.0 / 13;
  p = p * s2 + 1.0 / 11;
  p = p * s2 + 1.0 / 9;
  p = p * s2 + 1.0 / 7;
  p = p * s2 + 1.0 / 5;
  p = p * s2 + 1.0 / 3;
  p = p * s2 + 1.0;
  return e * 0.6931471805599453 + 2.0 * sv * p;
}

// cos and sin of y, |y| <= pi/4, by their Taylor series to y^16 / y^15 (error below 1e-16).
inline void sincos_quarter(double y, double* c, double* s) {
  const double y2 = y * y;
  double cp = 1.0 / 20922789888000.0;  // 1/16!
  cp = cp * y2 - 1.0 / 87178291200.0;
  cp = cp * y2 + 1.0 / 479001600.0;
  cp = cp * y2 - 1.0 / 3628800.0;
  cp = cp * y2 + 1.0 / 40320.0;
  cp = cp * y2 - 1.0 / 720.0;
  cp = cp * y2 + 1.0 / 24.0;
  cp = cp * y2 - 0.5;
  *c = cp * y2 + 1.0;
  double sp = -1.0 / 1307674368000.0;  // -1/15!
  sp = sp * y2 + 1.0 / 6227020800.0;
  sp = sp * y2 - 1.0 / 39916800.0;
  sp = sp * y2 + 1.0 / 362880.0;
  sp = sp * y2 - 1.0 / 5040.0;
  sp = sp * y2 + 1.0 / 120.0;
  sp = sp * y2 - 1.0 / 6.0;
  *s = y * (sp * y2 + 1.0);
}

// Normals 2j and 2j+1 of a stream: SplitMix64 at counter j + 1 gives 64 random bits, 32 for
// u1 in (0, 1] (so |z| <= sqrt(2 ln 2^32) = 6.66, beyond which a normal falls once in 4e10
// draws) and 32 for the angle; Box-Muller turns them into two independent standard normals
// r cos(psi), r sin(psi) with r = sqrt(-2 ln u1) and psi uniform on a full turn. All of it
// integer and float arithmetic (no libm calls but sqrt), so a loop over pairs vectorizes.
inline void normal_pair(uint64_t key, uint64_t j, double* a, double* b) {
  const uint64_t bits = mix64(key + (j + 1) * kGamma);
  const double u1 = 2.0 - as_double(((bits >> 32) << 20) | 0x3ff0000000000000ull);  // exact
  // The low 32 bits: the quadrant q (2 bits), then the angle within it (30 bits).
  const uint64_t q = (bits >> 30) & 3;
  const double f = as_double(((bits & 0x3fffffffull) << 22) | 0x3ff0000000000000ull) - 1.0;
  double c, s;
  sincos_quarter((f - 0.5) * 1.5707963267948966, &c, &s);
  // Rotate (c, s) by q quarter turns: q = 0 (c, s), 1 (-s, c), 2 (-c, -s), 3 (s, -c); as
  // selections and sign flips on the bits, without branches, so that the loop vectorizes.
  const uint64_t odd = -(q & 1);  // all ones or zero
  const uint64_t cb = as_bits(c), sb = as_bits(s);
  const uint64_t crb = (sb & odd) | (cb & ~odd), srb = (cb & odd) | (sb & ~odd);
  const double r = std::sqrt(-2.0 * ln_unit(u1));
  *a = r * as_double(crb ^ (((q ^ (q >> 1)) & 1) << 63));
  *b = r * as_double(srb ^ ((q >> 1) << 63));
}

enum class InitKind { Ones, Zeros, Normal };

InitKind init_kind(const std::string& name) {
  if (ends_with(name, "norm.weight")) return InitKind::Ones;
  if (ends_with(name, ".bias")) return InitKind::Zeros;
  return InitKind::Normal;
}

// Writes the values v (a double) of elements [first, first + n) through `store(i - first, v)`,
// F32/BF16/F16 rounding v to F32 first so that every narrower dtype is the F32 init rounded.
// `first` is even: element 2j and 2j+1 are one normal pair.
template <class Store>
void fill(InitKind kind, uint64_t key, double std, int64_t first, int64_t n, Store store) {
  if (kind != InitKind::Normal) {
    const double v = kind == InitKind::Ones ? 1.0 : 0.0;
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i) store(i, v);
    return;
  }
  // Blocks of an even number of elements, so each pair lies in one block; each block's pairs
  // are generated into a buffer by a loop that vectorizes, then stored.
  constexpr int64_t kBlock = int64_t(1) << 12;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * kBlock, m = std::min(n - lo, kBlock);
    const int64_t pairs = (m + 1) / 2;
    double za[kBlock / 2], zb[kBlock / 2];
    const uint64_t j0 = uint64_t((first + lo) / 2);
#pragma omp simd
    for (int64_t k = 0; k < pairs; ++k) normal_pair(key, j0 + uint64_t(k), &za[k], &zb[k]);
    for (int64_t k = 0; k < m / 2; ++k) {
      store(lo + 2 * k, std * za[k]);
      store(lo + 2 * k + 1, std * zb[k]);
    }
    if (m % 2) store(lo + m - 1, std * za[m / 2]);
  }
}

}  // namespace

void init_parameter(const std::string& name, uint64_t seed, double std, Tensor& out) {
  const InitKind kind = init_kind(name);
  const uint64_t key = stream_key(seed, name);
  const int64_t n = out.numel();
  switch (out.dtype()) {
    case DType::F64: {
      double* d = out.data<double>();
      fill(kind, key, std, 0, n, [d](int64_t i, double v) { d[i] = v; });
      break;
    }
    case DType::F32: {
      float* d = out.data<float>();
      fill(kind, key, std, 0, n, [d](int64_t i, double v) { d[i] = float(v); });
      break;
    }
    case DType::BF16: {
      uint16_t* d = out.data<uint16_t>();
      // f32_to_bf16's round to nearest even, inline (the values are finite).
      fill(kind, key, std, 0, n, [d](int64_t i, double v) {
        const float f = float(v);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        d[i] = uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
      });
      break;
    }
    case DType::F16: {
      uint16_t* d = out.data<uint16_t>();
      fill(kind, key, std, 0, n, [d](int64_t i, double v) { d[i] = f32_to_f16(float(v)); });
      break;
    }
    default:
      throw Error("cannot initialize parameter '" + name + "' as " + dtype_name(out.dtype()) +
                  " (not a float type)");
  }
}

TensorMap init_parameters(const std::vector<ParamInfo>& params, uint64_t seed, DType dtype,
                          double std, ParamSink* sink) {
  FT_CHECK(
      dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16 || dtype == DType::F16,
      std::string("cannot initialize parameters as ") + dtype_name(dtype) + " (not a float type)");
  TensorMap out;
  for (const ParamInfo& p : params) {
    if (sink && sink->takes(p.name)) {
      const InitKind kind = init_kind(p.name);
      const uint64_t key = stream_key(seed, p.name);
      sink->put(p.name, p.shape, [&](int64_t first, int64_t n, float* dst) {
        FT_CHECK(first % 2 == 0, "init: a parameter range must start at an even element");
        fill(kind, key, std, first, n, [dst](int64_t i, double v) { dst[i] = float(v); });
      });
      continue;
    }
    Tensor t = Tensor::empty(p.shape, dtype);
    init_parameter(p.name, seed, std, t);
    out[p.name] = std::move(t);
  }
  return out;
}

}  // namespace fusetune
