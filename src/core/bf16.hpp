// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ndmini's own bfloat16 storage type: the top 16 bits of an IEEE-754 float
// (sign, 8 exponent bits, 7 mantissa bits). Kokkos 3.4 has no bhalf_t and 4.x's
// differs by version, so products, views and messages share this one type.
//
// Conversions: float -> bf16 rounds to nearest, ties to even (as oneDNN,
// cuBLAS and PyTorch do); finite floats above the largest bf16 round to +-Inf
// by that same rule; a NaN stays a NaN of the same sign, quieted (bit 6 of
// the bf16 set, so a payload living only in the dropped bits cannot turn it
// into Inf). bf16 -> float is exact.
//
// Arithmetic is deliberately absent: compute in float, store in bf16.
#include <cstdint>
#include <cstring>

#if defined(__has_include)
#if __has_include(<Kokkos_Macros.hpp>)
#include <Kokkos_Macros.hpp>
#endif
#endif

#ifdef KOKKOS_INLINE_FUNCTION
#define NDMINI_BF16_FUNCTION KOKKOS_INLINE_FUNCTION
#else  // a target without Kokkos (the oneDNN or cuBLAS layer): host code
#define NDMINI_BF16_FUNCTION inline
#endif

namespace ndmini {

NDMINI_BF16_FUNCTION std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet it
  // Round to nearest even: add just under half an ulp of bf16, plus one when
  // the kept part is odd, and let the carry ripple (into the exponent too).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

NDMINI_BF16_FUNCTION float bf16_bits_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct alignas(2) bf16 {
  std::uint16_t bits;

  bf16() = default;  // trivial, so views of bf16 are plain memory (value-initialised views hold +0)
  NDMINI_BF16_FUNCTION explicit bf16(float f) : bits(float_to_bf16_bits(f)) {}
  NDMINI_BF16_FUNCTION explicit operator float() const { return bf16_bits_to_float(bits); }
  NDMINI_BF16_FUNCTION static bf16 from_bits(std::uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
};
static_assert(sizeof(bf16) == 2, "bf16 is 16-bit storage");

// Host arrays: n values each way (oneDNN and the tests read and write bf16 as
// plain 16-bit memory).
inline void to_bf16(bf16* out, const float* in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16(in[i]);
}
inline void to_float(float* out, const bf16* in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

// The precision of the products or of a transfer (the deck's train.precision
// and comm.reduce_dtype). It lives here, not in config/, so the layers below
// the deck can take it.
enum class Precision { fp32, bf16 };

}  // namespace ndmini
