// SPDX-License-Identifier: BSD-3-Clause
// The kernels of Llama-style blocks: RMSNorm, SwiGLU and rotary positions
// (RoPE), with the conventions of kernels.cpp (one thread per row or per
// element, deterministic, no atomics).
#include <string>

#include "core/compat.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini::kernels {
namespace {

using Range = Kokkos::RangePolicy<ExecSpace>;

std::string shape(std::size_t rows, std::size_t cols) { return std::to_string(rows) + "x" + std::to_string(cols); }

template <class A, class B>
void require_same_shape(const char* what, const A& a, const B& b) {
  if (a.extent(0) != b.extent(0) || a.extent(1) != b.extent(1))
    throw InternalError(std::string(what) + ": operands are " + shape(a.extent(0), a.extent(1)) + " and " +
                        shape(b.extent(0), b.extent(1)));
}

}  // namespace

// ---- RMSNorm -------------------------------------------------------------------

namespace {

// Out is fp32 or bf16 (each value rounded once); rstd is fp32. The order of
// the products is Hugging Face's: weight * (x * rstd).
template <class Out>
void rmsnorm_forward_into(Out out, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, real eps) {
  using T = typename Out::non_const_value_type;
  require_same_shape("rmsnorm_forward", out, x);
  const int C = x.extent(1);
  Kokkos::parallel_for(
      "ndmini::rmsnorm_fwd", Range(0, x.extent(0)), KOKKOS_LAMBDA(const int row) {
        const real* xr = &x(row, 0);
        T* yr = &out(row, 0);
        real ss = 0;
        NDMINI_SIMD_REDUCTION(+ : ss)
        for (int c = 0; c < C; ++c) ss += xr[c] * xr[c];
        const real s = 1 / compat::sqrt(ss / C + eps);
        for (int c = 0; c < C; ++c) yr[c] = T(weight(c) * (xr[c] * s));
        rstd(row) = s;
      });
}

}  // namespace

void rmsnorm_forward(Slice2D out, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, real eps) {
  rmsnorm_forward_into(out, rstd, x, weight, eps);
}
void rmsnorm_forward(Bf16Slice2D out, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, real eps) {
  rmsnorm_forward_into(out, rstd, x, weight, eps);
}

// y_c = w_c x_c s with s = (mean(x^2) + eps)^(-1/2), so ds/dx_j = -s^3 x_j / C
// and dx_j = s (g_j - x_j s^2 <g, x> / C) with g = dout * w.
void rmsnorm_backward(Slice2D dx, Slice1D dweight, ConstSlice2D dout, ConstSlice2D x, ConstSlice1D weight,
                      ConstSlice1D rstd) {
  require_same_shape("rmsnorm_backward", dx, x);
  require_same_shape("rmsnorm_backward", dout, x);
  const int C = x.extent(1);
  const int rows = x.extent(0);
  Kokkos::parallel_for(
      "ndmini::rmsnorm_bwd_x", Range(0, rows), KOKKOS_LAMBDA(const int row) {
        const real* xr = &x(row, 0);
        const real* gr = &dout(row, 0);
        real* dxr = &dx(row, 0);
        const real s = rstd(row);
        real gx = 0;
        NDMINI_SIMD_REDUCTION(+ : gx)
        for (int c = 0; c < C; ++c) gx += gr[c] * weight(c) * xr[c];
        const real k = s * s * gx / C;
        for (int c = 0; c < C; ++c) dxr[c] += (gr[c] * weight(c) - xr[c] * k) * s;
      });
  // The weight gradient sums over rows: one thread per channel, no atomics.
  Kokkos::parallel_for(
      "ndmini::rmsnorm_bwd_weight", Range(0, C), KOKKOS_LAMBDA(const int c) {
        real dw = 0;
        for (int row = 0; row < rows; ++row) dw += dout(row, c) * x(row, c) * rstd(row);
        dweight(c) += dw;
      });
}

// ---- the model's norm ----------------------------------------------------------

namespace {

template <class Out>  // fp32 or bf16
void norm_forward_into(Out out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                       const Norm& norm) {
  if (norm.rms)
    rmsnorm_forward(out, rstd, x, weight, norm.eps);
  else
    layernorm_forward(out, mean, rstd, x, weight, bias, norm.eps);
}

}  // namespace

void norm_forward(Slice2D out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                  const Norm& norm) {
  norm_forward_into(out, mean, rstd, x, weight, bias, norm);
}
void norm_forward(Bf16Slice2D out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                  const Norm& norm) {
  norm_forward_into(out, mean, rstd, x, weight, bias, norm);
}
void norm_backward(Slice2D dx, Slice1D dweight, Slice1D dbias, ConstSlice2D dout, ConstSlice2D x, ConstSlice1D weight,
                   ConstSlice1D mean, ConstSlice1D rstd, const Norm& norm) {
  if (norm.rms)
    rmsnorm_backward(dx, dweight, dout, x, weight, rstd);
  else
    layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd);
}

// ---- SwiGLU --------------------------------------------------------------------

