// SPDX-License-Identifier: BSD-3-Clause
// Every kernel's backward against central finite differences of its forward,
// on odd shapes (so no power-of-two or divisibility luck hides an indexing
// bug), plus forward references in double and the optimizer/RNG helpers.
// Llama's kernels (RMSNorm, SwiGLU, RoPE) are checked the same way; RoPE, being
// linear, against an independent rotation and through <Rx, y> = <x, R^T y>.
// (Attention has its own suite: test_attention.cpp.)
//
// Objective and bounds: numeric_check.hpp. Dropping any term of a backward
// formula changes the gradient by O(10%) or more of its norm, far above the
// bounds (worst measured values are noted next to each bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdio>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/types.hpp"
#include "kernels/kernels.hpp"
#include "numeric_check.hpp"

using namespace ndmini;
namespace kn = ndmini::kernels;
using namespace ndmini::test;

// ---- linear ---------------------------------------------------------------------

TEST(Kernels, LinearForwardMatchesReference) {
  const int N = 7, IN = 13, OUT = 11;
  View2D x("x", N, IN), w("w", OUT, IN), y("y", N, OUT), res("res", N, OUT);
  View1D b("b", OUT);
  fill_uniform(x, 1, -1, 1);
  fill_uniform(w, 2, -1, 1);
  fill_uniform(b, 3, -1, 1);
  fill_uniform(res, 4, -1, 1);
  const auto hx = host(x), hw = host(w), hb = host(b), hr = host(res);
  // All four combinations of bias and residual; y starts as garbage so the
  // kernel must overwrite it.
  for (int has_bias = 0; has_bias < 2; ++has_bias)
    for (int has_res = 0; has_res < 2; ++has_res) {
      Kokkos::deep_copy(y, real(7.5));
      kn::linear_forward(y, x, w, has_bias ? Slice1D(b) : Slice1D(), has_res ? ConstSlice2D(res) : ConstSlice2D());
      std::vector<double> ref(N * OUT);
      for (int n = 0; n < N; ++n)
        for (int o = 0; o < OUT; ++o) {
          double s = (has_bias ? hb[o] : 0) + (has_res ? hr[n * OUT + o] : 0);
          for (int i = 0; i < IN; ++i) s += hx[n * IN + i] * hw[o * IN + i];
          ref[n * OUT + o] = s;
        }
      SCOPED_TRACE("bias " + std::to_string(has_bias) + " residual " + std::to_string(has_res));
      expect_close("linear_forward", ref, host(y));
    }
}

TEST(Kernels, LinearBackwardMatchesFiniteDifferences) {
  const int N = 7, IN = 13, OUT = 11;
  View2D x("x", N, IN), w("w", OUT, IN), y("y", N, OUT), res("res", N, OUT), R("R", N, OUT);
  View1D b("b", OUT);
  fill_uniform(x, 1, -1, 1);
  fill_uniform(w, 2, -1, 1);
  fill_uniform(b, 3, -1, 1);
  fill_uniform(res, 4, -1, 1);
  fill_uniform(R, 5, -1, 1);
  const auto hR = host(R);
  auto L = [&] {
    kn::linear_forward(y, x, w, b, res);
    return dot(host(y), hR);
  };
  // Gradient buffers start non-zero: dW and db must accumulate, dx (beta 0) overwrite.
  View2D dx("dx", N, IN), dw("dw", OUT, IN);
  View1D db("db", OUT);
  fill_uniform(dx, 6, -1, 1);
  fill_uniform(dw, 7, -1, 1);
  fill_uniform(db, 8, -1, 1);
  const auto dw0 = host(dw), db0 = host(db);
  kn::linear_backward(dx, dw, db, R, x, w);
  const auto an_dx = host(dx), an_dw = minus(host(dw), dw0), an_db = minus(host(db), db0);

  expect_grad("linear dx", central_diff(x, indices(x.size(), 1000), L), an_dx);
  expect_grad("linear dW (accumulated)", central_diff(w, indices(w.size(), 1000), L), an_dw);
  expect_grad("linear db (accumulated)", central_diff(b, indices(b.size()), L), an_db);
  // The residual seeds the output: dL/dresidual = R exactly.
  expect_grad("linear residual", central_diff(res, indices(res.size(), 1000), L), hR);

  // dx_beta = 1 adds to dx instead of overwriting it.
  fill_uniform(dx, 9, -1, 1);
  const auto dx0 = host(dx);
  kn::linear_backward(dx, dw, db, R, x, w, {}, real(1));
  expect_close("linear dx (beta 1)", an_dx, minus(host(dx), dx0));

  // Empty dx and dbias are skipped; dW still accumulates.
  Kokkos::deep_copy(dw, real(0));
  kn::linear_backward(Slice2D(), dw, Slice1D(), R, x, w);
  expect_close("linear dW (no dx, no db)", an_dw, host(dw));
}

