// SPDX-License-Identifier: BSD-3-Clause
#include "plan/calibrate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi/mpi_calls.hpp"
#include "comm/progress.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "core/types.hpp"
#include "kernels/gemm_library.hpp"
#include "kernels/kernels.hpp"
#include "layers/context_parallel.hpp"
#include "model/gpt.hpp"
#include "plan/cluster.hpp"
#include "plan/cost_model.hpp"
#include "run/budget.hpp"
#include "run/calibration.hpp"

namespace ndmini {
namespace {

constexpr int kRepeats = 7;  // the median of these, after one untimed warm-up

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median seconds of `work` over kRepeats runs after one warm-up, wall
// time (as a training step is timed), every rank at once.
template <class Work>
double median_seconds(Work&& work) {
  std::vector<double> seconds;
  for (int rep = -1; rep < kRepeats; ++rep) {
    Kokkos::fence();
    const auto t0 = Clock::now();
    work();
    Kokkos::fence();
    if (rep >= 0) seconds.push_back(seconds_since(t0));
  }
  return median_of(seconds);
}

// A GPT-2-small block's shapes: one micro-batch of 1024 rows, 768 channels, 12 heads.
constexpr int kRows = 1024, kChannels = 768, kHeads = 12, kSeqLen = 256;

// The rows of each shape class's representative products: the block's
// widths are 768 or more, so the rows are the products' smallest dimension.
// About the middle of each class on a log scale (64 of [32, 128), 192 of
// [128, 384)); the large class's 1024 rows are one micro-batch of 4 x 256
// tokens, as efficiency.compute has always been measured.
constexpr int kClassRows[kGemmClasses] = {64, 192, kRows};
static_assert(gemm_class(kClassRows[0]) == GemmClass::small && gemm_class(kClassRows[1]) == GemmClass::medium &&
                  gemm_class(kClassRows[2]) == GemmClass::large && gemm_class(kChannels) == GemmClass::large,
              "each class's representative rows must be in that class, and the widths in no smaller one");

// FLOP/s of one block's twelve matrix products (the four Linear layers'
// forward, weight-gradient and input-gradient products, through the
// model's own kernels, in `precision`) at each shape class's rows. The
// classes take turns within each repetition, so a load that comes and goes
// weighs on them alike; the median of kRepeats each, after one warm-up.
std::array<double, kGemmClasses> block_products_flops(Precision precision) {
  const int C = kChannels;
  const int widths[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};  // in, out
  const std::size_t rows_x_width = std::size_t{kRows} * 4 * C, weight = std::size_t{4} * C * C;
  View1D x("ndmini::calib_x", rows_x_width), y("ndmini::calib_y", rows_x_width), dx("ndmini::calib_dx", rows_x_width),
      w("ndmini::calib_w", weight), dw("ndmini::calib_dw", weight), bias("ndmini::calib_bias", 4 * C),
      dbias("ndmini::calib_dbias", 4 * C);
  Kokkos::deep_copy(x, real(0.5));
  Kokkos::deep_copy(w, real(0.01));
  const bool half = precision == Precision::bf16;
  Bf16View1D xh, wh, dyh;  // the bf16 operands, as the model keeps them under bf16
  if (half) {
    xh = Bf16View1D("ndmini::calib_x_bf16", rows_x_width);
    wh = Bf16View1D("ndmini::calib_w_bf16", weight);
    dyh = Bf16View1D("ndmini::calib_dy_bf16", rows_x_width);
    Kokkos::deep_copy(xh, bf16(0.5f));
    Kokkos::deep_copy(wh, bf16(0.01f));
  }
  // Each operand contiguous, as the model's activations and weights are.
  auto block = [&](int rows) {
    for (const auto& io : widths) {
      const Slice2D ys(y.data(), rows, io[1]), dxs(dx.data(), rows, io[0]), dws(dw.data(), io[1], io[0]);
      const Slice1D bs = Kokkos::subview(bias, Kokkos::make_pair(0, io[1])),
                    dbs = Kokkos::subview(dbias, Kokkos::make_pair(0, io[1]));
      if (half) {
        const ConstBf16Slice2D xs(xh.data(), rows, io[0]), ws(wh.data(), io[1], io[0]);
        kernels::linear_forward<bf16>(ys, xs, ws, bs);
        kernels::linear_backward<bf16>(dxs, dws, dbs, ys, xs, ws, Bf16Slice2D(dyh.data(), rows, io[1]));
      } else {
        const ConstSlice2D xs(x.data(), rows, io[0]), ws(w.data(), io[1], io[0]);
        kernels::linear_forward(ys, xs, ws, bs);
        kernels::linear_backward(dxs, dws, dbs, ys, xs, ws);
      }
    }
  };
  std::vector<double> seconds[kGemmClasses];
  for (int rep = -1; rep < kRepeats; ++rep)
    for (int k = 0; k < kGemmClasses; ++k) {
      Kokkos::fence();
      const auto t0 = Clock::now();
      block(kClassRows[k]);
      Kokkos::fence();
      if (rep >= 0) seconds[k].push_back(seconds_since(t0));
    }
  std::array<double, kGemmClasses> rates{};
  for (int k = 0; k < kGemmClasses; ++k) {
    double flops = 0;
    for (const auto& io : widths) flops += 3 * 2.0 * kClassRows[k] * io[0] * io[1];
    rates[k] = flops / median_of(seconds[k]);
  }
  return rates;
}

// FLOP/s of causal attention's forward and backward (counted as the cost
// model counts them: 4 C T per token forward, twice that backward) on one
// micro-batch of 4 sequences of 256 tokens.
double attention_flops() {
  const kernels::AttentionShape shape{kRows / kSeqLen, kSeqLen, kChannels, kHeads};
  ContextParallelAttention attention(nullptr, shape, kSeqLen);
  View2D qkv("ndmini::calib_qkv", kRows, 3 * kChannels), out("ndmini::calib_out", kRows, kChannels),
      dout("ndmini::calib_dout", kRows, kChannels), dqkv("ndmini::calib_dqkv", kRows, 3 * kChannels);
  View1D qkvh("ndmini::calib_qkvh", ContextParallelAttention::qkvh_size(shape)),
      lse("ndmini::calib_lse", ContextParallelAttention::lse_size(shape));
  Kokkos::deep_copy(qkv, real(0.1));
  Kokkos::deep_copy(dout, real(0.01));
  const ContextParallelAttention::Saved saved{qkvh, lse, {}};
  const double s = median_seconds([&] {
    attention.forward(out, qkv, saved);
    attention.backward(dqkv, dout, out, saved);
  });
  return 3 * 4.0 * kRows * kSeqLen * static_cast<double>(kChannels) / s;
}

// Bytes per second of the AdamW update over one GPT-2-small block's
// parameters (it reads and writes parameter, gradient, which it zeroes, and
// both moments): how the optimizer streams memory. The count is a real
// model's, as the trainer's flat buffers are sized, never a power of two:
// four buffers of 2^23 floats each alias in the caches, and the update read
// a third of the bandwidth the trainer's buffers stream at (3.4 against
// 10-11 GB/s on this project's 2-core VM).
double optimizer_bandwidth() {
  ModelConfig block;
  block.layers = 1;
  block.channels = kChannels;
  const auto n = static_cast<std::size_t>(gpt_param_count(block));
  View1D p("ndmini::calib_p", n), grad("ndmini::calib_grad", n), m("ndmini::calib_m", n), v("ndmini::calib_v", n);
  Kokkos::deep_copy(p, real(0.02));
  const kernels::AdamWStep step{real(6e-4), real(0.9), real(0.95), real(1e-8), real(0.1), real(1), 1};
  const double s = median_seconds([&] { kernels::adamw_update(p, grad, m, v, step, true); });
  return 8.0 * n * sizeof(real) / s;
}

// The memory-bound kernels of one block's micro-batch (4 x 256 tokens, 768
// channels): both LayerNorms and the GELU, forward and backward, and the
// four bias gradients; as bytes per second in the cost model's own count
// for them (kActivationPasses times the block's activation records, from
// BlockSizes, the size function the records are allocated by).
double block_kernels_bandwidth() {
  const int C = kChannels, H = 4 * kChannels;
  View2D x("ndmini::calib_ln_x", kRows, C), y("ndmini::calib_ln_y", kRows, C), dx("ndmini::calib_ln_dx", kRows, C),
      h("ndmini::calib_gelu_x", kRows, H), g("ndmini::calib_gelu_y", kRows, H);
  View1D gamma("ndmini::calib_gamma", C), beta("ndmini::calib_beta", C), dgamma("ndmini::calib_dgamma", C),
      dbeta("ndmini::calib_dbeta", C), mean("ndmini::calib_mean", kRows), rstd("ndmini::calib_rstd", kRows),
      dbias("ndmini::calib_dbias", H);
  Kokkos::deep_copy(x, real(0.3));
  Kokkos::deep_copy(h, real(0.2));
  Kokkos::deep_copy(gamma, real(1));
  const double s = median_seconds([&] {
    for (int ln = 0; ln < 2; ++ln) {
      kernels::layernorm_forward(y, mean, rstd, x, gamma, beta);
      kernels::layernorm_backward(dx, dgamma, dbeta, y, x, gamma, mean, rstd);
    }
    kernels::gelu_forward(g, h);
    kernels::gelu_backward(g, h, g);
    const int widths[4] = {3 * C, C, H, C};  // c_attn, attn_proj, c_fc, mlp_proj outputs
    for (int w : widths)
      kernels::bias_backward(Kokkos::subview(dbias, Kokkos::make_pair(0, w)),
                             Kokkos::subview(g, Kokkos::ALL, Kokkos::make_pair(0, w)));
  });
  ModelConfig m;
  m.layers = 1;
  m.channels = kChannels;
  m.heads = kHeads;
  m.seq_len = kSeqLen;
  const BlockSizes block = GptModel::block_sizes_of(m, kRows / kSeqLen, 1, false, 1);
  return kActivationPasses * static_cast<double>(block.activation_bytes(false)) / s;
}

// The fraction of a collective that hides behind compute here: an
// all-reduce alone, a matrix product alone, then both at once (the
// all-reduce issued first, as the trainer issues its buckets), with the
// progress thread the trainer runs. 1: hidden whole; 0: the two add up, as
// where moving the data takes the cores the compute needs. Every timed run
// starts on all ranks together (a rank that waits for a late one would
// count the wait as the all-reduce's), and the fraction is the median of
// `passes` measurements: a fraction is a small difference of large times.
double overlap_fraction(Communicator& comm, MPI_Comm world, int passes) {
  const MpiProgressThread progress(world, CommConfig{}.progress_poll_us);
  // 64 MiB and one product of about as long here: the fraction is of the
  // shorter, so neither may be small against the other's noise.
  constexpr std::size_t kFloats = std::size_t{1} << 24;
  View1D buf("ndmini::calib_overlap", kFloats);
  const int C = kChannels;
  View2D x("ndmini::calib_ov_x", kRows, C), w("ndmini::calib_ov_w", 4 * C, C), y("ndmini::calib_ov_y", kRows, 4 * C);
  auto compute = [&] { kernels::gemm("N", "T", real(1), x, w, real(0), y); };
  // The median over kRepeats of the slowest rank's time of `work`.
  auto together = [&](auto&& work) {
    std::vector<double> seconds;
    for (int rep = -1; rep < kRepeats; ++rep) {
      mpi_barrier(world, "the overlap calibration");
      const auto t0 = Clock::now();
      work();
      Kokkos::fence();
      double t = seconds_since(t0);
      mpi_all_reduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world, "the overlap calibration");
      if (rep >= 0) seconds.push_back(t);
    }
    return median_of(seconds);
  };
  std::vector<double> fractions;
  for (int pass = 0; pass < passes; ++pass) {
    const double alone_compute = together(compute);
    const double alone_comm = together([&] { comm.iall_reduce(buf.data(), kFloats).wait(); });
    const double both = together([&] {
      CommRequest r = comm.iall_reduce(buf.data(), kFloats);
      compute();
      r.wait();
    });
    const double hidden = alone_compute + alone_comm - both;
    fractions.push_back(std::clamp(hidden / std::min(alone_compute, alone_comm), 0.0, 1.0));
  }
  return median_of(fractions);
}

// Milliseconds of one collective of `kind` and `count` floats over `comm`
// (the whole buffer of an all-reduce, the gathered or scattered one of an
// all-gather or reduce-scatter, the message each rank sends and receives in
// a ring exchange, as cp's ring does): the median of the ranks' slowest.
// `out`, as large as `buf`, takes what does not land in `buf`.
double collective_call_ms(Communicator& comm, Collective kind, View1D buf, View1D out, std::size_t count) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t per_rank = count / static_cast<std::size_t>(n);
  auto call = [&] {
    switch (kind) {
      case Collective::all_reduce:
        comm.all_reduce(buf.data(), count);
        break;
      case Collective::all_gather:
        comm.all_gather(buf.data() + static_cast<std::size_t>(r) * per_rank, buf.data(), per_rank);
        break;
      case Collective::reduce_scatter:
        comm.reduce_scatter(buf.data(), out.data(), per_rank);
        break;
      case Collective::p2p:
        comm.batch_p2p({{P2POp::Kind::send, buf.data(), count, (r + 1) % n},
                        {P2POp::Kind::recv, out.data(), count, (r + n - 1) % n}})
            .wait();
        break;
    }
  };
  std::vector<double> ms;
  for (int rep = -1; rep < kRepeats; ++rep) {
    mpi_barrier(comm.mpi(), "the collective calibration");
    const auto t0 = Clock::now();
    call();
    Kokkos::fence();
    double t = ms_since(t0);
    mpi_all_reduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm.mpi(), "the collective calibration");
    if (rep >= 0) ms.push_back(t);
  }
  return median_of(ms);
}

