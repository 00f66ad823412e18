#pragma once
// SplitMix64's output function (Steele, Lea & Flood 2014): a bijective, well-mixed 64-bit hash
// of a counter. Seeds and noise derived from (seed, step, index) keys with it are independent
// of each other and the same on every platform and build.
#include <cstdint>

namespace fusetune {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// SplitMix64's increment, the golden ratio's fraction: keys spaced by it mix apart.
inline constexpr uint64_t kMix64Gamma = 0x9E3779B97F4A7C15ull;

}  // namespace fusetune
