// SPDX-License-Identifier: BSD-3-Clause
// Every kernel's backward against central finite differences of its forward,
// on odd shapes (so no power-of-two or divisibility luck hides an indexing
// bug), plus forward references in double and the optimizer/RNG helpers.
// (Attention has its own suite: test_attention.cpp.)
//
// Objective and bounds: numeric_check.hpp. Dropping any term of a backward
// formula changes the gradient by O(10%) or more of its norm, far above the
// bounds (worst measured values are noted next to each bound).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

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
