// SPDX-License-Identifier: BSD-3-Clause
#include "train/trainer.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "kernels/kernels.hpp"
#include "model/gpt.hpp"
#include "train/data.hpp"
#include "train/metrics.hpp"

namespace ndmini {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string layout_string(const ParallelConfig& p) {
  return "pp=" + std::to_string(p.pp) + " dp_replicate=" + std::to_string(p.dp_replicate) +
         " dp_shard=" + std::to_string(p.dp_shard) + " cp=" + std::to_string(p.cp) + " tp=" + std::to_string(p.tp);
}

// AdamW state, in the same flat layout as the parameters.
struct AdamW {
  View1D exp_avg, exp_avg_sq;
  explicit AdamW(std::size_t n) : exp_avg("ndmini::exp_avg", n), exp_avg_sq("ndmini::exp_avg_sq", n) {}

  void step(GPT& model, const TrainConfig& t, double lr, double grad_scale, std::int64_t step_number) {
    const kernels::AdamWStep st{static_cast<real>(lr), 0.9f,          0.95f, 1e-8f, static_cast<real>(t.weight_decay),
                                static_cast<real>(grad_scale), static_cast<int>(step_number)};
    for (const auto& p : model.params()) {
      auto slice = [&](const View1D& buf) { return Slice1D(buf.data() + p.offset, p.size); };
      kernels::adamw_update(slice(model.param_buffer()), slice(model.grad_buffer()), slice(exp_avg),
                            slice(exp_avg_sq), st, p.decay);
    }
  }
};

// Host copies of the state a checkpoint holds, and the slabs naming them.
struct CheckpointState {
  View1D::HostMirror params, exp_avg, exp_avg_sq;
  std::vector<io::TensorSlab> slabs;

  CheckpointState(const GPT& model, const AdamW& opt)
      : params(Kokkos::create_mirror_view(model.param_buffer())),
        exp_avg(Kokkos::create_mirror_view(opt.exp_avg)),
        exp_avg_sq(Kokkos::create_mirror_view(opt.exp_avg_sq)) {
    for (const auto& p : model.params()) {
      std::vector<std::uint64_t> shape(p.shape.begin(), p.shape.end());
      std::vector<std::uint64_t> zero(shape.size(), 0);
      slabs.push_back({"model/" + p.name, shape, zero, shape, params.data() + p.offset});
      slabs.push_back({"optimizer/exp_avg/" + p.name, shape, zero, shape, exp_avg.data() + p.offset});
      slabs.push_back({"optimizer/exp_avg_sq/" + p.name, shape, zero, shape, exp_avg_sq.data() + p.offset});
    }
  }
  void from_device(const GPT& model, const AdamW& opt) {
    Kokkos::deep_copy(params, model.param_buffer());
    Kokkos::deep_copy(exp_avg, opt.exp_avg);
    Kokkos::deep_copy(exp_avg_sq, opt.exp_avg_sq);
  }
  void to_device(const GPT& model, const AdamW& opt) {
    Kokkos::deep_copy(model.param_buffer(), params);
    Kokkos::deep_copy(opt.exp_avg, exp_avg);
    Kokkos::deep_copy(opt.exp_avg_sq, exp_avg_sq);
  }
};

// A resumed run must train the same model on the same data stream.
void check_resume_compatible(const Config& cfg, const io::CheckpointInfo& info, const std::string& where) {
  const Config saved = parse_config(info.config, where + " (config attribute)");
  auto mismatch = [&](const std::string& key, auto a, auto b) {
    if (a != b) {
      std::ostringstream os;
      os << "cannot resume from " << where << ": it was written with " << key << " = " << a << ", the deck says "
         << b << "; resume with the deck that wrote it or start a fresh run in another checkpoint.dir";
      throw Error(os.str());
    }
  };
  mismatch("model.layers", saved.model.layers, cfg.model.layers);
  mismatch("model.channels", saved.model.channels, cfg.model.channels);
  mismatch("model.heads", saved.model.heads, cfg.model.heads);
  mismatch("model.vocab", saved.model.vocab, cfg.model.vocab);
  mismatch("model.seq_len", saved.model.seq_len, cfg.model.seq_len);
  mismatch("train.seed", saved.train.seed, cfg.train.seed);
  mismatch("train.global_batch", saved.train.global_batch, cfg.train.global_batch);
  mismatch("data.source", saved.data.source, cfg.data.source);
}

}  // namespace

double learning_rate(const TrainConfig& t, std::int64_t step) {
  if (step < t.warmup_steps) return t.lr * static_cast<double>(step + 1) / t.warmup_steps;
  const double span = std::max(1, t.steps - 1 - t.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / span);
  return t.min_lr + 0.5 * (1 + std::cos(M_PI * progress)) * (t.lr - t.min_lr);
}

