// SPDX-License-Identifier: BSD-3-Clause
// The routed experts of an MoE block (layers/expert_parallel.hpp) against
// independent references: a host double-precision MoE written from the
// definition (router, top-k, renormalised weights, each expert's MLP), finite
// differences of the forward through the router and the experts (fp32, one
// rank), and on 2 ranks the expert group (ep = 2) against each rank alone
// (ep = 1): the same outputs and input gradients, and the same expert
// gradients once summed over the ranks. Plus the bound on an expert's load
// (every member stops with one message) and the stress routings: experts
// that receive nothing, k = E.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "layers/expert_parallel.hpp"
#include "numeric_check.hpp"

using namespace ndmini;
using namespace ndmini::test;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

ModelConfig moe_config(int E, int k, MoeScore score, MoeRouter router, MlpKind mlp, bool bias) {
  ModelConfig m;
  m.layers = 1;
  m.channels = 16;
  m.heads = 2;
  m.vocab = 64;
  m.seq_len = 8;
  m.mlp = mlp;
  m.ffn_hidden = 24;
  m.bias = bias;
  m.moe_experts = E;
  m.moe_top_k = k;
  m.moe_hidden = 12;
  m.moe_score = score;
  m.moe_router = router;
  return m;
}

// One MoE layer's tensors (all E experts), its gradients, its inputs.
struct Layer {
  ModelConfig m;
  std::size_t R, C, F, E;
  View1D x, dout, out, dx;
  View1D router, bias, fc, fc_b, up, up_b, proj, proj_b;          // parameters
  View1D g_router, g_fc, g_fc_b, g_up, g_up_b, g_proj, g_proj_b;  // gradients
  std::vector<int> positions;

  Layer(const ModelConfig& cfg, std::size_t rows, std::uint64_t seed, std::uint64_t data_seed) : m(cfg), R(rows) {
    C = m.channels;
    F = m.moe_ffn();
    E = m.moe_experts;
    auto make = [&](const char* name, std::size_t n, std::uint64_t s, double scale) {
      View1D v(std::string(name), n);
      if (scale > 0) fill_uniform(v, s, -scale, scale);
      return v;
    };
    const bool b = m.bias, gated = m.gated();
    x = make("x", R * C, data_seed + 1, 1.0);
    dout = make("dout", R * C, data_seed + 2, 1.0);
    out = make("out", R * C, 0, 0);
    dx = make("dx", R * C, 0, 0);
    router = make("router", E * C, seed + 3, 0.5);
    bias = View1D();
    fc = make("fc", E * F * C, seed + 4, 0.3);
    fc_b = b ? make("fc_b", E * F, seed + 5, 0.1) : View1D();
    up = gated ? make("up", E * F * C, seed + 6, 0.3) : View1D();
    up_b = gated && b ? make("up_b", E * F, seed + 7, 0.1) : View1D();
    proj = make("proj", E * C * F, seed + 8, 0.3);
    proj_b = b ? make("proj_b", E * C, seed + 9, 0.1) : View1D();
    g_router = make("g_router", E * C, 0, 0);
    g_fc = make("g_fc", E * F * C, 0, 0);
    g_fc_b = b ? make("g_fc_b", E * F, 0, 0) : View1D();
    g_up = gated ? make("g_up", E * F * C, 0, 0) : View1D();
    g_up_b = gated && b ? make("g_up_b", E * F, 0, 0) : View1D();
    g_proj = make("g_proj", E * C * F, 0, 0);
    g_proj_b = b ? make("g_proj_b", E * C, 0, 0) : View1D();
    for (std::size_t r = 0; r < R; ++r) positions.push_back(static_cast<int>(r % m.seq_len));
  }