// ---- embedding --------------------------------------------------------------------

TEST(Kernels, EmbeddingForwardAndBackward) {
  const int B = 2, T = 5, C = 13, V = 11;
  // Token 3 appears five times, at several positions of both sequences.
  const std::vector<int> tok = {3, 1, 3, 3, 0, 10, 3, 7, 1, 3};
  // Positions in any order (context parallelism holds two chunks of a sequence per rank).
  const std::vector<int> pos = {4, 0, 2, 1, 3, 0, 1, 2, 3, 4};
  TokenView tokens = tokens_from(tok), positions = tokens_from(pos);
  View2D wte("wte", V, C), wpe("wpe", T, C), out("out", B * T, C), R("R", B * T, C);
  fill_uniform(wte, 11, -1, 1);
  fill_uniform(wpe, 12, -1, 1);
  fill_uniform(R, 13, -1, 1);
  const auto hR = host(R);

  kn::embedding_forward(out, tokens, wte, wpe, positions);
  {
    const auto hte = host(wte), hpe = host(wpe);
    std::vector<double> ref(B * T * C);
    for (int r = 0; r < B * T; ++r)
      for (int c = 0; c < C; ++c) ref[r * C + c] = hte[tok[r] * C + c] + hpe[pos[r] * C + c];
    expect_close("embedding_forward", ref, host(out));
  }

  auto L = [&] {
    kn::embedding_forward(out, tokens, wte, wpe, positions);
    return dot(host(out), hR);
  };
  View2D dwte("dwte", V, C), dwpe("dwpe", T, C);
  fill_uniform(dwte, 14, -1, 1);
  fill_uniform(dwpe, 15, -1, 1);
  const auto dwte0 = host(dwte), dwpe0 = host(dwpe);
  kn::embedding_backward(dwte, dwpe, R, tokens, positions);
  expect_grad("embedding dwte (repeats)", central_diff(wte, indices(wte.size(), 1000), L), minus(host(dwte), dwte0));
  expect_grad("embedding dwpe", central_diff(wpe, indices(wpe.size(), 1000), L), minus(host(dwpe), dwpe0));
}

// ---- layer norm ---------------------------------------------------------------------

TEST(Kernels, LayerNormForwardMatchesReference) {
  const int N = 7, C = 13;
  View2D x("x", N, C), out("out", N, C);
  View1D w("w", C), b("b", C), mean("mean", N), rstd("rstd", N);
  fill_uniform(x, 21, -1.5, 2.5);  // non-zero mean on purpose
  fill_uniform(w, 22, 0.5, 1.5);
  fill_uniform(b, 23, -0.5, 0.5);
  kn::layernorm_forward(out, mean, rstd, x, w, b);
  const auto hx = host(x), hw = host(w), hb = host(b);
  std::vector<double> ref(N * C), ref_mean(N), ref_rstd(N);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += hx[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (hx[n * C + c] - m) * (hx[n * C + c] - m);
    const double s = 1 / std::sqrt(v / C + 1e-5);
    for (int c = 0; c < C; ++c) ref[n * C + c] = (hx[n * C + c] - m) * s * hw[c] + hb[c];
    ref_mean[n] = m;
    ref_rstd[n] = s;
  }
  expect_close("layernorm_forward out", ref, host(out));
  expect_close("layernorm_forward mean", ref_mean, host(mean));
  expect_close("layernorm_forward rstd", ref_rstd, host(rstd));
}

TEST(Kernels, LayerNormBackwardMatchesFiniteDifferences) {
  const int N = 7, C = 13;
  View2D x("x", N, C), out("out", N, C), R("R", N, C);
  View1D w("w", C), b("b", C), mean("mean", N), rstd("rstd", N);
  fill_uniform(x, 21, -1.5, 2.5);
  fill_uniform(w, 22, 0.5, 1.5);
  fill_uniform(b, 23, -0.5, 0.5);
  fill_uniform(R, 24, -1, 1);
  const auto hR = host(R);
  auto L = [&] {
    kn::layernorm_forward(out, mean, rstd, x, w, b);
    return dot(host(out), hR);
  };
  L();  // mean and rstd of the unperturbed x for backward
  // dx, dweight and dbias all ACCUMULATE: start them non-zero.
  View2D dx("dx", N, C);
  View1D dw("dw", C), db("db", C);
  fill_uniform(dx, 25, -1, 1);
  fill_uniform(dw, 26, -1, 1);
  fill_uniform(db, 27, -1, 1);
  const auto dx0 = host(dx), dw0 = host(dw), db0 = host(db);
  kn::layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
  const auto an_dx = minus(host(dx), dx0);
  expect_grad("layernorm dx (accumulated)", central_diff(x, indices(x.size(), 1000), L), an_dx);
  expect_grad("layernorm dweight (accum.)", central_diff(w, indices(w.size()), L), minus(host(dw), dw0));
  expect_grad("layernorm dbias (accum.)", central_diff(b, indices(b.size()), L), minus(host(db), db0));
  // The accumulated dx must not depend on what was there before.
  Kokkos::deep_copy(dx, real(0));
  kn::layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
  expect_close("layernorm dx from zero", an_dx, host(dx));
}