double calibrate_gemm_flops() {
  // A square SGEMM the size of the larger model GEMMs; best of a few runs
  // after one warm-up, about 0.2 s in total at 100 GFLOP/s. Best, not
  // median: a busy core can only make a run slower.
  const int n = 1024;
  View2D a("ndmini::calib_a", n, n), b("ndmini::calib_b", n, n), c("ndmini::calib_c", n, n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  double best = 0;
  for (int rep = 0; rep < 12; ++rep) {
    Kokkos::fence();
    const auto t0 = Clock::now();
    KokkosBlas::gemm("N", "T", 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
    const double s = ms_since(t0) / 1e3;
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

TrainResult train(const Config& cfg, const TrainOptions& opts, MPI_Comm comm) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  require(world == 1, "ndmini " NDMINI_VERSION " trains on one MPI rank for now, got " + std::to_string(world) +
                          "; data, fully sharded and tensor parallelism arrive with the mesh. Run with mpiexec -n 1.");
  const auto& t = cfg.train;
  const int T = cfg.model.seq_len;
  const int mb = t.micro_batch;
  const int accum = accumulation_steps(cfg);
  const double tokens_per_step = static_cast<double>(t.global_batch) * T;

  auto data = make_data_source(cfg);
  GPT model(cfg.model, mb);
  model.init(t.seed);
  AdamW opt(model.param_buffer().extent(0));
  CheckpointState ckpt(model, opt);
  MetricsWriter metrics(rank == 0 ? opts.metrics_path : "");
  const std::string layout = layout_string(cfg.parallel);
  double io_ms = 0;

  auto save = [&](std::int64_t step) {
    const auto t0 = Clock::now();
    ckpt.from_device(model, opt);
    io::CheckpointInfo info{step, static_cast<std::int64_t>(step * tokens_per_step), t.seed, cfg.toml, layout};
    io::save_checkpoint(comm, cfg.checkpoint.dir, info, ckpt.slabs, cfg.checkpoint.keep);
    io_ms += ms_since(t0);
    if (rank == 0)
      std::printf("checkpoint: saved step %lld to %s/%s (%.0f ms)\n", static_cast<long long>(step),
                  cfg.checkpoint.dir.c_str(), io::checkpoint_dirname(step).c_str(), ms_since(t0));
  };

  std::int64_t start = 0;
  if (opts.resume) {
    const auto t0 = Clock::now();
    const auto info = io::load_checkpoint(comm, cfg.checkpoint.dir, opts.resume_step, ckpt.slabs);
    check_resume_compatible(cfg, info, cfg.checkpoint.dir + "/" + io::checkpoint_dirname(info.step));
    ckpt.to_device(model, opt);
    start = info.step;
    io_ms += ms_since(t0);
    if (rank == 0)
      std::printf("checkpoint: resumed from %s/%s at step %lld\n", cfg.checkpoint.dir.c_str(),
                  io::checkpoint_dirname(info.step).c_str(), static_cast<long long>(start));
  }

  TrainResult result;
  result.first_step = start;
  const char* peak_source = "given in the deck (perf.peak_gflops)";
  result.peak_flops = cfg.perf.peak_gflops * 1e9;
  if (result.peak_flops <= 0) {
    result.peak_flops = calibrate_gemm_flops();
    peak_source = "measured (1024^3 SGEMM calibration)";
  }
  const double flops_per_token = gpt_flops_per_token(cfg.model);
  const std::int64_t mem_bytes = gpt_state_bytes(cfg.model) + gpt_activation_bytes(cfg.model, mb);

  if (rank == 0) {
    std::printf("ndmini %s | Kokkos %d.%d.%d %s | mesh %s | ranks/node 1 | params %lld | %.3g FLOP/token\n",
                NDMINI_VERSION, KOKKOS_VERSION / 10000, KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100,
                ExecSpace::name(), layout.c_str(), static_cast<long long>(gpt_param_count(cfg.model)),
                flops_per_token);
    std::printf("data: %s | steps %d | global batch %d x %d tokens | micro-batch %d (%d accumulation steps)\n",
                data->describe().c_str(), t.steps, t.global_batch, T, mb, accum);
    std::printf("peak: %.1f GFLOP/s per rank, %s\n", result.peak_flops / 1e9, peak_source);
    std::fflush(stdout);
  }
  if (cfg.checkpoint.at_start && !opts.resume) save(0);

  HostTokenView h_in("ndmini::inputs_host", static_cast<std::size_t>(mb) * T);
  HostTokenView h_tg("ndmini::targets_host", static_cast<std::size_t>(mb) * T);
  TokenView d_in("ndmini::inputs", h_in.extent(0)), d_tg("ndmini::targets", h_tg.extent(0));
  std::vector<double> step_times;

  for (std::int64_t step = start; step < t.steps; ++step) {
    const auto t0 = Clock::now();
    double loss_sum = 0;
    for (int m = 0; m < accum; ++m) {
      data->fill(step, m * mb, mb, h_in.data(), h_tg.data());
      Kokkos::deep_copy(d_in, h_in);
      Kokkos::deep_copy(d_tg, h_tg);
      loss_sum += model.forward_backward(d_in, d_tg, static_cast<real>(1.0 / tokens_per_step));
    }
    const double loss = loss_sum / tokens_per_step;
    const double grad_norm = std::sqrt(kernels::sum_squares(model.grad_buffer()));
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      std::ostringstream os;
      os << "non-finite " << (std::isfinite(loss) ? "gradient norm" : "loss") << " at step " << step
         << " (loss " << loss << ", grad norm " << grad_norm
         << "); lower train.lr or set train.grad_clip, then resume from the last checkpoint";
      throw Error(os.str());
    }
    const double clip = (t.grad_clip > 0 && grad_norm > t.grad_clip) ? t.grad_clip / (grad_norm + 1e-6) : 1.0;
    const double lr = learning_rate(t, step);
    opt.step(model, t, lr, clip, step + 1);
    Kokkos::fence();
    const double step_ms = ms_since(t0);
    step_times.push_back(step_ms);
    result.losses.push_back(loss);

    if (rank == 0 && (step % t.log_every == 0 || step + 1 == t.steps)) {
      StepRecord r;
      r.step = step;
      r.loss = loss;
      r.lr = lr;
      r.grad_norm = grad_norm;
      r.step_ms = step_ms;
      r.tokens_per_s = tokens_per_step / (step_ms / 1e3);
      r.mfu = flops_per_token * r.tokens_per_s / result.peak_flops;
      r.mem_bytes = mem_bytes;
      std::printf("%s\n", progress_line(r).c_str());
      std::fflush(stdout);
      metrics.step(r);
    }
    if (cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0) save(step + 1);
  }

  // The first step pays for first-touch page faults and BLAS warm-up: leave
  // it out of the figures when there are others.
  std::vector<double> timed(step_times.begin() + (step_times.size() > 1 ? 1 : 0), step_times.end());
  result.median_step_ms = median(timed);
  result.tokens_per_s = result.median_step_ms > 0 ? tokens_per_step / (result.median_step_ms / 1e3) : 0;
  result.mfu = flops_per_token * result.tokens_per_s / result.peak_flops;

  if (rank == 0) {
    const double rss = static_cast<double>(peak_rss_bytes());
    std::printf("PERFORMANCE\n");
    std::printf("  ranks              %d\n", world);
    std::printf("  mesh               %s\n", layout.c_str());
    std::printf("  steps timed        %zu (median; first step excluded as warm-up)\n", timed.size());
    std::printf("  time/step          %.1f ms\n", result.median_step_ms);
    std::printf("    compute          %.1f ms\n", result.median_step_ms);
    std::printf("    exposed comm     0.0 ms (one rank: no axis communicates)\n");
    std::printf("    bubble           0.0 ms\n");
    std::printf("    I/O              %.1f ms in total (checkpoints)\n", io_ms);
    std::printf("  tokens/s           %.0f\n", result.tokens_per_s);
    std::printf("  tokens/s/rank      %.0f\n", result.tokens_per_s / world);
    std::printf("  MFU                %.1f%% of %.1f GFLOP/s (%s)\n", 100 * result.mfu, result.peak_flops / 1e9,
                peak_source);
    std::printf("  memory             %.1f MiB model state + activations, %.1f MiB peak RSS\n",
                mem_bytes / 1048576.0, rss / 1048576.0);
    std::fflush(stdout);
    nlohmann::json s = {{"summary", true},
                        {"steps", static_cast<std::int64_t>(step_times.size())},
                        {"median_step_ms", result.median_step_ms},
                        {"tokens_per_s", result.tokens_per_s},
                        {"tokens_per_s_per_rank", result.tokens_per_s / world},
                        {"mfu", result.mfu},
                        {"peak_flops", result.peak_flops},
                        {"peak_source", peak_source},
                        {"io_ms", io_ms},
                        {"mem_bytes", mem_bytes},
                        {"peak_rss_bytes", static_cast<std::int64_t>(rss)},
                        {"final_loss", result.losses.empty() ? 0.0 : result.losses.back()}};
    metrics.summary(s.dump());
  }
  return result;
}

}  // namespace ndmini