  static Slice2D mat(const View1D& v, std::size_t rows, std::size_t cols) {
    return v.extent(0) > 0 ? Slice2D(v.data(), rows, cols) : Slice2D();
  }
  static Slice1D vec(const View1D& v) { return v.extent(0) > 0 ? Slice1D(v.data(), v.extent(0)) : Slice1D(); }
  // Experts [first, first + n) of a stack of E experts of `rows` rows each
  // (what an ep rank holds: ExpertParallel reads its own experts only).
  static Slice2D experts(const View1D& v, std::size_t first, std::size_t n, std::size_t rows, std::size_t cols) {
    return v.extent(0) > 0 ? Slice2D(v.data() + first * rows * cols, n * rows, cols) : Slice2D();
  }
  static Slice1D experts(const View1D& v, std::size_t first, std::size_t n, std::size_t rows) {
    return v.extent(0) > 0 ? Slice1D(v.data() + first * rows, n * rows) : Slice1D();
  }
  // The router of all E experts and the matrices of the layer's experts.
  ExpertTensors tensors(const ExpertParallel& layer, const View1D& r, const View1D& b, const View1D& f,
                        const View1D& f_b, const View1D& u, const View1D& u_b, const View1D& p,
                        const View1D& p_b) const {
    const std::size_t first = layer.first_expert(), n = layer.local_experts();
    return {mat(r, E, C),
            vec(b),
            experts(f, first, n, F, C),
            experts(u, first, n, F, C),
            experts(p, first, n, C, F),
            experts(f_b, first, n, F),
            experts(u_b, first, n, F),
            experts(p_b, first, n, C)};
  }
  ExpertTensors weights(const ExpertParallel& layer) const {
    return tensors(layer, router, bias, fc, fc_b, up, up_b, proj, proj_b);
  }
  ExpertTensors grads(const ExpertParallel& layer) const {
    return tensors(layer, g_router, View1D(), g_fc, g_fc_b, g_up, g_up_b, g_proj, g_proj_b);
  }
  ExpertMatrices<real> matrices(const ExpertParallel& layer) const {
    const ExpertTensors w = weights(layer);
    return {w.fc, w.up, w.proj};
  }
  std::vector<View1D> grad_views() const { return {g_router, g_fc, g_fc_b, g_up, g_up_b, g_proj, g_proj_b}; }
  void zero_grads() {
    for (const View1D& g : grad_views())
      if (g.extent(0) > 0) Kokkos::deep_copy(g, real(0));
    Kokkos::deep_copy(dx, real(0));
  }

  // out = 0 + the layer's output; returns sum(out .* dout) in double.
  double forward(ExpertParallel& layer, MoeActivations& a) {
    Kokkos::deep_copy(out, real(0));
    a.routed = false;
    layer.forward<real>(mat(out, R, C), mat(x, R, C), weights(layer), matrices(layer), a);
    return dot(host(out), host(dout));
  }
  void backward(ExpertParallel& layer, const MoeActivations& a) {
    layer.backward<real>(mat(dx, R, C), grads(layer), mat(dout, R, C), mat(x, R, C), weights(layer), matrices(layer),
                         a);
  }
};

double gelu(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }
double silu(double v) { return v / (1 + std::exp(-v)); }

// The MoE output from its definition, in double on the host.
std::vector<double> reference_forward(const Layer& L) {
  const auto x = host(L.x), router = host(L.router), fc = host(L.fc), proj = host(L.proj);
  const auto up = L.up.extent(0) ? host(L.up) : std::vector<double>();
  const auto fc_b = L.fc_b.extent(0) ? host(L.fc_b) : std::vector<double>(L.E * L.F, 0.0);
  const auto up_b = L.up_b.extent(0) ? host(L.up_b) : std::vector<double>(L.E * L.F, 0.0);
  const auto proj_b = L.proj_b.extent(0) ? host(L.proj_b) : std::vector<double>(L.E * L.C, 0.0);
  const std::size_t R = L.R, C = L.C, F = L.F, E = L.E, k = L.m.moe_top_k;
  const bool sigmoid = L.m.moe_score == MoeScore::sigmoid;
  std::vector<double> out(R * C, 0.0);
  for (std::size_t r = 0; r < R; ++r) {
    std::vector<double> logit(E), score(E);
    for (std::size_t e = 0; e < E; ++e)
      for (std::size_t c = 0; c < C; ++c) logit[e] += router[e * C + c] * x[r * C + c];
    const double top = *std::max_element(logit.begin(), logit.end());
    double z = 0;
    for (double l : logit) z += std::exp(l - top);
    for (std::size_t e = 0; e < E; ++e)
      score[e] = sigmoid ? 1 / (1 + std::exp(-logit[e])) : std::exp(logit[e] - top) / z;
    std::vector<std::size_t> order(E);
    for (std::size_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
    if (L.m.moe_router == MoeRouter::balanced)
      for (std::size_t j = 0; j < k; ++j) order[j] = (L.positions[r] * k + j) % E;
    double sum = 0;
    for (std::size_t j = 0; j < k; ++j) sum += score[order[j]];
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t e = order[j];
      std::vector<double> act(F);
      for (std::size_t f = 0; f < F; ++f) {
        double h = fc_b[e * F + f], u = up_b[e * F + f];
        for (std::size_t c = 0; c < C; ++c) {
          h += fc[(e * F + f) * C + c] * x[r * C + c];
          if (!up.empty()) u += up[(e * F + f) * C + c] * x[r * C + c];
        }
        act[f] = L.m.gated() ? silu(h) * u : gelu(h);
      }
      for (std::size_t c = 0; c < C; ++c) {
        double y = proj_b[e * C + c];
        for (std::size_t f = 0; f < F; ++f) y += proj[(e * C + c) * F + f] * act[f];
        out[r * C + c] += score[e] / sum * y;
      }
    }
  }
  return out;
}