// ---- GELU -----------------------------------------------------------------------------

TEST(Kernels, GeluForwardAndBackward) {
  const int N = 7, C = 13;
  View2D x("x", N, C), out("out", N, C), R("R", N, C), dx("dx", N, C);
  fill_uniform(x, 31, -4, 4);
  fill_uniform(R, 32, -1, 1);
  const auto hx = host(x), hR = host(R);
  kn::gelu_forward(out, x);
  std::vector<double> ref(N * C);
  for (int i = 0; i < N * C; ++i) {
    const double v = hx[i];
    ref[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
  }
  expect_close("gelu_forward", ref, host(out));

  auto L = [&] {
    kn::gelu_forward(out, x);
    return dot(host(out), hR);
  };
  kn::gelu_backward(dx, x, R);
  const auto an = host(dx);
  expect_grad("gelu dx", central_diff(x, indices(x.size(), 1000), L, 1e-3), an);
  // In place (dx aliases dout), as the model uses it.
  View2D g("g", N, C);
  Kokkos::deep_copy(g, R);
  kn::gelu_backward(g, x, g);
  expect_close("gelu dx in place", an, host(g));
}

// ---- layer norm: eps and no bias (model.norm_eps, model.bias = false) -----------------------

namespace {

using Bf16View2D = Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace>;

std::vector<double> host_bf16(const Bf16View2D& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(h.data()[i]);
  return out;
}

// A bf16 copy of x (rounded to nearest even) and the fp32 values it holds.
Bf16View2D bf16_copy(const View2D& x, View2D& widened) {
  Bf16View2D out("bf16", x.extent(0), x.extent(1));
  auto hx = Kokkos::create_mirror_view(x);
  Kokkos::deep_copy(hx, x);
  auto ho = Kokkos::create_mirror_view(out);
  widened = View2D("widened", x.extent(0), x.extent(1));
  auto hw = Kokkos::create_mirror_view(widened);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ho.data()[i] = bf16(hx.data()[i]);
    hw.data()[i] = static_cast<float>(ho.data()[i]);
  }
  Kokkos::deep_copy(out, ho);
  Kokkos::deep_copy(widened, hw);
  return out;
}

// A bf16 output is the fp32 value rounded once: within half a bf16 ulp,
// 2^-8 of its magnitude (bf16 keeps 8 significant bits), plus the fp32
// arithmetic's own error (1e-6 of the values' rms: a few fp32 ulps, where a
// difference of products cancels).
void expect_within_bf16_rounding(const char* what, const std::vector<double>& ref, const std::vector<double>& got) {
  ASSERT_EQ(ref.size(), got.size());
  const double rms = std::sqrt(dot(ref, ref) / static_cast<double>(ref.size()));
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double bound = std::ldexp(std::abs(ref[i]), -8) + 1e-6 * rms;
    worst = std::max(worst, std::abs(got[i] - ref[i]) / bound);
    EXPECT_LE(std::abs(got[i] - ref[i]), bound) << what << " element " << i;
  }
  std::printf("  [bf16] %-26s worst error %.2f of the rounding bound\n", what, worst);
}

}  // namespace

