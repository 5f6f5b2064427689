// SPDX-License-Identifier: BSD-3-Clause
// ndmini's bf16 storage type bit for bit: float -> bf16 against reference
// vectors printed by tests/bf16_vectors.py (exact rational arithmetic, not the
// code under test), NaN handling by hand, bf16 -> float over all 65536
// patterns, and the same conversions inside a Kokkos kernel on ExecSpace.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/bf16.hpp"
#include "core/types.hpp"

using namespace ndmini;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

struct Vector {
  std::uint32_t in;   // float bits
  std::uint16_t out;  // expected bf16 bits
};

// python3 tests/bf16_vectors.py
constexpr Vector kRounding[] = {
    {0x00000000u, 0x0000u},  // +0
    {0x80000000u, 0x8000u},  // -0
    {0x3f800000u, 0x3f80u},  // 1
    {0xbf800000u, 0xbf80u},  // -1
    {0x7f800000u, 0x7f80u},  // +Inf
    {0xff800000u, 0xff80u},  // -Inf
    {0x3f808000u, 0x3f80u},  // 1 + half a bf16 ulp: a tie, the even neighbour is below
    {0x3f818000u, 0x3f82u},  // 1 + 1.5 ulp: a tie, the even neighbour is above
    {0x3f808001u, 0x3f81u},  // just above a tie: up
    {0x3f807fffu, 0x3f80u},  // just below a tie: down
    {0xbf808000u, 0xbf80u},  // negative tie, even below (in magnitude)
    {0xbf818000u, 0xbf82u},  // negative tie, even above
    {0x7f7f0000u, 0x7f7fu},  // the largest bf16, exactly
    {0x7f7f7fffu, 0x7f7fu},  // just below halfway from it to 2^128: stays finite
    {0x7f7f8000u, 0x7f80u},  // halfway: the tie goes to the even pattern, +Inf
    {0x7f7fffffu, 0x7f80u},  // FLT_MAX -> +Inf
    {0xff7fffffu, 0xff80u},  // -FLT_MAX -> -Inf
    {0xff7f8000u, 0xff80u},  // negative halfway -> -Inf
    {0x7f7e8000u, 0x7f7eu},  // a tie just below the largest bf16: even, down
    {0x00000001u, 0x0000u},  // the smallest float subnormal -> +0
    {0x80000001u, 0x8000u},  // its negative -> -0
    {0x00010000u, 0x0001u},  // the smallest bf16 subnormal, exactly
    {0x00008000u, 0x0000u},  // a tie between 0 and it -> 0 (even)
    {0x00018000u, 0x0002u},  // a subnormal tie that goes up to even
    {0x00008001u, 0x0001u},  // above half of it -> it
    {0x007fffffu, 0x0080u},  // the largest float subnormal rounds into the smallest normal
    {0x007f8000u, 0x0080u},  // a tie above the largest (odd) bf16 subnormal -> the smallest normal
    {0x00800000u, 0x0080u},  // the smallest normal
    {0x3effffffu, 0x3f00u},  // just below 0.5: the carry crosses into the next exponent
    {0x40490fdbu, 0x4049u},  // pi
    {0xc2f6e979u, 0xc2f7u},  // -123.456
};

// NaN in, NaN out of the same sign with the quiet bit (0x0040) set and the top
// 7 payload bits kept: by hand from the bf16 layout (sign | 8 exponent | 7 mantissa).
constexpr Vector kNaN[] = {
    {0x7fc00000u, 0x7fc0u},  // the default quiet NaN
    {0xffc00000u, 0xffc0u},  // negative quiet NaN
    {0x7f800001u, 0x7fc0u},  // signalling NaN whose payload lies only in the dropped bits: quieted, not Inf
    {0xff800001u, 0xffc0u},  // the same, negative
    {0x7f80ffffu, 0x7fc0u},  // payload in the low 16 bits only
    {0x7fa00000u, 0x7fe0u},  // signalling NaN with a kept payload bit: payload kept, quieted
    {0x7fc12345u, 0x7fc1u},  // quiet NaN with payload: the top 7 mantissa bits kept
    {0x7fffffffu, 0x7fffu},  // every bit set
    {0xff812345u, 0xffc1u},  // negative signalling NaN with a payload in both halves
};

}  // namespace