// The smallest gap, over the rows, between the k-th and the (k+1)-th
// largest router logit: a finite-difference step moves a logit by at most
// h max(|x|, |router|) = 1e-2, so a gap above 0.05 keeps every choice.
double routing_margin(const Layer& L) {
  const auto x = host(L.x), router = host(L.router);
  const std::size_t k = L.m.moe_top_k;
  double margin = INFINITY;
  for (std::size_t r = 0; r < L.R; ++r) {
    std::vector<double> logit(L.E, 0.0);
    for (std::size_t e = 0; e < L.E; ++e)
      for (std::size_t c = 0; c < L.C; ++c) logit[e] += router[e * L.C + c] * x[r * L.C + c];
    std::sort(logit.rbegin(), logit.rend());
    if (k < L.E) margin = std::min(margin, logit[k - 1] - logit[k]);
  }
  return margin;
}

struct Case {
  const char* name;
  MoeScore score;
  MoeRouter router;
  MlpKind mlp;
  bool bias;
};
const Case kCases[] = {
    {"softmax gelu", MoeScore::softmax, MoeRouter::learned, MlpKind::gelu, true},
    {"sigmoid swiglu", MoeScore::sigmoid, MoeRouter::learned, MlpKind::swiglu, false},
    {"balanced gelu", MoeScore::softmax, MoeRouter::balanced, MlpKind::gelu, true},
};

}  // namespace

TEST(ExpertParallel, ForwardMatchesTheDefinition) {
  for (const Case& c : kCases) {
    Layer L(moe_config(4, 2, c.score, c.router, c.mlp, c.bias), 24, 11, 100);
    ExpertParallel layer(L.m, 0, nullptr, L.R, L.positions, false);
    MoeActivations a = layer.allocate();
    L.forward(layer, a);
    expect_close(c.name, reference_forward(L), host(L.out), 1e-5);
  }
}

// Central differences of sum(out .* dout) through the router (its top-k
// weights) and the experts, on one rank. The routing must not change under a
// step: a perturbation that flips a choice is reported, not averaged in.
TEST(ExpertParallel, GradientsMatchFiniteDifferences) {
  for (const Case& c : kCases) {
    // Inputs whose routing no step can change: the first data seed (from a
    // fixed list) whose every row has a clear top-k.
    std::uint64_t data_seed = 200;
    while (routing_margin(Layer(moe_config(4, 2, c.score, c.router, c.mlp, c.bias), 12, 21, data_seed)) < 0.05)
      ASSERT_LT(++data_seed, 300u) << "no inputs with a clear routing";
    Layer L(moe_config(4, 2, c.score, c.router, c.mlp, c.bias), 12, 21, data_seed);
    ExpertParallel layer(L.m, 0, nullptr, L.R, L.positions, false);
    MoeActivations a = layer.allocate();
    L.forward(layer, a);
    const std::vector<std::int32_t> routing = a.expert;
    L.zero_grads();
    L.backward(layer, a);
    MoeActivations probe = layer.allocate();
    auto objective = [&] {
      const double v = L.forward(layer, probe);
      EXPECT_EQ(probe.expert, routing) << c.name << ": a finite-difference step changed the routing";
      return v;
    };
    std::printf("%s\n", c.name);
    const double h = 1e-2;
    auto check = [&](const char* what, const View1D& param, const View1D& grad) {
      if (param.extent(0) == 0) return;
      const auto idx = indices(param.extent(0), 48);
      expect_grad(what, central_diff(param, idx, objective, h), pick(host(grad), idx));
    };
    check("d x", L.x, L.dx);
    check("d router", L.router, L.g_router);
    check("d experts c_fc", L.fc, L.g_fc);
    check("d experts c_fc bias", L.fc_b, L.g_fc_b);
    check("d experts c_up", L.up, L.g_up);
    check("d experts c_proj", L.proj, L.g_proj);
    check("d experts c_proj bias", L.proj_b, L.g_proj_b);
  }
}

