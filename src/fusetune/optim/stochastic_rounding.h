#pragma once
// bf16 storage of trained values (parameters, optimizer moments): the bit conversions, and the
// stochastic rounding (SR) the optimizers write bf16 values back with. It lives in optim/
// because only the optimizer step (and gradient clipping) writes trained state back to bf16;
// kernels and checkpoints convert with core/dtype.h's round-to-nearest.
//
// Why stochastic: bf16 keeps 8 significant bits, so an update smaller than half an ulp (at 1.0:
// 2^-8 / 2 = 0.00195) is lost entirely by round-to-nearest, on every step: a bf16 parameter
// whose lr * update stays that small never moves. SR rounds x up to the next bf16 value with
// probability (x - lower) / (upper - lower), so E[SR(x)] = x: small updates add up in
// expectation and the trained value follows the fp32 trajectory up to zero-mean noise.
//
// The formula (the standard unbiased SR): add a uniform random 16-bit integer r to the fp32 bit
// pattern and keep the top 16 bits, (bits + r) >> 16. The low 16 bits lo carry into the kept
// part exactly when r >= 65536 - lo, with probability lo / 65536, which is x's fractional
// position between its two bf16 neighbours (sign-magnitude, so negative values round their
// magnitude the same way). NaN stays NaN (as f32_to_bf16), infinities stay infinite; a finite
// value above the largest bf16 (3.39e38) may round to infinity, as round-to-nearest would for
// half of them.
//
// Randomness: counter-based, no shared generator. The r of one element is 16 bits (one lane
// per buffer) of a hash of (seed, step, parameter name, element index) -- SplitMix64's output
// function over a key built from the first three, at the element's index -- so it does not depend
// on the thread count or the order elements are visited in, is the same on every rerun and after a
// resume (the step is the optimizer's saved per-parameter step), and differs between steps,
// parameters and the buffers of one parameter (value, exp_avg, exp_avg_sq, momentum).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fusetune/util/mix64.h"

namespace fusetune::bf16 {

inline float to_f32(uint16_t v) {
  const uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even: the same as core/dtype.h's f32_to_bf16, inline for the hot loops.
inline uint16_t round_nearest(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (std::isnan(v)) return uint16_t((bits >> 16) | 0x40);
  return uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// Stochastic rounding with the random 16 bits r (uniform over 0..65535 for an unbiased result).
// Branch-free, so that the optimizers' loops vectorize.
inline uint16_t round_stochastic(float v, uint16_t r) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint32_t rounded = (bits + uint32_t(r)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40;
  // NaN tested on the bits and selected with a mask: no control flow for the vectorizer.
  const uint32_t nan_mask = 0u - uint32_t((bits & 0x7FFFFFFFu) > 0x7F800000u);
  return uint16_t((quiet_nan & nan_mask) | (rounded & ~nan_mask));
}

// FNV-1a, 64-bit: a parameter name's hash that is the same on every platform and build
// (std::hash is not).
inline uint64_t name_hash(std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Which buffer of a parameter is being rounded: each gets its own 16 of the element's 64 hash
// bits (the lanes of one good 64-bit hash are independent; one hash serves all buffers).
enum class Buffer : int { Value = 0, ExpAvg = 1, ExpAvgSq = 2, Momentum = 3 };

// The random bits of one (seed, step, parameter): bits(i, buffer) for element i.
class Stream {
 public:
  Stream(uint64_t seed, int64_t step, uint64_t name_hash)
      : key_(mix64(mix64(mix64(seed + kMix64Gamma) ^ uint64_t(step)) + name_hash)) {}
  Stream(uint64_t seed, int64_t step, std::string_view name)
      : Stream(seed, step, name_hash(name)) {}
  // SplitMix64's i-th output from the key: consecutive indices give independent-looking bits.
  uint64_t hash(int64_t i) const { return mix64(key_ + (uint64_t(i) + 1) * kMix64Gamma); }
  uint16_t bits(int64_t i, Buffer b) const { return uint16_t(hash(i) >> (48 - 16 * int(b))); }
  uint16_t round(float v, int64_t i, Buffer b) const { return round_stochastic(v, bits(i, b)); }

 private:
  uint64_t key_;
};

}  // namespace fusetune::bf16

namespace fusetune::bf16 {

// Storage <-> compute, for kernels templated on how a buffer is stored: F32 and F64 are read
// and written as they are (today's arithmetic, bit for bit); BF16 (uint16_t) is widened exactly
// to fp32 and written back with the buffer's stochastic rounding.
inline float load(float x) { return x; }
inline double load(double x) { return x; }
inline float load(uint16_t x) { return to_f32(x); }
inline void store(float& dst, float x, const Stream&, Buffer, int64_t) { dst = x; }
inline void store(double& dst, double x, const Stream&, Buffer, int64_t) { dst = x; }
inline void store(uint16_t& dst, float x, const Stream& s, Buffer b, int64_t i) {
  dst = s.round(x, i, b);
}

}  // namespace fusetune::bf16