// The comm layer's collectives over `group` as the planner's link figures:
// a one-float all-reduce, and an all-reduce, all-gather, reduce-scatter and
// ring exchange of 64 MiB, inverted through collective_ms (the planner's
// formula) into the latency of one step and each kind's bus bandwidth.
// Every group of `world` measures at once, the slowest speaks; a rank in no
// group (MPI_COMM_NULL) waits.
constexpr Collective kKinds[] = {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                                 Collective::p2p};
constexpr int kKindCount = 4;
struct LinkRates {
  int ranks = 0;
  double latency_us = 0;
  double latency_call_ms = 0, large_call_ms = 0;  // the 4-byte and the 64 MiB all-reduce, as measured
  double bandwidth_gbs[kKindCount] = {};          // in kKinds' order
};
LinkRates link_rates(MPI_Comm group, MPI_Comm world, Communicator::Backend backend, View1D buf, View1D out) {
  double ms[1 + kKindCount] = {};  // the one-float all-reduce, then each kind at full size
  int ranks = 0;
  if (group != MPI_COMM_NULL) {
    Communicator comm(group, "calibration", backend);
    ranks = comm.size();
    ms[0] = collective_call_ms(comm, Collective::all_reduce, buf, out, 1);
    for (int k = 0; k < kKindCount; ++k) ms[1 + k] = collective_call_ms(comm, kKinds[k], buf, out, buf.extent(0));
  }
  mpi_all_reduce(MPI_IN_PLACE, ms, 1 + kKindCount, MPI_DOUBLE, MPI_MAX, world, "the collective calibration");
  mpi_all_reduce(MPI_IN_PLACE, &ranks, 1, MPI_INT, MPI_MAX, world, "the collective calibration");
  LinkRates r;
  r.ranks = ranks;
  r.latency_call_ms = ms[0];
  r.large_call_ms = ms[1];
  r.latency_us = ms[0] * 1e3 / collective_ms(Collective::all_reduce, 0, ranks, 1, 1e3);  // in units of the latency
  const double bytes = static_cast<double>(buf.extent(0)) * sizeof(real);
  for (int k = 0; k < kKindCount; ++k) {
    // The bandwidth part of the large call: what the latency terms leave.
    const double beta_ms = std::max(ms[1 + k] - collective_ms(kKinds[k], 0, ranks, 1, r.latency_us), 1e-6);
    r.bandwidth_gbs[k] = collective_ms(kKinds[k], bytes, ranks, 1, 0) / beta_ms;  // 1 GB/s -> x
  }
  return r;
}

