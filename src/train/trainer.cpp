// SPDX-License-Identifier: BSD-3-Clause
#include "train/trainer.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <type_traits>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "kernels/kernels.hpp"
#include "mesh/mesh.hpp"
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

// AdamW state, in the same layout as this rank's parameter shard.
struct AdamW {
  View1D exp_avg, exp_avg_sq;
  explicit AdamW(std::size_t n) : exp_avg("ndmini::exp_avg", n), exp_avg_sq("ndmini::exp_avg_sq", n) {}

  void step(GPT& model, const TrainConfig& t, double lr, double grad_scale, std::int64_t step_number) {
    const kernels::AdamWStep st{static_cast<real>(lr),
                                0.9f,
                                0.95f,
                                1e-8f,
                                static_cast<real>(t.weight_decay),
                                static_cast<real>(grad_scale),
                                static_cast<int>(step_number)};
    for (const auto& piece : model.store().pieces()) {
      auto slice = [&](const View1D& buf) { return Slice1D(buf.data() + piece.shard_offset, piece.length); };
      kernels::adamw_update(slice(model.param_buffer()), slice(model.grad_buffer()), slice(exp_avg), slice(exp_avg_sq),
                            st, model.params()[piece.param].decay);
    }
  }
};

// Calls f(piece, block) for every global block of every parameter piece this rank holds.
template <class F>
void for_each_block(const GPT& model, F&& f) {
  const ParamStore& store = model.store();
  for (const auto& piece : store.pieces()) {
    const ParamInfo& p = model.params()[piece.param];
    for (const auto& block :
         global_blocks(p, store.layout().tp_rank, piece.local_begin, piece.local_begin + piece.length))
      f(piece, block);
  }
}

// Host copies of the state a checkpoint holds, and the slabs naming each
// rank's blocks of the global tensors.
struct CheckpointState {
  View1D::HostMirror params, exp_avg, exp_avg_sq;
  std::vector<io::TensorSlab> slabs;