TEST(Kernels, LayerNormWithEpsAndWithoutBias) {
  const int N = 7, C = 13;
  const real eps = 0.05f;  // large enough that the 1e-5 default would miss the bound by far
  View2D x("x", N, C), out("out", N, C), R("R", N, C);
  View1D w("w", C), no_bias("no_bias", 0), mean("mean", N), rstd("rstd", N);
  fill_uniform(x, 121, -0.5, 0.8);  // small variance: eps matters
  fill_uniform(w, 122, 0.5, 1.5);
  fill_uniform(R, 124, -1, 1);
  kn::layernorm_forward(out, mean, rstd, x, w, no_bias, eps);
  const auto hx = host(x), hw = host(w);
  std::vector<double> ref(N * C), ref_rstd(N);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += hx[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (hx[n * C + c] - m) * (hx[n * C + c] - m);
    const double s = 1 / std::sqrt(v / C + double(eps));
    for (int c = 0; c < C; ++c) ref[n * C + c] = (hx[n * C + c] - m) * s * hw[c];
    ref_rstd[n] = s;
  }
  expect_close("layernorm eps, no bias: out", ref, host(out));
  expect_close("layernorm eps, no bias: rstd", ref_rstd, host(rstd));

  // The bf16 overload: the same values, rounded once.
  Bf16View2D out16("out16", N, C);
  kn::layernorm_forward(out16, mean, rstd, x, w, no_bias, eps);
  expect_within_bf16_rounding("layernorm no bias bf16", ref, host_bf16(out16));

  // Backward without bias: dx and dweight accumulate, the empty dbias is left alone.
  const auto hR = host(R);
  auto L = [&] {
    kn::layernorm_forward(out, mean, rstd, x, w, no_bias, eps);
    return dot(host(out), hR);
  };
  L();
  View2D dx("dx", N, C);
  View1D dw("dw", C), no_dbias("no_dbias", 0);
  fill_uniform(dx, 125, -1, 1);
  fill_uniform(dw, 126, -1, 1);
  const auto dx0 = host(dx), dw0 = host(dw);
  kn::layernorm_backward(dx, dw, no_dbias, R, x, w, mean, rstd);
  expect_grad("layernorm eps dx (accum.)", central_diff(x, indices(x.size(), 1000), L), minus(host(dx), dx0));
  expect_grad("layernorm eps dweight (accum.)", central_diff(w, indices(w.size()), L), minus(host(dw), dw0));
}

// ---- RMSNorm ------------------------------------------------------------------------------------

TEST(Kernels, RmsNormForwardMatchesReference) {
  const int N = 7, C = 13;
  const real eps = 1e-5f;
  View2D x("x", N, C), out("out", N, C);
  View1D w("w", C), rstd("rstd", N);
  fill_uniform(x, 131, -1.5, 2.5);  // non-zero mean: RMSNorm must not subtract it
  fill_uniform(w, 132, 0.5, 1.5);
  kn::rmsnorm_forward(out, rstd, x, w, eps);
  const auto hx = host(x), hw = host(w);
  std::vector<double> ref(N * C), ref_rstd(N);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += hx[n * C + c] * hx[n * C + c];
    const double s = 1 / std::sqrt(ss / C + double(eps));
    for (int c = 0; c < C; ++c) ref[n * C + c] = hx[n * C + c] * s * hw[c];
    ref_rstd[n] = s;
  }
  expect_close("rmsnorm_forward out", ref, host(out));
  expect_close("rmsnorm_forward rstd", ref_rstd, host(rstd));

  // eps enters: a large one changes rstd as the formula says.
  kn::rmsnorm_forward(out, rstd, x, w, real(0.5));
  std::vector<double> ref_rstd_big(N);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += hx[n * C + c] * hx[n * C + c];
    ref_rstd_big[n] = 1 / std::sqrt(ss / C + 0.5);
  }
  expect_close("rmsnorm_forward rstd, eps 0.5", ref_rstd_big, host(rstd));

  Bf16View2D out16("out16", N, C);
  kn::rmsnorm_forward(out16, rstd, x, w, eps);
  expect_within_bf16_rounding("rmsnorm_forward bf16", ref, host_bf16(out16));
  expect_close("rmsnorm_forward rstd (bf16 out)", ref_rstd, host(rstd));
}

TEST(Kernels, RmsNormBackwardMatchesFiniteDifferences) {
  const int N = 7, C = 13;
  const real eps = 1e-5f;
  View2D x("x", N, C), out("out", N, C), R("R", N, C);
  View1D w("w", C), rstd("rstd", N);
  fill_uniform(x, 141, -1.5, 2.5);
  fill_uniform(w, 142, 0.5, 1.5);
  fill_uniform(R, 144, -1, 1);
  const auto hR = host(R);
  auto L = [&] {
    kn::rmsnorm_forward(out, rstd, x, w, eps);
    return dot(host(out), hR);
  };
  L();
  // dx and dweight ACCUMULATE, as layernorm_backward: start them non-zero.
  View2D dx("dx", N, C);
  View1D dw("dw", C);
  fill_uniform(dx, 145, -1, 1);
  fill_uniform(dw, 146, -1, 1);
  const auto dx0 = host(dx), dw0 = host(dw);
  kn::rmsnorm_backward(dx, dw, R, x, w, rstd);
  const auto an_dx = minus(host(dx), dx0);
  expect_grad("rmsnorm dx (accumulated)", central_diff(x, indices(x.size(), 1000), L), an_dx);
  expect_grad("rmsnorm dweight (accum.)", central_diff(w, indices(w.size()), L), minus(host(dw), dw0));
  Kokkos::deep_copy(dx, real(0));
  kn::rmsnorm_backward(dx, dw, R, x, w, rstd);
  expect_close("rmsnorm dx from zero", an_dx, host(dx));
}