// The link figures inside a node, per group size: groups of 2, 4, ... and
// of the whole node (`per_node` ranks), every node's groups at once, as a
// run's axes talk inside each node at once. Empty with one rank per node.
std::vector<LinkRates> intra_node_rates(MPI_Comm world, int per_node, Communicator::Backend backend, View1D buf,
                                        View1D out) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  std::vector<int> sizes;
  for (int g = 2; g < per_node; g *= 2) sizes.push_back(g);
  if (per_node >= 2) sizes.push_back(per_node);
  std::vector<LinkRates> rates;
  for (int g : sizes) {
    MPI_Comm group = MPI_COMM_NULL;
    MPI_Comm_split(node, local < per_node / g * g ? local / g : MPI_UNDEFINED, local, &group);
    rates.push_back(link_rates(group, world, backend, buf, out));
    if (group != MPI_COMM_NULL) MPI_Comm_free(&group);
  }
  MPI_Comm_free(&node);
  return rates;
}

// Microseconds one kernel launch costs beyond its work: kLaunches empty
// kernels queued back to back and one fence (a step queues its kernels so;
// a fence per kernel would time the synchronisation instead), the median of
// kRepeats, this rank's.
double launch_overhead_us() {
  constexpr int kLaunches = 2000;
  const double seconds = median_seconds([] {
    for (int i = 0; i < kLaunches; ++i)
      Kokkos::parallel_for("ndmini::calib_empty_kernel", Kokkos::RangePolicy<ExecSpace>(0, 1), KOKKOS_LAMBDA(int){});
  });
  return seconds / kLaunches * 1e6;
}