  CheckpointState(const GPT& model, const AdamW& opt)
      : params(Kokkos::create_mirror_view(model.param_buffer())),
        exp_avg(Kokkos::create_mirror_view(opt.exp_avg)),
        exp_avg_sq(Kokkos::create_mirror_view(opt.exp_avg_sq)) {
    for_each_block(model, [&](const ParamStore::Piece& piece, const GlobalBlock& block) {
      const ParamInfo& p = model.params()[piece.param];
      std::vector<std::uint64_t> shape(p.global_shape.begin(), p.global_shape.end());
      const std::size_t at = piece.shard_offset + (block.local_begin - piece.local_begin);
      const bool replica = model.store().is_replica(piece);
      slabs.push_back({"model/" + p.name, shape, block.offset, block.count, params.data() + at, replica});
      slabs.push_back({"optimizer/exp_avg/" + p.name, shape, block.offset, block.count, exp_avg.data() + at, replica});
      slabs.push_back(
          {"optimizer/exp_avg_sq/" + p.name, shape, block.offset, block.count, exp_avg_sq.data() + at, replica});
    });
    // Every rank names every tensor, with an empty block where its FSDP shard
    // holds none of it: the HDF5 calls are collective.
    std::set<std::string> named;
    for (const auto& slab : slabs) named.insert(slab.name);
    for (const auto& p : model.params()) {
      if (named.count("model/" + p.name)) continue;
      std::vector<std::uint64_t> shape(p.global_shape.begin(), p.global_shape.end()), zero(shape.size(), 0);
      for (const char* prefix : {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"})
        slabs.push_back({prefix + p.name, shape, zero, zero, params.data(), false});
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

// Every global tensor assembled on every rank from the owners' blocks of
// `buffer` (parameters or gradients): zeros plus one owner per element, so
// the sum over the world is exact.
std::map<std::string, std::vector<float>> gather_global(const GPT& model, const View1D& buffer, MPI_Comm world) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), buffer);
  std::map<std::string, std::vector<float>> out;
  for (const auto& p : model.params()) {
    std::size_t n = 1;
    for (auto d : p.global_shape) n *= static_cast<std::size_t>(d);
    out[p.name].assign(n, 0.0f);
  }
  for_each_block(model, [&](const ParamStore::Piece& piece, const GlobalBlock& block) {
    if (model.store().is_replica(piece)) return;
    const ParamInfo& p = model.params()[piece.param];
    auto& global = out[p.name];
    const std::uint64_t cols = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
    const std::uint64_t ncols = block.count.size() == 2 ? block.count[1] : 1;
    const std::size_t local_cols = p.shape.size() == 2 ? p.shape[1] : 1;
    const float* src = host.data() + piece.shard_offset + (block.local_begin - piece.local_begin);
    for (std::uint64_t r = 0; r < block.count[0]; ++r) {
      const std::uint64_t g = (block.offset[0] + r) * cols + (block.offset.size() == 2 ? block.offset[1] : 0);
      for (std::uint64_t c = 0; c < ncols; ++c) global[g + c] = src[r * local_cols + c];
    }
  });
  for (auto& [name, values] : out)
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_FLOAT, MPI_SUM, world);
  return out;
}

// Squared global gradient norm: each unique element once over the norm group.
double grad_norm_squared(const GPT& model, Communicator& norm_group) {
  const ParamStore& store = model.store();
  double local = 0;
  if (store.layout().tp_size == 1) {
    local = kernels::sum_squares(model.grad_buffer());  // padding is zero
  } else {
    for (const auto& piece : store.pieces())
      if (store.counts_in_norm(piece))
        local += kernels::sum_squares(Slice1D(model.grad_buffer().data() + piece.shard_offset, piece.length));
  }
  return norm_group.all_reduce_scalar(local);
}

// A resumed run must train the same model on the same data stream.
void check_resume_compatible(const Config& cfg, const io::CheckpointInfo& info, const std::string& where) {
  const Config saved = parse_config(info.config, where + " (config attribute)");
  auto mismatch = [&](const std::string& key, auto a, auto b) {
    if (a != b) {
      std::ostringstream os;
      os << "cannot resume from " << where << ": it was written with " << key << " = " << a << ", the deck says " << b
         << "; resume with the deck that wrote it or start a fresh run in another checkpoint.dir";
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
  int world_size = 1;
  MPI_Comm_size(comm, &world_size);
  const MeshShape shape = resolve_mesh(cfg, world_size);
  Mesh mesh(shape, comm);
  const int rank = mesh.rank();
  const bool speak = rank == 0 && !opts.quiet;

  // Hang detection for every collective of the run (comm.timeout_s); built
  // before the communicators, so the ledger names their ranks in `comm`.
  CollectiveWatchdog watchdog(comm, cfg.comm.timeout_s);
  // One communicator per axis the model uses, plus the two groups of the
  // scalar reductions; the mesh defines which ranks each holds.
  // Device buffers go through NCCL where this build has it; host buffers through MPI.
  const auto backend = nccl_available() && !std::is_same_v<MemSpace, HostSpace> ? Communicator::Backend::nccl
                                                                                : Communicator::Backend::mpi;
  Communicator tp(mesh.axis(Axis::tp), "tp", backend);
  Communicator dp_replicate(mesh.axis(Axis::dp_replicate), "dp_replicate", backend);
  Communicator dp_shard(mesh.fsdp(), "dp_shard", backend);
  Communicator batch(mesh.batch(), "batch");
  Communicator norm(mesh.norm(), "norm");
  const std::vector<Communicator*> comms = {&dp_replicate, &dp_shard, &tp, &batch, &norm};

  const auto& t = cfg.train;
  const int T = cfg.model.seq_len;
  const int mb = t.micro_batch;
  // Every data-parallel rank takes its contiguous share of the global batch.
  const int dp_size = mesh.degree(Axis::dp_replicate) * mesh.degree(Axis::dp_shard);
  const int dp_index = mesh.coord(Axis::dp_replicate) * mesh.degree(Axis::dp_shard) + mesh.coord(Axis::dp_shard);
  const int local_batch = t.global_batch / dp_size;
  const int accum = local_batch / mb;
  const double tokens_per_step = static_cast<double>(t.global_batch) * T;

  // Reading the data is rank-local: agree on the outcome, so one rank's
  // missing file stops every rank with its message instead of a hang.
  std::unique_ptr<DataSource> data;
  agree_on_errors(comm, [&] { data = make_data_source(cfg); });
  ModelParallel par;
  par.tp = &tp;
  par.sequence_parallel = cfg.parallel.sequence_parallel;
  par.data.fsdp = &dp_shard;
  par.data.dp_replicate = &dp_replicate;
  par.data.reshard_after_forward = cfg.parallel.reshard_after_forward;
  GPT model(cfg.model, mb, par);
  model.init(t.seed);
  AdamW opt(model.param_buffer().extent(0));
  CheckpointState ckpt(model, opt);
  const std::string layout = shape.str();
  double io_ms = 0;

  auto save = [&](std::int64_t step) {
    const auto t0 = Clock::now();
    ckpt.from_device(model, opt);
    io::CheckpointInfo info{step, static_cast<std::int64_t>(step * tokens_per_step), t.seed, cfg.toml, layout};
    io::save_checkpoint(comm, cfg.checkpoint.dir, info, ckpt.slabs, cfg.checkpoint.keep);
    io_ms += ms_since(t0);
    if (speak)
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
    if (speak)
      std::printf("checkpoint: resumed from %s/%s at step %lld (written by %s)\n", cfg.checkpoint.dir.c_str(),
                  io::checkpoint_dirname(info.step).c_str(), static_cast<long long>(start), info.layout.c_str());
  }

  // Opened after a resume succeeded, so a failed resume leaves the old file alone.
  std::unique_ptr<MetricsWriter> metrics_file;
  agree_on_errors(comm, [&] { metrics_file = std::make_unique<MetricsWriter>(rank == 0 ? opts.metrics_path : ""); });
  MetricsWriter& metrics = *metrics_file;

  TrainResult result;
  result.first_step = start;
  const char* peak_source = "given in the deck (perf.peak_gflops)";
  result.peak_flops = cfg.perf.peak_gflops * 1e9;
  if (result.peak_flops <= 0) {
    // Every rank calibrates its own core; the fastest sets the peak, so a
    // calibration slowed by a busy core cannot flatter the MFU.
    result.peak_flops = calibrate_gemm_flops();
    MPI_Allreduce(MPI_IN_PLACE, &result.peak_flops, 1, MPI_DOUBLE, MPI_MAX, comm);
    peak_source = "measured (1024^3 SGEMM calibration, fastest rank)";
  }
  const double flops_per_token = gpt_flops_per_token(cfg.model);
  const std::int64_t state_bytes =
      static_cast<std::int64_t>(model.store().persistent_bytes() + 2 * opt.exp_avg.extent(0) * sizeof(real));
  const std::int64_t mem_bytes = state_bytes + gpt_activation_bytes(cfg.model, mb) / shape.degree_of(Axis::tp);

  if (speak) {
    std::printf("ndmini %s | Kokkos %d.%d.%d %s | mesh %s | ranks/node %d | params %lld | %.3g FLOP/token\n",
                NDMINI_VERSION, KOKKOS_VERSION / 10000, KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100,
                ExecSpace::name(), layout.c_str(), mesh.ranks_per_node(),
                static_cast<long long>(gpt_param_count(cfg.model)), flops_per_token);
    std::printf("data: %s | steps %d | global batch %d x %d tokens | %d data-parallel ranks x %d micro-batches of %d\n",
                data->describe().c_str(), t.steps, t.global_batch, T, dp_size, accum, mb);
    std::printf("peak: %.1f GFLOP/s per rank, %s\n", result.peak_flops / 1e9, peak_source);
    if (opts.show_mesh) std::printf("%s", describe_mesh(shape, true).c_str());
    std::fflush(stdout);
  }
  if (cfg.checkpoint.at_start && !opts.resume) save(0);

  HostTokenView h_in("ndmini::inputs_host", static_cast<std::size_t>(mb) * T);
  HostTokenView h_tg("ndmini::targets_host", static_cast<std::size_t>(mb) * T);
  TokenView d_in("ndmini::inputs", h_in.extent(0)), d_tg("ndmini::targets", h_tg.extent(0));
  std::vector<double> step_times;
  std::map<std::string, std::vector<double>> comm_ms, exposed_ms;  // per communicator, per step

  for (std::int64_t step = start; step < t.steps; ++step) {
    for (auto* c : comms) c->reset_stats();
    MPI_Barrier(comm);  // steps start together, so per-step times compare across ranks
    const auto t0 = Clock::now();
    double loss_sum = 0;
    for (int m = 0; m < accum; ++m) {
      data->fill(step, dp_index * local_batch + m * mb, mb, h_in.data(), h_tg.data());
      Kokkos::deep_copy(d_in, h_in);
      Kokkos::deep_copy(d_tg, h_tg);
      loss_sum += model.forward_backward(d_in, d_tg, static_cast<real>(1.0 / tokens_per_step), m + 1 == accum);
    }
    model.store().finish_grads();
    const double loss = batch.all_reduce_scalar(loss_sum) / tokens_per_step;
    const double grad_norm = std::sqrt(grad_norm_squared(model, norm));
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      std::ostringstream os;
      os << "non-finite " << (std::isfinite(loss) ? "gradient norm" : "loss") << " at step " << step << " (loss "
         << loss << ", grad norm " << grad_norm
         << "); lower train.lr or set train.grad_clip, then resume from the last checkpoint";
      throw Error(os.str());
    }
    if (opts.capture != nullptr && step == start)
      opts.capture->first_step_grads = gather_global(model, model.grad_buffer(), comm);
    const double clip = (t.grad_clip > 0 && grad_norm > t.grad_clip) ? t.grad_clip / (grad_norm + 1e-6) : 1.0;
    const double lr = learning_rate(t, step);
    opt.step(model, t, lr, clip, step + 1);
    Kokkos::fence();
    double step_ms = ms_since(t0);
    MPI_Allreduce(MPI_IN_PLACE, &step_ms, 1, MPI_DOUBLE, MPI_MAX, comm);
    step_times.push_back(step_ms);
    result.losses.push_back(loss);
    double exposed_total = 0;
    std::vector<CommStats> stats;
    for (auto* c : comms) {
      CommStats s = c->stats();
      double times[2] = {s.ms, s.exposed_ms};
      MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, comm);
      s.ms = times[0];
      s.exposed_ms = times[1];
      comm_ms[c->name()].push_back(s.ms);
      exposed_ms[c->name()].push_back(s.exposed_ms);
      exposed_total += s.exposed_ms;
      stats.push_back(s);
    }

    if (rank == 0 && (step % t.log_every == 0 || step + 1 == t.steps)) {
      StepRecord r;
      r.step = step;
      r.loss = loss;
      r.lr = lr;
      r.grad_norm = grad_norm;
      r.step_ms = step_ms;
      r.tokens_per_s = tokens_per_step / (step_ms / 1e3);
      r.mfu = flops_per_token * r.tokens_per_s / (result.peak_flops * world_size);
      r.exposed_comm_ms = exposed_total;
      r.mem_bytes = mem_bytes;
      for (std::size_t k = 0; k < comms.size(); ++k) r.comm.push_back({comms[k]->name(), stats[k]});
      if (!opts.quiet) std::printf("%s\n", progress_line(r).c_str());
      std::fflush(stdout);
      metrics.step(r);
    }
    if (cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0) save(step + 1);
  }
  if (opts.capture != nullptr) opts.capture->final_params = gather_global(model, model.param_buffer(), comm);

  // The first step pays for first-touch page faults and BLAS warm-up: leave
  // it out of the figures when there are others.
  const std::size_t skip = step_times.size() > 1 ? 1 : 0;
  std::vector<double> timed(step_times.begin() + skip, step_times.end());
  result.median_step_ms = median(timed);
  result.tokens_per_s = result.median_step_ms > 0 ? tokens_per_step / (result.median_step_ms / 1e3) : 0;
  result.mfu = flops_per_token * result.tokens_per_s / (result.peak_flops * world_size);

  if (speak) {
    const double rss = static_cast<double>(peak_rss_bytes());
    double exposed_median_total = 0;
    std::printf("PERFORMANCE\n");
    std::printf("  ranks              %d (%d per node)\n", world_size, mesh.ranks_per_node());
    std::printf("  mesh               %s\n", layout.c_str());
    std::printf("  steps timed        %zu (medians; first step excluded as warm-up; times are the slowest rank's)\n",
                timed.size());
    std::printf("  time/step          %.1f ms\n", result.median_step_ms);
    for (auto* c : comms) {
      const std::vector<double> e(exposed_ms[c->name()].begin() + skip, exposed_ms[c->name()].end());
      const std::vector<double> all(comm_ms[c->name()].begin() + skip, comm_ms[c->name()].end());
      exposed_median_total += median(e);
      std::printf("    exposed comm     %7.1f ms  %-13s (%.1f ms in flight, summed over its requests)\n", median(e),
                  c->name().c_str(), median(all));
    }
    std::printf("    compute          %.1f ms\n", result.median_step_ms - exposed_median_total);
    std::printf("    bubble           0.0 ms (no pipeline)\n");
    std::printf("    I/O              %.1f ms in total (checkpoints)\n", io_ms);
    std::printf("  tokens/s           %.0f\n", result.tokens_per_s);
    std::printf("  tokens/s/rank      %.0f\n", result.tokens_per_s / world_size);
    std::printf("  MFU                %.1f%% of %.1f GFLOP/s per rank (%s)\n", 100 * result.mfu,
                result.peak_flops / 1e9, peak_source);
    std::printf("  memory/rank        %.1f MiB model state, %.1f MiB with activations, %.1f MiB peak RSS\n",
                state_bytes / 1048576.0, mem_bytes / 1048576.0, rss / 1048576.0);
    std::fflush(stdout);
  }
  if (rank == 0) {
    nlohmann::json s = {{"summary", true},
                        {"steps", static_cast<std::int64_t>(step_times.size())},
                        {"ranks", world_size},
                        {"mesh", layout},
                        {"median_step_ms", result.median_step_ms},
                        {"tokens_per_s", result.tokens_per_s},
                        {"tokens_per_s_per_rank", result.tokens_per_s / world_size},
                        {"mfu", result.mfu},
                        {"peak_flops", result.peak_flops},
                        {"peak_source", peak_source},
                        {"io_ms", io_ms},
                        {"state_bytes", state_bytes},
                        {"mem_bytes", mem_bytes},
                        {"peak_rss_bytes", static_cast<std::int64_t>(peak_rss_bytes())},
                        {"final_loss", result.losses.empty() ? 0.0 : result.losses.back()}};
    metrics.summary(s.dump());
  }
  return result;
}

}  // namespace ndmini