// ---- SwiGLU ---------------------------------------------------------------------------------------

TEST(Kernels, SwiGluForwardAndBackward) {
  const int N = 7, F = 13;
  View2D gate("gate", N, F), up("up", N, F), out("out", N, F), R("R", N, F);
  fill_uniform(gate, 151, -6, 6);  // both tails of the sigmoid
  fill_uniform(up, 152, -2, 2);
  fill_uniform(R, 153, -1, 1);
  const auto hg = host(gate), hu = host(up), hR = host(R);
  kn::swiglu_forward(out, gate, up);
  std::vector<double> ref(N * F);
  for (int i = 0; i < N * F; ++i) ref[i] = hg[i] / (1 + std::exp(-hg[i])) * hu[i];
  expect_close("swiglu_forward", ref, host(out));

  Bf16View2D out16("out16", N, F);
  kn::swiglu_forward(out16, gate, up);
  expect_within_bf16_rounding("swiglu_forward bf16", ref, host_bf16(out16));

  auto L = [&] {
    kn::swiglu_forward(out, gate, up);
    return dot(host(out), hR);
  };
  // Both gradients are OVERWRITTEN: start them with garbage.
  View2D dgate("dgate", N, F), dup("dup", N, F);
  fill_uniform(dgate, 154, -1, 1);
  fill_uniform(dup, 155, -1, 1);
  kn::swiglu_backward(dgate, dup, gate, up, R);
  const auto an_dgate = host(dgate), an_dup = host(dup);
  expect_grad("swiglu dgate", central_diff(gate, indices(gate.size(), 1000), L, 1e-3), an_dgate);
  expect_grad("swiglu dup", central_diff(up, indices(up.size(), 1000), L, 1e-3), an_dup);

  // In place, dgate over dout and dup over up: the same values.
  View2D g("g", N, F), u("u", N, F);
  Kokkos::deep_copy(g, R);
  Kokkos::deep_copy(u, up);
  kn::swiglu_backward(g, u, gate, u, g);
  expect_close("swiglu in place dgate", an_dgate, host(g));
  expect_close("swiglu in place dup", an_dup, host(u));

  // bf16 gate and up: widening is exact, so the gradients equal the fp32
  // kernel's at the rounded inputs (to fp32 rounding).
  View2D gate_w, up_w;
  const auto gate16 = bf16_copy(gate, gate_w), up16 = bf16_copy(up, up_w);
  kn::swiglu_backward(dgate, dup, gate_w, up_w, R);
  const auto ref_dgate = host(dgate), ref_dup = host(dup);
  fill_uniform(dgate, 156, -1, 1);
  fill_uniform(dup, 157, -1, 1);
  kn::swiglu_backward(dgate, dup, gate16, up16, R);
  expect_close("swiglu dgate (bf16 inputs)", ref_dgate, host(dgate), 1e-6);
  expect_close("swiglu dup (bf16 inputs)", ref_dup, host(dup), 1e-6);
  // And the rounding of the inputs is visible (the test sees which inputs it used).
  EXPECT_GT(rel_err(an_dgate, ref_dgate), 1e-4) << "bf16 rounding of gate should move dgate";
}

// ---- RoPE ------------------------------------------------------------------------------------------

namespace {

// Hugging Face's Llama rotation of a [N, C] row-major matrix, written
// independently of the kernel: each pair (x[i], x[i + hs/2]) of a head as the
// complex number x1 + i x2 multiplied by e^{ia}. The angle is either HF's
// fp32 computation (inv_freq = 1 / theta^(float(2i) / hs), a = float(pos) *
// inv_freq, as LlamaRotaryEmbedding) or exact double math.
std::vector<double> rope_reference(const std::vector<double>& x, int C, const std::vector<int>& pos, int rotated,
                                   int hs, float theta, bool hf_fp32_angle, bool inverse = false) {
  std::vector<double> y = x;
  const int half = hs / 2;
  for (std::size_t r = 0; r < pos.size(); ++r)
    for (int h = 0; h < rotated / hs; ++h)
      for (int i = 0; i < half; ++i) {
        double a;
        if (hf_fp32_angle) {
          const float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(hs));
          a = static_cast<double>(static_cast<float>(pos[r]) * inv_freq);
        } else {
          a = pos[r] * std::pow(static_cast<double>(theta), -2.0 * i / hs);
        }
        const std::size_t j1 = r * C + h * hs + i, j2 = j1 + half;
        const std::complex<double> z = std::complex<double>(x[j1], x[j2]) * std::polar(1.0, inverse ? -a : a);
        y[j1] = z.real();
        y[j2] = z.imag();
      }
  return y;
}

}  // namespace