std::string fixed(double v, int digits) {
  char s[32];
  std::snprintf(s, sizeof s, "%.*f", digits, v);
  return s;
}

std::string short_number(double v) {
  char s[32];
  std::snprintf(s, sizeof s, "%.3g", v);
  return s;
}

void override_from(const char* variable, double& value) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v) || v < 0)
    throw Error(std::string("environment variable ") + variable + " = '" + text +
                "': must be a number, 0 or more (docs/planner.md, \"Sanity checks\"); unset it for the default");
  value = v;
}

}  // namespace

CalibrationLimits calibration_limits_from_environment() {
  CalibrationLimits l;
  override_from("NDMINI_CALIBRATE_MAX_SPREAD", l.most_pass_spread);
  override_from("NDMINI_CALIBRATE_MAX_LATENCY_US", l.most_latency_us);
  override_from("NDMINI_CALIBRATE_MIN_BF16_RATIO", l.least_bf16_over_fp32);
  override_from("NDMINI_CALIBRATE_MAX_LOAD_PER_CORE", l.most_load_per_core);
  if (const char* f = std::getenv("NDMINI_CALIBRATE_LOADAVG"); f != nullptr && *f != '\0') l.loadavg_file = f;
  double passes = l.passes;
  override_from("NDMINI_CALIBRATE_PASSES", passes);
  if (passes < 1 || passes > 100 || passes != std::floor(passes))
    throw Error(std::string("environment variable NDMINI_CALIBRATE_PASSES = '") +
                std::getenv("NDMINI_CALIBRATE_PASSES") +
                "': must be a whole number from 1 to 100 (docs/planner.md, \"Calibration\"); unset it for the default");
  l.passes = static_cast<int>(passes);
  return l;
}