// The auxiliary losses' gradients: with dout = 0 only they remain, and FD
// of the objective the layer's stats give checks them. A forward of other
// rows between the forward and its backward must not change them (the
// backward reads its micro-batch's kept routing, not the shared scratch).
// Loss scale: 1 / the rows (one micro-batch is the global batch here).
TEST(ExpertParallel, AuxLossGradientsMatchFiniteDifferences) {
  for (const Case& c : kCases) {
    if (c.router == MoeRouter::balanced) continue;
    std::uint64_t data_seed = 300;  // inputs with a clear routing, as above
    while (routing_margin(Layer(moe_config(4, 2, c.score, c.router, c.mlp, c.bias), 16, 31, data_seed)) < 0.05)
      ASSERT_LT(++data_seed, 400u) << "no inputs with a clear routing";
    Layer L(moe_config(4, 2, c.score, c.router, c.mlp, c.bias), 16, 31, data_seed);
    Kokkos::deep_copy(L.dout, real(0));
    ExpertParallel layer(L.m, 0, nullptr, L.R, L.positions, false);
    MoeAuxLosses aux;
    aux.z_loss = 0.25;
    aux.seq_aux = 0.5;
    aux.seq_len = 8;
    aux.micro_batch = 2;
    for (std::size_t r = 0; r < L.R; ++r) aux.sequences.push_back(static_cast<int>(r / 8));  // 2 sequences
    layer.set_aux_losses(aux);
    const double scale = 1.0 / L.R, sequences = 2;
    MoeActivations a = layer.allocate(), other = layer.allocate(), probe = layer.allocate();
    L.forward(layer, a);
    Layer elsewhere(L.m, L.R, 31, 900);
    elsewhere.forward(layer, other);
    L.zero_grads();
    layer.backward<real>(Layer::mat(L.dx, L.R, L.C), L.grads(layer), Layer::mat(L.dout, L.R, L.C),
                         Layer::mat(L.x, L.R, L.C), L.weights(layer), L.matrices(layer), a, static_cast<real>(scale));
    auto objective = [&] {
      Kokkos::deep_copy(L.out, real(0));
      probe.routed = false;
      const MoeRouteStats st = layer.forward<real>(Layer::mat(L.out, L.R, L.C), Layer::mat(L.x, L.R, L.C),
                                                   L.weights(layer), L.matrices(layer), probe);
      EXPECT_EQ(probe.expert, a.expert) << c.name << ": a finite-difference step changed the routing";
      return aux.z_loss * st.z_loss_sum * scale + aux.seq_aux * st.seq_aux_sum / sequences;
    };
    std::printf("%s\n", c.name);
    const auto idx = indices(L.router.extent(0), 48);
    expect_grad("d router (aux losses)", central_diff(L.router, idx, objective), pick(host(L.g_router), idx));
    const auto xi = indices(L.x.extent(0), 48);
    expect_grad("d x (aux losses)", central_diff(L.x, xi, objective), pick(host(L.dx), xi));
  }
}

