// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/kernels.hpp"

#include <vector>

#include "core/compat.hpp"
#include "core/rng.hpp"

namespace ndmini::kernels {
namespace {

using Range = Kokkos::RangePolicy<ExecSpace>;

// The sum over i < n of term(i), which may also write per-i results. On the
// host each term lands in its own slot and the slots are added in index
// order: the bits depend on n alone, as on the Serial backend (a threaded
// parallel_reduce adds per-thread partials, an order that follows the thread
// count). On a GPU, Kokkos' reduction.
template <class Term>
double sum_in_index_order(const char* label, std::size_t n, const Term& term) {
  double total = 0;
  if constexpr (kDeviceMemory) {
    Kokkos::parallel_reduce(
        label, Range(0, n), KOKKOS_LAMBDA(const std::size_t i, double& acc) { acc += term(i); }, total);
  } else {
    std::vector<double> terms(n);
    double* t = terms.data();
    Kokkos::parallel_for(label, Range(0, n), [=](const std::size_t i) { t[i] = term(i); });
    for (const double x : terms) total += x;
  }
  return total;
}

}  // namespace

// The dense layers (gemm, linear_forward, linear_backward, bias_backward) are in gemm.cpp.

// ---- embeddings -----------------------------------------------------------

void embedding_forward(Slice2D out, ConstTokenView tokens, ConstSlice2D wte, ConstSlice2D wpe, ConstTokenView positions,
                       int vocab_start) {
  const int C = out.extent(1);
  const int vocab_local = wte.extent(0);
  const bool with_positions = wpe.extent(0) > 0;
  Kokkos::parallel_for(
      "ndmini::embedding_fwd", Range(0, out.extent(0)), KOKKOS_LAMBDA(const int row) {
        const int tok = tokens(row) - vocab_start;
        const bool local = tok >= 0 && tok < vocab_local;
        const int t = with_positions ? positions(row) : 0;
        for (int c = 0; c < C; ++c)
          out(row, c) = (local ? wte(tok, c) : real(0)) + (with_positions ? wpe(t, c) : real(0));
      });
}

void position_embedding_forward(Slice2D out, ConstSlice2D wpe, ConstTokenView positions) {
  const int C = out.extent(1);
  Kokkos::parallel_for(
      "ndmini::position_embedding_fwd", Range(0, out.extent(0)), KOKKOS_LAMBDA(const int row) {
        const int t = positions(row);
        for (int c = 0; c < C; ++c) out(row, c) += wpe(t, c);
      });
}

void token_embedding_backward(Slice2D dwte, ConstSlice2D dout, ConstTokenView tokens, int vocab_start) {
  const int C = dout.extent(1);
  const int rows = dout.extent(0);
  const int vocab_local = dwte.extent(0);
  Kokkos::parallel_for(
      "ndmini::embedding_bwd_wte", Range(0, C), KOKKOS_LAMBDA(const int c) {
        for (int row = 0; row < rows; ++row) {
          const int tok = tokens(row) - vocab_start;
          if (tok >= 0 && tok < vocab_local) dwte(tok, c) += dout(row, c);
        }
      });
}

void position_embedding_backward(Slice2D dwpe, ConstSlice2D dout, ConstTokenView positions) {
  const int C = dout.extent(1);
  const int rows = dout.extent(0);
  Kokkos::parallel_for(
      "ndmini::embedding_bwd_wpe", Range(0, C), KOKKOS_LAMBDA(const int c) {
        for (int row = 0; row < rows; ++row) dwpe(positions(row), c) += dout(row, c);
      });
}

void embedding_backward(Slice2D dwte, Slice2D dwpe, ConstSlice2D dout, ConstTokenView tokens,
                        ConstTokenView positions) {
  token_embedding_backward(dwte, dout, tokens, 0);
  position_embedding_backward(dwpe, dout, positions);
}

void add_residual_bias(Slice2D y, ConstSlice2D residual, ConstSlice1D bias) {
  const int C = y.extent(1);
  const bool has_residual = residual.extent(0) > 0, has_bias = bias.extent(0) > 0;
  Kokkos::parallel_for(
      "ndmini::add_residual_bias", Range(0, y.extent(0)), KOKKOS_LAMBDA(const int row) {
        for (int c = 0; c < C; ++c)
          y(row, c) += (has_residual ? residual(row, c) : real(0)) + (has_bias ? bias(c) : real(0));
      });
}

// ---- layer norm -------------------------------------------------------------

namespace {

// Out is fp32 or bf16 (each value rounded once); the statistics are fp32.
// An empty bias adds nothing (model.bias = false).
template <class Out>
void layernorm_forward_into(Out out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                            real eps) {
  using T = typename Out::non_const_value_type;
  const int C = x.extent(1);
  const bool has_bias = bias.extent(0) > 0;
  Kokkos::parallel_for(
      "ndmini::layernorm_fwd", Range(0, x.extent(0)), KOKKOS_LAMBDA(const int row) {
        const real* xr = &x(row, 0);
        T* yr = &out(row, 0);
        real m = 0;
        NDMINI_SIMD_REDUCTION(+ : m)
        for (int c = 0; c < C; ++c) m += xr[c];
        m /= C;
        real v = 0;
        NDMINI_SIMD_REDUCTION(+ : v)
        for (int c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
        const real s = 1 / compat::sqrt(v / C + eps);
        if (has_bias) {
          for (int c = 0; c < C; ++c) yr[c] = T((xr[c] - m) * s * weight(c) + bias(c));
        } else {
          for (int c = 0; c < C; ++c) yr[c] = T((xr[c] - m) * s * weight(c));
        }
        mean(row) = m;
        rstd(row) = s;
      });
}

}  // namespace

void layernorm_forward(Slice2D out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                       real eps) {
  layernorm_forward_into(out, mean, rstd, x, weight, bias, eps);
}
void layernorm_forward(Bf16Slice2D out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight,
                       ConstSlice1D bias, real eps) {
  layernorm_forward_into(out, mean, rstd, x, weight, bias, eps);
}

void layernorm_backward(Slice2D dx, Slice1D dweight, Slice1D dbias, ConstSlice2D dout, ConstSlice2D x,
                        ConstSlice1D weight, ConstSlice1D mean, ConstSlice1D rstd) {
  const int C = x.extent(1);
  const int rows = x.extent(0);
  Kokkos::parallel_for(
      "ndmini::layernorm_bwd_x", Range(0, rows), KOKKOS_LAMBDA(const int row) {
        const real* xr = &x(row, 0);
        const real* gr = &dout(row, 0);
        real* dxr = &dx(row, 0);
        const real m = mean(row), s = rstd(row);
        real g_mean = 0, gn_mean = 0;
        NDMINI_SIMD_REDUCTION(+ : g_mean, gn_mean)
        for (int c = 0; c < C; ++c) {
          const real g = gr[c] * weight(c);
          g_mean += g;
          gn_mean += g * (xr[c] - m) * s;
        }
        g_mean /= C;
        gn_mean /= C;
        for (int c = 0; c < C; ++c) dxr[c] += (gr[c] * weight(c) - g_mean - (xr[c] - m) * s * gn_mean) * s;
      });
  // Parameter gradients sum over rows: one thread per channel, no atomics.
  // An empty dbias (a layer norm without bias) is left alone.
  const bool has_bias = dbias.extent(0) > 0;
  Kokkos::parallel_for(
      "ndmini::layernorm_bwd_params", Range(0, C), KOKKOS_LAMBDA(const int c) {
        real dw = 0, db = 0;
        for (int row = 0; row < rows; ++row) {
          dw += dout(row, c) * (x(row, c) - mean(row)) * rstd(row);
          db += dout(row, c);
        }
        dweight(c) += dw;
        if (has_bias) dbias(c) += db;
      });
}

// ---- GELU ---------------------------------------------------------------------

namespace {
constexpr real kGeluA = 0.7978845608028654f;  // sqrt(2/pi)
constexpr real kGeluB = 0.044715f;
// tanh through the vectorizable exp: tanh(u) = 1 - 2 / (exp(2u) + 1).
KOKKOS_INLINE_FUNCTION real fast_tanh(real u) { return 1 - 2 / (compat::fast_exp(2 * u) + 1); }
}  // namespace

namespace {

// Out is fp32 or bf16 (rounded once); the arithmetic is fp32.
template <class Out>
void gelu_forward_into(Out out, ConstSlice2D x) {
  using T = typename Out::non_const_value_type;
  const real* xp = x.data();
  T* yp = out.data();
  Kokkos::parallel_for(
      "ndmini::gelu_fwd", Range(0, x.extent(0) * x.extent(1)), KOKKOS_LAMBDA(const std::size_t i) {
        const real v = xp[i];
        yp[i] = T(real(0.5) * v * (1 + fast_tanh(kGeluA * (v + kGeluB * v * v * v))));
      });
}

// X is fp32 or bf16 (the kept pre-activation under mixed precision).
template <class X>
void gelu_backward_from(Slice2D dx, X x, ConstSlice2D dout) {
  const auto* xp = x.data();
  const real* gp = dout.data();
  real* dp = dx.data();
  Kokkos::parallel_for(
      "ndmini::gelu_bwd", Range(0, x.extent(0) * x.extent(1)), KOKKOS_LAMBDA(const std::size_t i) {
        const real v = static_cast<real>(xp[i]);
        const real th = fast_tanh(kGeluA * (v + kGeluB * v * v * v));
        const real dth = (1 - th * th) * kGeluA * (1 + 3 * kGeluB * v * v);
        dp[i] = gp[i] * (real(0.5) * (1 + th) + real(0.5) * v * dth);
      });
}

}  // namespace

void gelu_forward(Slice2D out, ConstSlice2D x) { gelu_forward_into(out, x); }
void gelu_forward(Bf16Slice2D out, ConstSlice2D x) { gelu_forward_into(out, x); }
void gelu_backward(Slice2D dx, ConstSlice2D x, ConstSlice2D dout) { gelu_backward_from(dx, x, dout); }
void gelu_backward(Slice2D dx, ConstBf16Slice2D x, ConstSlice2D dout) { gelu_backward_from(dx, x, dout); }

// ---- cross-entropy -------------------------------------------------------------

double softmax_cross_entropy(Slice2D logits, Slice1D losses, ConstTokenView targets, real grad_scale) {
  const int V = logits.extent(1);
  return sum_in_index_order(
      "ndmini::softmax_xent", logits.extent(0), KOKKOS_LAMBDA(const std::size_t row) {
        real* l = &logits(row, 0);
        const int target = targets(row);
        real m = l[0];
        NDMINI_SIMD_REDUCTION(max : m)
        for (int j = 1; j < V; ++j) m = compat::max(m, l[j]);
        const real target_logit = l[target];
        real sum = 0;
        NDMINI_SIMD_REDUCTION(+ : sum)
        for (int j = 0; j < V; ++j) {
          l[j] = compat::fast_exp(l[j] - m);
          sum += l[j];
        }
        const real loss = m + compat::log(sum) - target_logit;
        const real f = grad_scale / sum;
        for (int j = 0; j < V; ++j) l[j] *= f;
        l[target] -= grad_scale;
        losses(row) = loss;
        return static_cast<double>(loss);
      });
}

double cross_entropy_loss(ConstSlice2D logits, ConstTokenView targets) {
  const int V = logits.extent(1);
  return sum_in_index_order(
      "ndmini::xent_loss", logits.extent(0), KOKKOS_LAMBDA(const std::size_t row) {
        const real* l = &logits(row, 0);
        real m = l[0];
        NDMINI_SIMD_REDUCTION(max : m)
        for (int j = 1; j < V; ++j) m = compat::max(m, l[j]);
        double sum = 0;
        for (int j = 0; j < V; ++j) sum += compat::exp(static_cast<double>(l[j] - m));
        return m + compat::log(sum) - l[targets(row)];
      });
}

void row_max(Slice1D out, ConstSlice2D logits) {
  const int V = logits.extent(1);
  Kokkos::parallel_for(
      "ndmini::row_max", Range(0, logits.extent(0)), KOKKOS_LAMBDA(const int row) {
        const real* l = &logits(row, 0);
        real m = l[0];
        NDMINI_SIMD_REDUCTION(max : m)
        for (int j = 1; j < V; ++j) m = compat::max(m, l[j]);
        out(row) = m;
      });
}

void vocab_parallel_xent_partials(Slice1D stats, ConstSlice2D logits, ConstSlice1D row_max, ConstTokenView targets,
                                  int vocab_start) {
  const int V = logits.extent(1);
  const int N = logits.extent(0);
  Kokkos::parallel_for(
      "ndmini::vp_xent_partials", Range(0, N), KOKKOS_LAMBDA(const int row) {
        const real* l = &logits(row, 0);
        const real m = row_max(row);
        real sum = 0;
        NDMINI_SIMD_REDUCTION(+ : sum)
        for (int j = 0; j < V; ++j) sum += compat::fast_exp(l[j] - m);
        const int t = targets(row) - vocab_start;
        stats(row) = sum;
        stats(N + row) = (t >= 0 && t < V) ? l[t] : real(0);
      });
}

double vocab_parallel_xent_finish(Slice2D logits, Slice1D losses, ConstSlice1D row_max, ConstSlice1D stats,
                                  ConstTokenView targets, int vocab_start, real grad_scale) {
  const int V = logits.extent(1);
  const int N = logits.extent(0);
  return sum_in_index_order(
      "ndmini::vp_xent_finish", N, KOKKOS_LAMBDA(const std::size_t row) {
        const real m = row_max(row), sum = stats(row);
        const real loss = m + compat::log(sum) - stats(N + row);
        losses(row) = loss;
        if (grad_scale != 0) {
          real* l = &logits(row, 0);
          const real f = grad_scale / sum;
          for (int j = 0; j < V; ++j) l[j] = compat::fast_exp(l[j] - m) * f;
          const int t = targets(row) - vocab_start;
          if (t >= 0 && t < V) l[t] -= grad_scale;
        }
        return static_cast<double>(loss);
      });
}

// ---- optimizer -------------------------------------------------------------------

void adamw_update(Slice1D param, Slice1D grad, Slice1D exp_avg, Slice1D exp_avg_sq, const AdamWStep& st, bool decay) {
  const real b1 = st.beta1, b2 = st.beta2, eps = st.eps, gs = st.grad_scale, lr = st.lr;
  const real wd = decay ? st.weight_decay : real(0);
  const real c1 = 1 / (1 - std::pow(st.beta1, static_cast<real>(st.t)));
  const real c2 = 1 / (1 - std::pow(st.beta2, static_cast<real>(st.t)));
  real* p = param.data();
  real* g = grad.data();
  real* m = exp_avg.data();
  real* v = exp_avg_sq.data();
  Kokkos::parallel_for(
      "ndmini::adamw", Range(0, param.extent(0)), KOKKOS_LAMBDA(const std::size_t i) {
        const real gi = g[i] * gs;
        const real mi = b1 * m[i] + (1 - b1) * gi;
        const real vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * (mi * c1 / (compat::sqrt(vi * c2) + eps) + wd * p[i]);
        g[i] = 0;
      });
}

double sum_squares(ConstSlice1D x) {
  // Blocks of float sums (vectorized) added up in double: accurate enough for
  // a gradient norm, and one streaming pass.
  constexpr std::size_t kBlock = 4096;
  const std::size_t n = x.extent(0);
  const real* p = x.data();
  return sum_in_index_order(
      "ndmini::sum_squares", (n + kBlock - 1) / kBlock, KOKKOS_LAMBDA(const std::size_t block) {
        const std::size_t end = compat::min(n, (block + 1) * kBlock);
        real s = 0;
        NDMINI_SIMD_REDUCTION(+ : s)
        for (std::size_t i = block * kBlock; i < end; ++i) s += p[i] * p[i];
        return static_cast<double>(s);
      });
}

void init_normal(Slice1D x, std::uint64_t key, std::uint64_t index_offset, real stddev) {
  real* p = x.data();
  Kokkos::parallel_for(
      "ndmini::init_normal", Range(0, x.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { p[i] = static_cast<real>(stddev * rng::normal(key, index_offset + i)); });
}

void fill(Slice1D x, real value) { Kokkos::deep_copy(x, value); }

void round_to_bf16(Bf16Slice1D out, ConstSlice1D in) {
  bf16* o = out.data();
  const real* x = in.data();
  Kokkos::parallel_for(
      "ndmini::round_to_bf16", Range(0, in.extent(0)), KOKKOS_LAMBDA(const std::size_t i) { o[i] = bf16(x[i]); });
}

void widen_bf16(Slice1D out, ConstBf16Slice1D in) {
  real* o = out.data();
  const bf16* x = in.data();
  Kokkos::parallel_for(
      "ndmini::widen_bf16", Range(0, in.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { o[i] = static_cast<real>(x[i]); });
}

void round_through_bf16(Slice1D x) {
  real* p = x.data();
  Kokkos::parallel_for(
      "ndmini::round_through_bf16", Range(0, x.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { p[i] = static_cast<real>(bf16(p[i])); });
}

}  // namespace ndmini::kernels