std::vector<std::string> calibration_warnings(const CalibrationSamples& s, const CalibrationLimits& limits) {
  std::vector<std::string> out;
  for (const auto& [name, passes] : s.passes) {
    if (passes.empty()) continue;
    const auto [lo, hi] = std::minmax_element(passes.begin(), passes.end());
    const double median = median_of(passes);
    const double spread = median > 0 ? (*hi - *lo) / median : 0;
    if (spread > limits.most_pass_spread)
      out.push_back("the " + std::to_string(passes.size()) + " passes of " + name + " disagree: " + short_number(*lo) +
                    " to " + short_number(*hi) + ", a spread of " + fixed(100 * spread, 0) +
                    "% of their median (at most " + fixed(100 * limits.most_pass_spread, 0) +
                    "%): something else ran beside the calibration");
  }
  if (s.latency_us > limits.most_latency_us || (s.large_call_ms > 0 && s.latency_call_ms > 0.5 * s.large_call_ms))
    out.push_back("intra_node.latency_us = " + short_number(s.latency_us) + " from a 4-byte all-reduce of " +
                  short_number(s.latency_call_ms) + " ms (a 64 MiB one took " + short_number(s.large_call_ms) +
                  " ms): above " + short_number(limits.most_latency_us) +
                  " us per ring step, or half the large call, a rank was descheduled (a loaded machine)");
  if (s.native_bf16 && s.peak_bf16 < limits.least_bf16_over_fp32 * s.peak_fp32)
    out.push_back("peak_tflops_bf16 = " + short_number(s.peak_bf16 / 1e12) + " is below " +
                  short_number(limits.least_bf16_over_fp32) +
                  " x peak_tflops_fp32 = " + short_number(s.peak_fp32 / 1e12) +
                  " on a build with native bf16 products: one of the two was measured on a busy machine");
  return out;
}

std::string load_warning(const CalibrationLimits& limits, int online_cores) {
  std::ifstream in(limits.loadavg_file);
  double load = -1;
  if (!(in >> load) || load < 0)
    throw Error("load average file '" + limits.loadavg_file +
                "': cannot read its first number (NDMINI_CALIBRATE_LOADAVG names another file)");
  const int cores = std::max(1, online_cores);
  if (load / cores <= limits.most_load_per_core) return "";
  return "the machine is loaded: a 1-minute load average of " + fixed(load, 2) + " (" + limits.loadavg_file + ") on " +
         std::to_string(cores) + " core" + (cores == 1 ? "" : "s") + ", above " + fixed(limits.most_load_per_core, 2) +
         " per core before the calibration started; its rates would be those of a shared machine";
}

