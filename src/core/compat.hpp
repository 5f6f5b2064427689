// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Hides what differs between Kokkos 3.4 (Debian's Trilinos package) and
// Kokkos 4.x/5.x: the math functions left Kokkos::Experimental in 3.7, and
// 3.4 has no Kokkos::min/max. Kernels include this, never the versioned API.
#include <Kokkos_Core.hpp>
#include <cstring>

namespace ndmini::compat {

#if KOKKOS_VERSION >= 30700
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sin;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

template <class T>
KOKKOS_INLINE_FUNCTION T max(T a, T b) {
  return a > b ? a : b;
}
template <class T>
KOKKOS_INLINE_FUNCTION T min(T a, T b) {
  return a < b ? a : b;
}

// Fast exp for float on the hot paths (softmax, GELU): exp(x) = 2^k * p(r),
// Cephes' degree-5 polynomial (relative error below 2e-7, like expf), written
// without branches so the loops that call it vectorize. x < -87 gives ~0.
KOKKOS_INLINE_FUNCTION float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float fk = (x * kLog2e + kShifter) - kShifter;
  const float r = x - fk * kLn2Hi - fk * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int bits = (static_cast<int>(fk) + 127) << 23;  // 2^k through the exponent field
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Lets the host compiler vectorize a float reduction loop (it may not
// reorder the sum otherwise). Deterministic for a given build: the vector
// width is fixed. Ignored where OpenMP SIMD is not enabled.
#if defined(NDMINI_OPENMP_SIMD) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define NDMINI_SIMD_REDUCTION(...) _Pragma(NDMINI_STRINGIFY(omp simd reduction(__VA_ARGS__)))
#define NDMINI_STRINGIFY(x) #x
#else
#define NDMINI_SIMD_REDUCTION(...)
#endif

}  // namespace ndmini::compat
