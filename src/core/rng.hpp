// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Counter-based random numbers: every value is a pure function of
// (seed, stream, counter), so any rank can produce any element of any tensor
// or batch without communication, and every layout sees the same numbers.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string_view>

#include "core/compat.hpp"

namespace ndmini::rng {

// SplitMix64's finalizer: a bijective 64-bit mixer with full avalanche.
KOKKOS_INLINE_FUNCTION std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Random 64 bits for element `counter` of the stream `key`.
KOKKOS_INLINE_FUNCTION std::uint64_t bits(std::uint64_t key, std::uint64_t counter) {
  return mix64(key ^ mix64(counter + 0x9e3779b97f4a7c15ULL));
}

// Stable 64-bit key of a name (FNV-1a), mixed with the seed.
inline std::uint64_t stream_key(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return mix64(h ^ mix64(seed));
}

// Uniform in (0, 1] from the high 24 bits, exactly representable as float.
KOKKOS_INLINE_FUNCTION double uniform_open(std::uint32_t u) { return (static_cast<double>(u >> 8) + 1.0) / 16777216.0; }

// Standard normal for element `counter` of stream `key` (Box-Muller on the
// two 32-bit halves; computed in double so it rounds the same everywhere).
KOKKOS_INLINE_FUNCTION double normal(std::uint64_t key, std::uint64_t counter) {
  const std::uint64_t r = bits(key, counter);
  const double u1 = uniform_open(static_cast<std::uint32_t>(r >> 32));
  const double u2 = uniform_open(static_cast<std::uint32_t>(r));
  return compat::sqrt(-2.0 * compat::log(u1)) * compat::cos(6.283185307179586 * u2);
}

}  // namespace ndmini::rng