// Experts that receive no token (the balanced router with every row at
// position 0 sends all of them to experts 0 and 1), alone and over an expert
// group, and k = E: outputs as defined, and no gradient on an expert no
// token reached.
TEST(ExpertParallel, StressRoutingsStayExact) {
  {
    Layer L(moe_config(4, 2, MoeScore::softmax, MoeRouter::balanced, MlpKind::gelu, true), 16, 41, 400);
    std::fill(L.positions.begin(), L.positions.end(), 0);
    ExpertParallel layer(L.m, 0, nullptr, L.R, L.positions, false);
    MoeActivations a = layer.allocate();
    L.forward(layer, a);
    expect_close("idle experts", reference_forward(L), host(L.out), 1e-5);
    L.zero_grads();
    L.backward(layer, a);
    const auto g = host(L.g_fc);
    const std::size_t per_expert = L.F * L.C;
    for (std::size_t i = 2 * per_expert; i < g.size(); ++i) ASSERT_EQ(g[i], 0.0) << "an idle expert got a gradient";
    EXPECT_GT(std::abs(g[0]), 0.0);
    // The same rows over an expert group of the world: a rank whose experts
    // no token reaches (on 2 ranks, rank 1 holds experts 2 and 3) receives
    // nothing and sends its rows away; the outputs and d(x) are the rank's alone.
    if (world_size() > 1) {
      const auto out1 = host(L.out), dx1 = host(L.dx);
      Communicator group(MPI_COMM_WORLD, "expert");
      ExpertParallel shared(L.m, 0, &group, L.R, L.positions, false);
      MoeActivations b = shared.allocate();
      L.forward(shared, b);
      expect_close("idle experts over the group", out1, host(L.out), 1e-6);
      L.zero_grads();
      L.backward(shared, b);
      expect_close("idle experts over the group, d x", dx1, host(L.dx), 1e-6);
    }
  }
  {
    Layer L(moe_config(4, 4, MoeScore::softmax, MoeRouter::learned, MlpKind::swiglu, true), 16, 51, 500);
    ExpertParallel layer(L.m, 0, nullptr, L.R, L.positions, false);
    MoeActivations a = layer.allocate();
    L.forward(layer, a);
    expect_close("k = E", reference_forward(L), host(L.out), 1e-5);
  }
}