TEST(Kernels, RopeForwardMatchesReference) {
  // Rows with a cp rank's load-balanced positions (T = 16 over cp = 2: rank 0
  // holds chunks 0 and 3, positions 0-3 and 12-15), a later chunk's and a
  // long context's; 3 heads of 6 rotated, 11 further columns (more than a
  // head: v's, say) left alone.
  const std::vector<int> positions = {0, 1, 2, 3, 12, 13, 14, 15, 4099, 65537};
  const int N = static_cast<int>(positions.size()), hs = 6, rotated = 3 * hs, C = rotated + hs + 5;
  View2D x("x", N, C);
  fill_uniform(x, 161, -2, 2);
  const auto hx = host(x);
  const TokenView pos = tokens_from(positions);
  for (const float theta : {10000.0f, 500000.0f}) {
    upload(x, hx);
    kn::rope_forward(x, pos, rotated, hs, theta);
    const auto got = host(x);
    expect_close(theta == 10000.0f ? "rope_forward theta 1e4" : "rope_forward theta 5e5",
                 rope_reference(hx, C, positions, rotated, hs, theta, true), got);
    for (int r = 0; r < N; ++r)
      for (int c = rotated; c < C; ++c) ASSERT_EQ(got[r * C + c], hx[r * C + c]) << "column past rotated_columns";
  }

  // Exact double angles for small positions: the fp32 angle is HF's choice,
  // the formula is the same (the angle's fp32 rounding stays below the bound).
  const std::vector<int> small = {0, 1, 2, 3, 12, 13, 14, 15, 30, 41};
  upload(x, hx);
  kn::rope_forward(x, tokens_from(small), rotated, hs, 10000.0f);
  expect_close("rope_forward, double angles", rope_reference(hx, C, small, rotated, hs, 10000.0f, false), host(x));

  // A larger head (the usual 64/128 in miniature: 4 frequencies) over all columns.
  const int hs8 = 8, C8 = 2 * hs8;
  View2D x8("x8", N, C8);
  fill_uniform(x8, 162, -2, 2);
  const auto hx8 = host(x8);
  kn::rope_forward(x8, pos, C8, hs8, 10000.0f);
  expect_close("rope_forward head 8", rope_reference(hx8, C8, positions, C8, hs8, 10000.0f, true), host(x8));

  // bf16: the rotation of the bf16 values in fp32, rounded once.
  View2D xw;
  upload(x, hx);
  const auto x16 = bf16_copy(x, xw);
  kn::rope_forward(x16, pos, rotated, hs, 500000.0f);
  expect_within_bf16_rounding("rope_forward bf16", rope_reference(host(xw), C, positions, rotated, hs, 500000.0f, true),
                              host_bf16(x16));

  // Shapes it cannot rotate are refused.
  EXPECT_THROW(kn::rope_forward(x, pos, rotated, 5, 10000.0f), InternalError);  // odd head
  EXPECT_THROW(kn::rope_forward(x, pos, rotated + 1, hs, 10000.0f), InternalError);
  EXPECT_THROW(kn::rope_forward(x, pos, C + hs, hs, 10000.0f), InternalError);
  EXPECT_THROW(kn::rope_forward(x, tokens_from({0, 1}), rotated, hs, 10000.0f), InternalError);
}

TEST(Kernels, RopeBackwardIsTheTranspose) {
  const std::vector<int> positions = {0, 1, 2, 3, 12, 13, 14, 15, 4099};
  const int N = static_cast<int>(positions.size()), hs = 6, rotated = 2 * hs, C = rotated + 3;
  const TokenView pos = tokens_from(positions);
  View2D x("x", N, C), y("y", N, C);
  fill_uniform(x, 171, -1, 1);
  fill_uniform(y, 172, -1, 1);
  const auto hx = host(x), hy = host(y);
  kn::rope_forward(x, pos, rotated, hs, 10000.0f);
  kn::rope_backward(y, pos, rotated, hs, 10000.0f);
  // <R x, y> = <x, R^T y> to fp32 rounding: a few ulps of ||x|| ||y||
  // (a rotation keeps norms); the forward in place of the backward misses by O(1).
  const double lhs = dot(host(x), hy), rhs = dot(hx, host(y));
  const double bound = 1e-6 * std::sqrt(dot(hx, hx) * dot(hy, hy));
  std::printf("  [rope] <Rx,y> %.9f  <x,R^T y> %.9f  bound %.1e\n", lhs, rhs, bound);
  EXPECT_NEAR(lhs, rhs, bound);
  // R^T is R's inverse (a rotation): backward after forward gives x back.
  kn::rope_backward(x, pos, rotated, hs, 10000.0f);
  expect_close("rope_backward(rope_forward(x))", hx, host(x), 1e-6);
  // And it matches the reference's inverse rotation element by element.
  expect_close("rope_backward vs reference", rope_reference(hy, C, positions, rotated, hs, 10000.0f, true, true),
               host(y));
}