TEST(Bf16, RoundsToNearestEvenAgainstReferenceVectors) {
  for (const Vector& v : kRounding) {
    SCOPED_TRACE(testing::Message() << std::hex << "float bits 0x" << v.in);
    EXPECT_EQ(bf16(from_bits(v.in)).bits, v.out);
    EXPECT_EQ(float_to_bf16_bits(from_bits(v.in)), v.out);
  }
}

TEST(Bf16, NaNStaysQuietNaN) {
  for (const Vector& v : kNaN) {
    SCOPED_TRACE(testing::Message() << std::hex << "float bits 0x" << v.in);
    ASSERT_TRUE(std::isnan(from_bits(v.in)));
    const bf16 h(from_bits(v.in));
    EXPECT_EQ(h.bits, v.out);
    EXPECT_TRUE(std::isnan(static_cast<float>(h)));
    EXPECT_EQ(h.bits & 0x8000u, (v.in >> 16) & 0x8000u);  // sign kept
  }
}

TEST(Bf16, ToFloatIsExactForEveryPattern) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const float f = static_cast<float>(bf16::from_bits(static_cast<std::uint16_t>(b)));
    ASSERT_EQ(bits_of(f), b << 16) << std::hex << "bf16 bits 0x" << b;
    // And back: every bf16 value is a float that converts to itself (NaNs
    // come back quiet, which a quiet one already is).
    const bool nan = (b & 0x7fffu) > 0x7f80u;
    const std::uint16_t back = bf16(f).bits;
    ASSERT_EQ(back, nan ? (b | 0x0040u) : b) << std::hex << "bf16 bits 0x" << b;
  }
}

// float -> bf16 -> float in a parallel_for over ExecSpace. A function of its
// own: nvcc refuses a device lambda inside a test body (a private member).
void convert_in_kernel(const Kokkos::View<float*, MemSpace>& in, const Kokkos::View<bf16*, MemSpace>& out,
                       const Kokkos::View<float*, MemSpace>& back) {
  Kokkos::parallel_for(
      "test::bf16_convert", Kokkos::RangePolicy<ExecSpace>(0, in.extent(0)), KOKKOS_LAMBDA(const std::size_t i) {
        out(i) = bf16(in(i));
        back(i) = static_cast<float>(out(i));
      });
}

TEST(Bf16, ConvertsInsideKokkosKernels) {
  // The same vectors through views of bf16 in ExecSpace's memory, converted in
  // a parallel_for: the type works wherever the kernels run (host or device).
  std::vector<Vector> all(std::begin(kRounding), std::end(kRounding));
  all.insert(all.end(), std::begin(kNaN), std::end(kNaN));
  const std::size_t n = all.size();
  Kokkos::View<float*, MemSpace> in("in", n), back("back", n);
  Kokkos::View<bf16*, MemSpace> out("out", n);
  auto h_in = Kokkos::create_mirror_view(in);
  for (std::size_t i = 0; i < n; ++i) h_in(i) = from_bits(all[i].in);
  Kokkos::deep_copy(in, h_in);
  convert_in_kernel(in, out, back);
  auto h_out = Kokkos::create_mirror_view_and_copy(HostSpace(), out);
  auto h_back = Kokkos::create_mirror_view_and_copy(HostSpace(), back);
  for (std::size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(testing::Message() << std::hex << "float bits 0x" << all[i].in);
    EXPECT_EQ(h_out(i).bits, all[i].out);
    EXPECT_EQ(bits_of(h_back(i)), static_cast<std::uint32_t>(all[i].out) << 16);
  }
}