namespace {

std::vector<double> summed_over_world(std::vector<double> v) {
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

}  // namespace

// Every rank of the world is one expert group (ep = the world size): each
// rank's outputs and input gradients equal those it computes alone with
// every expert (ep = 1), and the expert and router gradients, summed over the
// ranks, equal the sums of the ranks alone. A rank adds gradients only to
// its own experts. fp32 and bf16 (the rows travel as bf16).
TEST(ExpertParallel, ExpertGroupEqualsEachRankAlone) {
  const int ranks = world_size(), rank = world_rank();
  if (ranks == 1) GTEST_SKIP() << "needs an expert group of 2 or more ranks (run under mpiexec -n 2 or 4)";
  Communicator group(MPI_COMM_WORLD, "expert");
  for (const Case& c : kCases) {
    const ModelConfig m = moe_config(4 * ranks / 2, 2, c.score, c.router, c.mlp, c.bias);
    Layer L(m, 20, 61, 600 + 1000 * rank);
    ExpertParallel alone(L.m, 0, nullptr, L.R, L.positions, false);
    MoeActivations a1 = alone.allocate();
    L.forward(alone, a1);
    const auto out1 = host(L.out);
    L.zero_grads();
    L.backward(alone, a1);
    const auto dx1 = host(L.dx);
    std::vector<std::vector<double>> grads1;
    for (const View1D& g : L.grad_views())
      grads1.push_back(g.extent(0) ? summed_over_world(host(g)) : std::vector<double>());

    ExpertParallel shared(L.m, 0, &group, L.R, L.positions, false);
    ASSERT_EQ(shared.local_experts(), m.moe_experts / ranks);
    MoeActivations a2 = shared.allocate();
    L.forward(shared, a2);
    EXPECT_EQ(a2.expert, a1.expert) << c.name;
    expect_close(c.name, out1, host(L.out), 1e-6);
    L.zero_grads();
    L.backward(shared, a2);
    expect_close("d x", dx1, host(L.dx), 1e-6);
    const auto views = L.grad_views();
    for (std::size_t i = 0; i < views.size(); ++i) {
      if (views[i].extent(0) == 0) continue;
      const auto mine = host(views[i]);
      // Expert tensors: rows of other ranks' experts stay zero here.
      if (i > 0) {
        const std::size_t per = mine.size() / m.moe_experts;
        for (std::size_t j = 0; j < mine.size(); ++j) {
          const int owner = static_cast<int>(j / per) / (m.moe_experts / ranks);
          if (owner != rank) ASSERT_EQ(mine[j], 0.0) << "expert gradients of another rank's experts";
        }
      }
      expect_close("gradient sum", grads1[i], summed_over_world(mine), 1e-6);
    }
  }
}

TEST(ExpertParallel, Bf16ExpertGroupEqualsEachRankAlone) {
  const int ranks = world_size(), rank = world_rank();
  if (ranks == 1) GTEST_SKIP() << "needs an expert group of 2 or more ranks (run under mpiexec -n 2 or 4)";
  Communicator group(MPI_COMM_WORLD, "expert");
  const ModelConfig m = moe_config(4 * ranks / 2, 2, MoeScore::softmax, MoeRouter::learned, MlpKind::swiglu, true);
  Layer L(m, 20, 71, 700 + 1000 * rank);
  // bf16 copies of the expert matrices (the operands) and of the rows.
  auto rounded = [](const View1D& v) {
    Bf16View1D b("bf16", v.extent(0));
    kernels::round_to_bf16(b, v);
    return b;
  };
  const Bf16View1D x = rounded(L.x), fc = rounded(L.fc), up = rounded(L.up), proj = rounded(L.proj);
  const std::size_t F = L.F, C = L.C, R = L.R;
  const ConstBf16Slice2D xs(x.data(), R, C);
  auto run = [&](Communicator* g) {
    ExpertParallel layer(L.m, 0, g, R, L.positions, true);
    // The layer's experts of the bf16 copies.
    const std::size_t first = layer.first_expert(), n = layer.local_experts();
    const ExpertMatrices<bf16> mats{ConstBf16Slice2D(fc.data() + first * F * C, n * F, C),
                                    ConstBf16Slice2D(up.data() + first * F * C, n * F, C),
                                    ConstBf16Slice2D(proj.data() + first * C * F, n * C, F)};
    MoeActivations a = layer.allocate();
    Kokkos::deep_copy(L.out, real(0));
    layer.forward<bf16>(Layer::mat(L.out, R, C), xs, L.weights(layer), mats, a);
    L.zero_grads();
    layer.backward<bf16>(Layer::mat(L.dx, R, C), L.grads(layer), Layer::mat(L.dout, R, C), xs, L.weights(layer), mats,
                         a);
    std::vector<std::vector<double>> r = {host(L.out), host(L.dx), summed_over_world(host(L.g_fc)),
                                          summed_over_world(host(L.g_router))};
    return r;
  };
  const auto one = run(nullptr), two = run(&group);
  const char* what[] = {"bf16 out", "bf16 d x", "bf16 d experts c_fc (summed)", "bf16 d router (summed)"};
  for (std::size_t i = 0; i < one.size(); ++i) expect_close(what[i], one[i], two[i], 1e-6);
}

// An expert sent more rows than train.moe_max_load x the mean load stops
// every member of the group with the same message, naming the expert.
TEST(ExpertParallel, AnExpertPastItsBoundStopsEveryMember) {
  const int ranks = world_size();
  std::unique_ptr<Communicator> group;
  if (ranks > 1) group = std::make_unique<Communicator>(MPI_COMM_WORLD, "expert");
  const ModelConfig m = moe_config(4, 2, MoeScore::sigmoid, MoeRouter::learned, MlpKind::gelu, true);
  Layer L(m, 16, 81, 800 + world_rank());
  // A selection bias that puts expert 2 first for every token.
  L.bias = View1D("bias", L.E);
  upload(L.bias, {0, 0, 10, 0});
  ExpertParallel layer(L.m, 1.5, group.get(), L.R, L.positions, false);
  MoeActivations a = layer.allocate();
  try {
    L.forward(layer, a);
    ADD_FAILURE() << "every token on one expert passed a bound of 1.5 x the mean load";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("expert 2 "), std::string::npos) << what;
    EXPECT_NE(what.find("train.moe_max_load"), std::string::npos) << what;
    if (world_rank() == 0) std::printf("  refusal: %s\n", what.c_str());
  }
  // Below the bound the same routing runs: no bound (0) takes it.
  ExpertParallel unbounded(L.m, 0, group.get(), L.R, L.positions, false);
  MoeActivations b = unbounded.allocate();
  L.forward(unbounded, b);
  for (std::size_t r = 0; r < L.R; ++r) EXPECT_EQ(b.expert[r * 2], 2);
}