namespace {

// sigmoid through the vectorizable exp (relative error below 2e-7; saturates
// cleanly: fast_exp clamps its argument).
KOKKOS_INLINE_FUNCTION real sigmoid(real g) { return 1 / (1 + compat::fast_exp(-g)); }

// Out is fp32 or bf16 (rounded once); the arithmetic is fp32.
template <class Out>
void swiglu_forward_into(Out out, ConstSlice2D gate, ConstSlice2D up) {
  using T = typename Out::non_const_value_type;
  require_same_shape("swiglu_forward", gate, up);
  require_same_shape("swiglu_forward", out, gate);
  const real* gp = gate.data();
  const real* up_ = up.data();
  T* yp = out.data();
  Kokkos::parallel_for(
      "ndmini::swiglu_fwd", Range(0, gate.extent(0) * gate.extent(1)), KOKKOS_LAMBDA(const std::size_t i) {
        const real g = gp[i];
        yp[i] = T(g * sigmoid(g) * up_[i]);
      });
}

// G is fp32 or bf16 (the kept gate and up under mixed precision).
// silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))).
template <class G>
void swiglu_backward_from(Slice2D dgate, Slice2D dup, G gate, G up, ConstSlice2D dout) {
  require_same_shape("swiglu_backward", gate, up);
  require_same_shape("swiglu_backward", dout, gate);
  require_same_shape("swiglu_backward", dgate, gate);
  require_same_shape("swiglu_backward", dup, gate);
  const auto* gp = gate.data();
  const auto* up_ = up.data();
  const real* dp = dout.data();
  real* dgp = dgate.data();
  real* dup_ = dup.data();
  Kokkos::parallel_for(
      "ndmini::swiglu_bwd", Range(0, gate.extent(0) * gate.extent(1)), KOKKOS_LAMBDA(const std::size_t i) {
        const real g = static_cast<real>(gp[i]), u = static_cast<real>(up_[i]), d = dp[i];
        const real sg = sigmoid(g);
        const real dg = d * u * (sg * (1 + g * (1 - sg)));
        const real du = d * (g * sg);
        dgp[i] = dg;
        dup_[i] = du;
      });
}

}  // namespace

void swiglu_forward(Slice2D out, ConstSlice2D gate, ConstSlice2D up) { swiglu_forward_into(out, gate, up); }
void swiglu_forward(Bf16Slice2D out, ConstSlice2D gate, ConstSlice2D up) { swiglu_forward_into(out, gate, up); }
void swiglu_backward(Slice2D dgate, Slice2D dup, ConstSlice2D gate, ConstSlice2D up, ConstSlice2D dout) {
  swiglu_backward_from(dgate, dup, gate, up, dout);
}
void swiglu_backward(Slice2D dgate, Slice2D dup, ConstBf16Slice2D gate, ConstBf16Slice2D up, ConstSlice2D dout) {
  swiglu_backward_from(dgate, dup, gate, up, dout);
}

// ---- RoPE ------------------------------------------------------------------------

namespace {

// One thread per (row, frequency i): it computes the angle once and rotates
// pair i of every head in the row (threads next to each other touch columns
// next to each other). sign = +1 rotates by a, -1 by -a (the transpose).
// The angle follows Hugging Face's LlamaRotaryEmbedding step by step in fp32:
// inv_freq = 1 / theta^(float(2i) / head_size), a = float(pos) * inv_freq.
template <class X>
void rope_rotate(const char* label, X x, ConstTokenView positions, int rotated_columns, int head_size, real theta,
                 real sign) {
  using T = typename X::non_const_value_type;
  if (head_size <= 0 || head_size % 2 != 0 || rotated_columns < 0 || rotated_columns % head_size != 0 ||
      static_cast<std::size_t>(rotated_columns) > x.extent(1))
    throw InternalError(std::string(label) + ": rotated_columns " + std::to_string(rotated_columns) +
                        " must be a multiple of the even head_size " + std::to_string(head_size) +
                        " and at most the row's " + std::to_string(x.extent(1)) + " columns");
  if (positions.extent(0) != x.extent(0))
    throw InternalError(std::string(label) + ": " + std::to_string(positions.extent(0)) + " positions for " +
                        std::to_string(x.extent(0)) + " rows");
  const int half = head_size / 2;
  const int heads = rotated_columns / head_size;
  if (heads == 0 || x.extent(0) == 0) return;
  const real hs = static_cast<real>(head_size);
  Kokkos::parallel_for(
      label, Range(0, x.extent(0) * half), KOKKOS_LAMBDA(const std::size_t k) {
        const int row = static_cast<int>(k / half);
        const int i = static_cast<int>(k % half);
        const real inv_freq = real(1) / compat::pow(theta, static_cast<real>(2 * i) / hs);
        const real a = static_cast<real>(positions(row)) * inv_freq;
        const real c = compat::cos(a), s = sign * compat::sin(a);
        T* xr = &x(row, 0);
        for (int h = 0; h < heads; ++h) {
          T* p = xr + h * head_size;
          const real x1 = static_cast<real>(p[i]), x2 = static_cast<real>(p[i + half]);
          p[i] = T(x1 * c - x2 * s);
          p[i + half] = T(x2 * c + x1 * s);
        }
      });
}

}  // namespace

void rope_forward(Slice2D x, ConstTokenView positions, int rotated_columns, int head_size, real theta) {
  rope_rotate("ndmini::rope_fwd", x, positions, rotated_columns, head_size, theta, real(1));
}
void rope_forward(Bf16Slice2D x, ConstTokenView positions, int rotated_columns, int head_size, real theta) {
  rope_rotate("ndmini::rope_fwd", x, positions, rotated_columns, head_size, theta, real(1));
}
void rope_backward(Slice2D dx, ConstTokenView positions, int rotated_columns, int head_size, real theta) {
  rope_rotate("ndmini::rope_bwd", dx, positions, rotated_columns, head_size, theta, real(-1));
}

}  // namespace ndmini::kernels