// ---- cross-entropy ----------------------------------------------------------------------

TEST(Kernels, SoftmaxCrossEntropy) {
  const int N = 7, V = 11;
  View2D logits("logits", N, V), work("work", N, V);
  View1D losses("losses", N);
  fill_uniform(logits, 51, -3, 3);
  TokenView targets = tokens_from({0, 10, 4, 4, 7, 2, 9});
  const auto hl = host(logits);
  const std::vector<int> ht = {0, 10, 4, 4, 7, 2, 9};

  // Reference losses in double.
  std::vector<double> ref_losses(N);
  double ref_sum = 0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, hl[n * V + j]);
    for (int j = 0; j < V; ++j) s += std::exp(hl[n * V + j] - mx);
    ref_losses[n] = mx + std::log(s) - hl[n * V + ht[n]];
    ref_sum += ref_losses[n];
  }
  const double xent = kn::cross_entropy_loss(logits, targets);
  EXPECT_NEAR(xent, ref_sum, 1e-6 * ref_sum);

  const real scale = 0.37f;
  Kokkos::deep_copy(work, logits);
  const double fused = kn::softmax_cross_entropy(work, losses, targets, scale);
  EXPECT_NEAR(fused, xent, 1e-5 * xent) << "fused loss sum differs from cross_entropy_loss";
  expect_close("softmax_xent losses", ref_losses, host(losses));

  // dlogits / grad_scale is the gradient of the summed loss.
  auto an = host(work);
  for (auto& g : an) g /= scale;
  const auto fd =
      central_diff(logits, indices(logits.size(), 1000), [&] { return kn::cross_entropy_loss(logits, targets); });
  expect_grad("softmax_xent dlogits", fd, an);
  // Rows of the gradient sum to zero (softmax minus one-hot).
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int j = 0; j < V; ++j) s += an[n * V + j];
    EXPECT_NEAR(s, 0.0, 1e-5) << "row " << n;
  }
}

// ---- AdamW ------------------------------------------------------------------------------------

TEST(Kernels, AdamWMatchesScalarReference) {
  const int n = 37;
  for (int decay = 0; decay < 2; ++decay)
    for (const double gs : {1.0, 0.43})
      for (const int t : {1, 5}) {
        SCOPED_TRACE("decay " + std::to_string(decay) + " grad_scale " + std::to_string(gs) + " t " +
                     std::to_string(t));
        View1D p("p", n), g("g", n), m("m", n), v("v", n);
        fill_uniform(p, 61, -1, 1);
        fill_uniform(g, 62, -2, 2);
        fill_uniform(m, 63, -0.5, 0.5);
        fill_uniform(v, 64, 0, 0.3);
        const auto p0 = host(p), g0 = host(g), m0 = host(m), v0 = host(v);
        const kn::AdamWStep st{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, static_cast<real>(gs), t};
        kn::adamw_update(p, g, m, v, st, decay != 0);

        // Straightforward AdamW (decoupled weight decay, PyTorch order) in double,
        // from the float-rounded hyper-parameters the kernel sees.
        const double lr = st.lr, b1 = st.beta1, b2 = st.beta2, eps = st.eps;
        const double wd = decay ? double(st.weight_decay) : 0.0;
        std::vector<double> dp_ref(n), m_ref(n), v_ref(n), dp_got(n);
        const auto p1 = host(p);
        for (int i = 0; i < n; ++i) {
          const double gi = g0[i] * double(st.grad_scale);
          m_ref[i] = b1 * m0[i] + (1 - b1) * gi;
          v_ref[i] = b2 * v0[i] + (1 - b2) * gi * gi;
          const double mhat = m_ref[i] / (1 - std::pow(b1, t));
          const double vhat = v_ref[i] / (1 - std::pow(b2, t));
          const double p_new = p0[i] * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
          dp_ref[i] = p_new - p0[i];
          dp_got[i] = p1[i] - p0[i];
        }
        // The step itself (p1 - p0) is compared, not p1, so an error in the
        // ~1% update is not hidden under p's own magnitude.
        expect_close("adamw step", dp_ref, dp_got, 1e-4);
        expect_close("adamw exp_avg", m_ref, host(m));
        expect_close("adamw exp_avg_sq", v_ref, host(v));
        for (double gi : host(g)) EXPECT_EQ(gi, 0.0) << "adamw_update must zero the gradient";
      }
}

// ---- reductions and init ------------------------------------------------------------------------