// The sequence-wise balance loss where a sequence's rows lie on several
// ranks (as under cp or sequence parallelism): each rank holds a slice of
// every sequence, the per-sequence sums run over the group, and every
// rank's d(x) rows and the summed router gradient equal one rank holding
// all the rows. The loss itself adds up to one rank's.
TEST(ExpertParallel, SequenceBalanceLossSpansTheRanksOfASequence) {
  const int ranks = world_size(), rank = world_rank();
  if (ranks == 1) GTEST_SKIP() << "needs a sequence split over 2 or more ranks (run under mpiexec -n 2 or 4)";
  Communicator sequence_group(MPI_COMM_WORLD, "sequence");
  const ModelConfig m = moe_config(4, 2, MoeScore::sigmoid, MoeRouter::learned, MlpKind::gelu, true);
  const std::size_t T = 8, S = 2, R = S * T, share = T / ranks;
  Layer whole(m, R, 91, 950);
  Kokkos::deep_copy(whole.dout, real(0));
  auto aux_for = [&](std::size_t rows, std::size_t per_sequence, std::vector<Communicator*> groups) {
    MoeAuxLosses aux;
    aux.seq_aux = 0.5;
    aux.seq_len = static_cast<int>(T);
    aux.micro_batch = static_cast<int>(S);
    for (std::size_t r = 0; r < rows; ++r) aux.sequences.push_back(static_cast<int>(r / per_sequence));
    aux.sequence_groups = std::move(groups);
    return aux;
  };
  const real scale = static_cast<real>(1.0 / R);
  ExpertParallel alone(m, 0, nullptr, R, whole.positions, false);
  alone.set_aux_losses(aux_for(R, T, {}));
  MoeActivations a = alone.allocate();
  Kokkos::deep_copy(whole.out, real(0));
  const double loss = alone
                          .forward<real>(Layer::mat(whole.out, R, m.channels), Layer::mat(whole.x, R, m.channels),
                                         whole.weights(alone), whole.matrices(alone), a)
                          .seq_aux_sum;
  whole.zero_grads();
  alone.backward<real>(Layer::mat(whole.dx, R, m.channels), whole.grads(alone), Layer::mat(whole.dout, R, m.channels),
                       Layer::mat(whole.x, R, m.channels), whole.weights(alone), whole.matrices(alone), a, scale);

  // This rank's slice: tokens [rank share, + share) of each sequence.
  Layer part(m, S * share, 91, 950);
  Kokkos::deep_copy(part.dout, real(0));
  std::vector<std::size_t> rows;
  for (std::size_t s = 0; s < S; ++s)
    for (std::size_t t = rank * share; t < (rank + 1) * share; ++t) rows.push_back(s * T + t);
  const auto x = host(whole.x);
  std::vector<double> xs;
  for (std::size_t r : rows) xs.insert(xs.end(), x.begin() + r * m.channels, x.begin() + (r + 1) * m.channels);
  upload(part.x, xs);
  for (std::size_t i = 0; i < rows.size(); ++i) part.positions[i] = whole.positions[rows[i]];
  ExpertParallel split(m, 0, nullptr, rows.size(), part.positions, false);
  split.set_aux_losses(aux_for(rows.size(), share, {&sequence_group}));
  MoeActivations b = split.allocate();
  Kokkos::deep_copy(part.out, real(0));
  const double mine =
      split
          .forward<real>(Layer::mat(part.out, rows.size(), m.channels), Layer::mat(part.x, rows.size(), m.channels),
                         part.weights(split), part.matrices(split), b)
          .seq_aux_sum;
  double summed = mine;
  MPI_Allreduce(MPI_IN_PLACE, &summed, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_NEAR(summed, loss, 1e-6 * std::abs(loss));
  part.zero_grads();
  split.backward<real>(Layer::mat(part.dx, rows.size(), m.channels), part.grads(split),
                       Layer::mat(part.dout, rows.size(), m.channels), Layer::mat(part.x, rows.size(), m.channels),
                       part.weights(split), part.matrices(split), b, scale);
  const auto dx = host(whole.dx);
  std::vector<double> dx_rows;
  for (std::size_t r : rows)
    dx_rows.insert(dx_rows.end(), dx.begin() + r * m.channels, dx.begin() + (r + 1) * m.channels);
  expect_close("d x rows (balance loss)", dx_rows, host(part.dx), 1e-5);
  expect_close("d router summed (balance loss)", host(whole.g_router), summed_over_world(host(part.g_router)), 1e-5);
}