Calibration calibrate_cluster(MPI_Comm world, const CalibrationLimits& limits,
                              const std::function<void(const std::string&)>& progress) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  require(size >= 2,
          "ndmini plan --calibrate pings the collectives between ranks: launch at least 2 (mpiexec -n 2 ndmini plan "
          "--calibrate), one per device");
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int per_node = 1;
  MPI_Comm_size(node, &per_node);
  MPI_Comm_free(&node);
  int nodes_min = per_node, nodes_max = per_node;  // the same on every node, or the file says the least
  mpi_all_reduce(MPI_IN_PLACE, &nodes_min, 1, MPI_INT, MPI_MIN, world, "the ranks per node");
  mpi_all_reduce(MPI_IN_PLACE, &nodes_max, 1, MPI_INT, MPI_MAX, world, "the ranks per node");

  const auto started = Clock::now();
  auto phase = [&](const std::string& what) {
    if (rank == 0 && progress) progress("calibrate: " + what + " (" + fixed(seconds_since(started), 0) + " s)");
  };
  Calibration result;
  // Rank 0's node, before anything runs: the load of others.
  if (rank == 0) {
    const std::string loaded = load_warning(limits, static_cast<int>(std::thread::hardware_concurrency()));
    if (!loaded.empty()) result.warnings.push_back(loaded);
  }
  phase("the GEMM peaks, fp32 and bf16");
  ClusterSpec spec;
  spec.devices_per_node = nodes_min;
  spec.name = std::string("this machine, measured by ndmini plan --calibrate (") + ExecSpace::name() + ", " +
              std::to_string(size) + " ranks)";
  // Every rank measures at once, as the ranks of a run compute at once; the fastest rank speaks (as for MFU).
  // peak_flops() first times the libraries and takes the route a run takes (perf.gemm_route = "auto").
  const double rates[2] = {peak_flops(PerfConfig{}, world, Precision::fp32).flops_per_rank,
                           peak_flops(PerfConfig{}, world, Precision::bf16).flops_per_rank};
  spec.peak_tflops_fp32 = rates[0] / 1e12;
  spec.peak_tflops_bf16 = rates[1] / 1e12;
  spec.memory_gib = memory_per_rank(Config{}, per_node, nullptr) / (1024.0 * 1024.0 * 1024.0);

  // Collectives: inside a node per group size, the model's figure the
  // median of the sizes' (the file's comment lists each); between nodes,
  // over all ranks (the slower link dominates a group that spans nodes).
  phase("the collectives inside a node and between nodes (latency and bandwidth per kind)");
  const Communicator::Backend backend = device_collectives_backend(world);
  Communicator comm(world, "calibration", backend);
  View1D buf("ndmini::calib_collective", std::size_t{1} << 24), out("ndmini::calib_collective_out", buf.extent(0));
  const bool one_node = nodes_max == size;
  const std::vector<LinkRates> groups = intra_node_rates(world, nodes_min, backend, buf, out);
  const LinkRates across = one_node ? LinkRates{} : link_rates(world, world, backend, buf, out);
  LinkRates intra = across;         // with one rank per node: the figures over all ranks
  std::string by_size[kKindCount];  // each kind's figure per group size, for the file's comments
  if (!groups.empty()) {
    std::vector<double> latencies;
    for (const LinkRates& g : groups) latencies.push_back(g.latency_us);
    intra.latency_us = median_of(latencies);
    for (const LinkRates& g : groups)  // the calls of the group size whose latency is the median
      if (g.latency_us == intra.latency_us) {
        intra.latency_call_ms = g.latency_call_ms;
        intra.large_call_ms = g.large_call_ms;
      }
    for (int k = 0; k < kKindCount; ++k) {
      std::vector<double> bandwidths;
      for (const LinkRates& g : groups) {
        bandwidths.push_back(g.bandwidth_gbs[k]);
        by_size[k] += (by_size[k].empty() ? "" : ", ") + std::to_string(g.ranks) + " ranks " +
                      fixed(g.bandwidth_gbs[k], 3) + " GB/s" + (k == 0 ? ", " + fixed(g.latency_us, 3) + " us" : "");
      }
      intra.bandwidth_gbs[k] = median_of(bandwidths);
    }
  }
  const LinkRates& inter = one_node ? intra : across;
  spec.intra_latency_us = intra.latency_us;
  spec.inter_latency_us = inter.latency_us;
  double* const intra_keys[kKindCount] = {&spec.intra_bandwidth_gbs, &spec.intra_all_gather_gbs,
                                          &spec.intra_reduce_scatter_gbs, &spec.intra_p2p_gbs};
  double* const inter_keys[kKindCount] = {&spec.inter_bandwidth_gbs, &spec.inter_all_gather_gbs,
                                          &spec.inter_reduce_scatter_gbs, &spec.inter_p2p_gbs};
  for (int k = 0; k < kKindCount; ++k) {
    *intra_keys[k] = intra.bandwidth_gbs[k];
    *inter_keys[k] = inter.bandwidth_gbs[k];
  }
  auto intra_how = [&](int k) {
    return groups.empty()
               ? std::string("one rank per node: the figure over all ranks")
               : "the median over group sizes inside a node (" + by_size[k] + "), every node's groups at once";
  };
  spec.network_efficiency = 1.0;  // measured rates, not datasheet ones
  // What the model's own kernels reach, every rank at once; the slowest
  // rank speaks (a step waits for it). The model uses memory bandwidth for
  // the optimizer and the memory-bound kernels only, so both are measured
  // through those kernels (on a host they differ from a plain copy both
  // ways: caches help the small ones, the GELU's tanh is arithmetic).
  // Each kernel starts on every rank together, as in a step: a rank that
  // ran ahead would otherwise time its kernel beside another one (a
  // memory-bound kernel beside a product slows both). The whole sequence
  // runs limits.passes times (3 unless NDMINI_CALIBRATE_PASSES) and each
  // figure is the median of its passes: a shared host's noise that lasts a
  // few seconds spoils one pass, not the file.
  auto together = [&] { mpi_barrier(world, "the kernel calibration"); };
  enum { kAttention = 2 * kGemmClasses, kOptimizer, kKernels, kReached };
  std::vector<double> passes[kReached];
  for (int pass = 0; pass < limits.passes; ++pass) {
    phase("the model's kernels, pass " + std::to_string(pass + 1) + " of " + std::to_string(limits.passes) +
          " (products per shape class, attention, optimizer, memory-bound kernels)");
    together();
    const std::array<double, kGemmClasses> fp32 = block_products_flops(Precision::fp32);
    together();
    const std::array<double, kGemmClasses> bf16 = block_products_flops(Precision::bf16);
    for (int k = 0; k < kGemmClasses; ++k) {
      passes[k].push_back(fp32[k]);
      passes[kGemmClasses + k].push_back(bf16[k]);
    }
    together();
    passes[kAttention].push_back(attention_flops());
    together();
    passes[kOptimizer].push_back(optimizer_bandwidth());
    together();
    passes[kKernels].push_back(block_kernels_bandwidth());
  }
  double reached[kReached];
  for (int k = 0; k < kReached; ++k) reached[k] = median_of(passes[k]);
  mpi_all_reduce(MPI_IN_PLACE, reached, kReached, MPI_DOUBLE, MPI_MIN, world, "the kernel calibration");
  // A peak is never below what the products were seen to reach (a noisy
  // calibration run would otherwise make an efficiency read above 1).
  const double* fp32_reached = reached;
  const double* bf16_reached = reached + kGemmClasses;
  const double peak =
      std::max({rates[0], *std::max_element(fp32_reached, fp32_reached + kGemmClasses), reached[kAttention]});
  const double peak_bf16 = std::max(rates[1], *std::max_element(bf16_reached, bf16_reached + kGemmClasses));
  spec.peak_tflops_fp32 = peak / 1e12;
  spec.peak_tflops_bf16 = peak_bf16 / 1e12;
  for (int k = 0; k < kGemmClasses; ++k) {
    spec.gemm_key(GemmClass(k), Precision::fp32) = fp32_reached[k] / peak;
    spec.gemm_key(GemmClass(k), Precision::bf16) = bf16_reached[k] / peak_bf16;
  }
  // The fallback of products no class key covers: the large class in fp32, as before the classes.
  spec.compute_efficiency = spec.gemm_large_fp32;
  spec.attention_efficiency = reached[kAttention] / peak;
  spec.memory_bandwidth_gbs = reached[kOptimizer] / 1e9;
  spec.kernel_bandwidth_gbs = reached[kKernels] / 1e9;
  phase("the kernel launch overhead");
  double launch_us = launch_overhead_us();
  mpi_all_reduce(MPI_IN_PLACE, &launch_us, 1, MPI_DOUBLE, MPI_MAX, world, "the launch calibration");
  spec.launch_overhead_us = launch_us;
  phase("the overlap of a collective with compute");
  spec.overlap_efficiency = overlap_fraction(comm, world, limits.passes);
  phase("done");
  if (rank != 0) return result;
  CalibrationSamples samples;
  const char* const names[kReached] = {"the small fp32 products",
                                       "the medium fp32 products",
                                       "the large fp32 products",
                                       "the small bf16 products",
                                       "the medium bf16 products",
                                       "the large bf16 products",
                                       "attention",
                                       "the optimizer",
                                       "the memory-bound kernels"};
  for (int k = 0; k < kReached; ++k) samples.passes.push_back({names[k], passes[k]});
  samples.latency_us = spec.intra_latency_us;
  samples.latency_call_ms = intra.latency_call_ms;
  samples.large_call_ms = intra.large_call_ms;
  samples.peak_fp32 = spec.peak_tflops_fp32 * 1e12;  // as written
  samples.peak_bf16 = spec.peak_tflops_bf16 * 1e12;
  // Native: bf16 on a library of its own (oneDNN, cuBLAS), not widened through the fp32 route.
  samples.native_bf16 = kernels::gemm_libraries(true).front() != kernels::GemmLibrary::blas;
  for (std::string& w : calibration_warnings(samples, limits)) result.warnings.push_back(std::move(w));
  result.text = cluster_toml(
      spec,
      "# Written by `ndmini plan --calibrate` (docs/planner.md): this machine's rates, measured, not\n"
      "# datasheet figures; regenerate it on the machine it describes.\n",
      {{"device.per_node", "ranks on one node (MPI_COMM_TYPE_SHARED): one device per rank"},
       {"device.memory_gib", "MemAvailable of the node / its ranks (host memory on a host build)"},
       {"device.peak_tflops_fp32", "the start-up GEMM calibration, fp32, 1024^3 NT/TN/NN, best run, fastest rank"},
       {"device.peak_tflops_bf16",
        "the same in bf16 (oneDNN where built, else emulated through fp32); never below what the bf16 products "
        "below reached"},
       {"device.memory_bandwidth_gbs",
        "the AdamW update of one GPT-2-small block's parameters (7.1M), 32 bytes each, median of 3 passes of 7, every "
        "rank at once, slowest rank"},
       {"device.kernel_bandwidth_gbs",
        "one block's LayerNorms, GELU and bias gradients (4 x 256 tokens, 768 channels), forward and backward, "
        "counted as the planner counts them (3 x the block's activation records), median of 3 passes of 7, slowest "
        "rank"},
       {"device.launch_overhead_us",
        "2000 empty kernels queued back to back, one fence, per kernel; median of 7, slowest rank"},
       {"intra_node.bandwidth_gbs",
        "a 64 MiB all-reduce through the comm layer as ring bus bandwidth; " + intra_how(0)},
       {"intra_node.latency_us", groups.empty() ? "a one-float all-reduce over all ranks, per ring step"
                                                : "a one-float all-reduce, per ring step; the median over the same "
                                                  "group sizes"},
       {"intra_node.all_gather_gbs", "the same for a 64 MiB all-gather (the gathered buffer): " + intra_how(1)},
       {"intra_node.reduce_scatter_gbs", "a 64 MiB reduce-scatter (the scattered buffer): " + intra_how(2)},
       {"intra_node.p2p_gbs",
        "a ring exchange, 64 MiB sent to the next rank and received from the one before: " + intra_how(3)},
       {"inter_node.bandwidth_gbs",
        one_node ? "one node: the intra-node figures (no link between nodes to measure)"
                 : "the same collectives over all " + std::to_string(size) + " ranks, which span nodes"},
       {"inter_node.latency_us",
        one_node ? "one node: the intra-node figure" : "the one-float all-reduce over all ranks"},
       {"efficiency.compute",
        "a GPT-2-small block's 12 Linear products (1024 rows, fp32), median of 3 passes of 7, slowest "
        "rank, over peak_tflops_fp32 (gemm_large_fp32; the rate of what no shape class covers)"},
       {"efficiency.network", "1: the rates above are measured"},
       {"efficiency.attention",
        "causal attention forward + backward (4 x 256 tokens, 768 channels, 12 heads), "
        "median of 3 passes of 7, slowest rank, over peak_tflops_fp32"},
       {"efficiency.overlap",
        "a 64 MiB all-reduce hidden behind matrix products (with the progress thread): the fraction of the shorter "
        "that hides, every run started on all ranks together, median of 3 passes of 7"},
       {"efficiency.gemm_small_fp32",
        "shape classes by a product's smallest dimension, < 128, < 384, larger: the block's 12 products at 64, "
        "192 and 1024 rows (768 channels), the classes in turn, median of 3 passes of 7, slowest rank, over the "
        "precision's peak"},
       {"efficiency.gemm_small_bf16", "the same products in bf16 (bf16 inputs, fp32 results), over peak_tflops_bf16"}});
  return result;
}

}  // namespace ndmini