TEST(Kernels, SumSquares) {
  // Odd lengths across several 4096-element blocks (the kernel sums blocks in
  // float, then adds blocks in double), so a dropped tail block would show.
  for (const std::size_t n : {std::size_t(1001), std::size_t(3 * 4096 + 7), std::size_t(1000003)}) {
    View1D x("x", n);
    fill_uniform(x, 71, -3, 3);
    double ref = 0;
    for (double v : host(x)) ref += v * v;
    const double got = kn::sum_squares(x);
    std::printf("  [ref] sum_squares n=%-9zu rel err %.3e (bound 1e-05)\n", n, std::abs(got - ref) / ref);
    EXPECT_NEAR(got, ref, 1e-5 * ref) << "n = " << n;
  }
  EXPECT_EQ(kn::sum_squares(Slice1D()), 0.0);
}

// The sums' bits do not depend on the thread count: they add per-block
// (per-row) terms in index order, whatever the threads (CTest runs this on 2
// threads too). The data make any other order round differently: one huge
// term first, then many small ones, each lost against it alone but not once
// summed apart (as a second thread's partial would be).
TEST(Kernels, SumsAddTermsInIndexOrder) {
  constexpr std::size_t kBlock = 4096, kTerms = 1000;  // sum_squares' blocks
  View1D x("x", kBlock * kTerms);
  auto hx = Kokkos::create_mirror_view(x);
  hx(0) = 1e9f;  // its square 1e18: one double ulp is 128 there
  for (std::size_t b = 1; b < kTerms; ++b) hx(b * kBlock) = 1;
  Kokkos::deep_copy(x, hx);
  const auto in_order = [](const std::vector<double>& terms, std::size_t split) {
    double first = 0, second = 0;
    for (std::size_t i = 0; i < terms.size(); ++i) (i < split ? first : second) += terms[i];
    return first + second;
  };
  std::vector<double> squares(kTerms, 1.0);
  squares[0] = static_cast<double>(1e9f * 1e9f);
  EXPECT_NE(in_order(squares, kTerms / 2), in_order(squares, kTerms)) << "the data cannot tell the orders apart";
  EXPECT_EQ(kn::sum_squares(x), in_order(squares, kTerms));

  // Loss sums: row 0's loss near 1e18 (its target logit -1e18), the others log(V).
  const int V = 4;
  View2D logits("logits", kTerms, V);
  View1D losses("losses", kTerms);
  auto hl = Kokkos::create_mirror_view(logits);
  hl(0, 1) = -1e18f;
  Kokkos::deep_copy(logits, hl);
  std::vector<int> target(kTerms, 0);
  target[0] = 1;
  const TokenView targets = tokens_from(target);
  const double fused = kn::softmax_cross_entropy(logits, losses, targets, 1.0f);
  const auto hlosses = host(losses);
  std::vector<double> terms(hlosses.begin(), hlosses.end());
  EXPECT_NE(in_order(terms, kTerms / 2), in_order(terms, kTerms)) << "the data cannot tell the orders apart";
  EXPECT_EQ(fused, in_order(terms, kTerms));
}

TEST(Kernels, InitNormalIsDeterministicAndNormal) {
  const std::size_t n = 100003;
  const real stddev = 0.5f;
  const std::uint64_t key = rng::stream_key(1234, "h/0/mlp/c_fc/weight");
  View1D a("a", n), b("b", n);
  kn::init_normal(a, key, 0, stddev);
  kn::init_normal(b, key, 0, stddev);
  const auto ha = host(a), hb = host(b);
  EXPECT_EQ(ha, hb) << "same key and offset must give identical values";

  // Each value is a pure function of (key, global index): the documented formula.
  for (std::size_t i : {std::size_t(0), std::size_t(1), std::size_t(777), n - 1})
    EXPECT_EQ(ha[i], static_cast<double>(static_cast<real>(stddev * rng::normal(key, i)))) << "index " << i;

  // An offset gives the shifted sequence (how a shard fills its part).
  const std::size_t off = 4097, m = 1000;
  View1D c("c", m);
  kn::init_normal(c, key, off, stddev);
  const auto hc = host(c);
  for (std::size_t i = 0; i < m; ++i) ASSERT_EQ(hc[i], ha[off + i]) << "offset element " << i;

  // Another key gives other numbers.
  kn::init_normal(b, rng::stream_key(1235, "h/0/mlp/c_fc/weight"), 0, stddev);
  EXPECT_NE(host(b), ha);

  // Moments within 5 standard errors: mean ~ N(0, s^2/n), sample std ~ s (1 +- 1/sqrt(2n)).
  double sum = 0, sq = 0;
  for (double v : ha) sum += v, sq += v * v;
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_LT(std::abs(mean), 5 * stddev / std::sqrt(double(n)));
  EXPECT_LT(std::abs(sd / stddev - 1), 5 / std::sqrt(2.0 * n));

  kn::fill(c, 0.25f);
  for (double v : host(c)) EXPECT_EQ(v, 0.25);
}
