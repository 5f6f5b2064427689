// SPDX-License-Identifier: BSD-3-Clause
#include "train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>

#include "comm/communicator.hpp"
#include "comm/mpi_calls.hpp"
#include "comm/progress.hpp"
#include "core/error.hpp"
#include "core/profiling.hpp"
#include "core/signals.hpp"
#include "core/timer.hpp"
#include "fault/fault.hpp"
#include "io/checkpoint.hpp"
#include "model/gpt.hpp"
#include "parallel/context.hpp"
#include "parallel/pipeline/pipeline.hpp"
#include "parallel/stage_runtime.hpp"
#include "train/budget.hpp"
#include "train/calibration.hpp"
#include "train/checkpoint_state.hpp"
#include "train/data.hpp"
#include "train/layout.hpp"
#include "train/metrics.hpp"
#include "train/optimizer.hpp"
#include "train/report.hpp"
#include "train/step_check.hpp"

namespace ndmini {
namespace {

// The groups the model on this rank is split over.
ModelParallel model_parallel(ParallelContext& ctx, const Config& cfg, const RunLayout& layout) {
  ModelParallel par;
  par.tp = &ctx.tp();
  par.sequence_parallel = cfg.parallel.sequence_parallel;
  par.cp = &ctx.cp();
  par.data.fsdp = &ctx.fsdp();
  par.data.dp_replicate = &ctx.dp_replicate();
  par.data.reshard_after_forward = cfg.parallel.reshard_after_forward;
  par.tied_embedding = ctx.tied_embedding();
  par.pp = layout.split.pp;
  par.stage = ctx.coord(Axis::pp);
  par.virtual_stages = layout.split.virtual_stages;
  return par;
}

// The tokens of one micro-batch on this rank: its data-parallel share of the
// global batch, and of each sequence the tokens its cp rank holds.
class MicroBatchFeed {
 public:
  MicroBatchFeed(const DataSource& data, const CpLayout& cp, int micro_batch, int first_sequence)
      : data_(data),
        cp_(cp),
        micro_batch_(micro_batch),
        first_sequence_(first_sequence),
        full_in_("ndmini::inputs_full", static_cast<std::size_t>(micro_batch) * cp.seq_len),
        full_tg_("ndmini::targets_full", full_in_.extent(0)),
        h_in_("ndmini::inputs_host", static_cast<std::size_t>(micro_batch) * cp.local_len()),
        h_tg_("ndmini::targets_host", h_in_.extent(0)),
        in_("ndmini::inputs", h_in_.extent(0)),
        tg_("ndmini::targets", h_tg_.extent(0)) {}

  // Micro-batch `index` of `step`, unless it is loaded already.
  void load(std::int64_t step, int index) {
    if (step == step_ && index == index_) return;
    data_.fill(step, first_sequence_ + index * micro_batch_, micro_batch_, full_in_.data(), full_tg_.data());
    const int T = cp_.seq_len, Tl = cp_.local_len();
    for (int b = 0; b < micro_batch_; ++b)
      for (int t = 0; t < Tl; ++t) {
        const std::size_t from = static_cast<std::size_t>(b) * T + cp_.position(t),
                          to = static_cast<std::size_t>(b) * Tl + t;
        h_in_(to) = full_in_(from);
        h_tg_(to) = full_tg_(from);
      }
    Kokkos::deep_copy(in_, h_in_);
    Kokkos::deep_copy(tg_, h_tg_);
    step_ = step;
    index_ = index;
  }
  ConstTokenView tokens() const { return in_; }
  ConstTokenView targets() const { return tg_; }

 private:
  const DataSource& data_;
  CpLayout cp_;
  int micro_batch_, first_sequence_;
  HostTokenView full_in_, full_tg_, h_in_, h_tg_;
  TokenView in_, tg_;
  std::int64_t step_ = -1;
  int index_ = -1;
};

// The model as the pipeline runner sees it, fed with this step's data.
// Micro-batch mb is micro-batch mb mod m of step + mb / m (m micro-batches
// per step), so one forward-only run can cover several batches (the
// validation loss); loss_scale 0: the head computes no gradient.
class TrainingStage final : public PipelineStage {
 public:
  TrainingStage(StageRuntime& model, MicroBatchFeed& feed, real loss_scale, int micro_batches)
      : model_(model), feed_(feed), loss_scale_(loss_scale), micro_batches_(micro_batches) {}
  void set_step(std::int64_t step) { step_ = step; }

  std::size_t activation_elements() const override { return model_.activation_elements(); }
  real* input_buffer(int chunk, int mb) override { return model_.input_buffer(chunk, mb); }
  double forward(int chunk, int mb, bool last) override {
    // Tokens for the embedding (chunk 0), targets for the head (the last chunk).
    const Chunk& final_chunk = model_.chunks().back();
    const bool needs_data = chunk == 0 || (final_chunk.head && chunk == final_chunk.index);
    if (needs_data) feed_.load(step_ + mb / micro_batches_, mb % micro_batches_);
    return model_.forward(chunk, mb, feed_.tokens(), feed_.targets(), loss_scale_, last);
  }
  const real* output(int chunk, int mb) override { return model_.output(chunk, mb); }
  real* output_grad_buffer(int chunk, int mb) override { return model_.output_grad_buffer(chunk, mb); }
  void backward(int chunk, int mb, real* input_grad, bool last) override {
    model_.backward(chunk, mb, input_grad, last);
  }
  void discard(int chunk, int mb) override { model_.discard(chunk, mb); }

 private:
  StageRuntime& model_;
  MicroBatchFeed& feed_;
  real loss_scale_;
  int micro_batches_;
  std::int64_t step_ = 0;
};

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& opts, MPI_Comm comm) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  const RunLayout layout = resolve_layout(cfg, world);
  // Hang detection for every collective of the run (comm.timeout_s); built
  // before the communicators, so the ledger names their ranks in `comm`.
  CollectiveWatchdog watchdog(comm, cfg.comm.timeout_s);
  // Non-blocking MPI transfers move during compute (comm.progress_poll_us).
  const MpiProgressThread progress(comm, cfg.comm.progress_poll_us);
  // Communicator creation has no non-blocking form: the watchdog's monitor
  // thread keeps its deadline.
  std::unique_ptr<ParallelContext> context;
  mpi_blocking(comm, "building the mesh's communicators",
               [&] { context = std::make_unique<ParallelContext>(layout.mesh, comm); });
  ParallelContext& ctx = *context;
  // Ranks of one pipeline stage issue the same collectives: the diagnosis compares them.
  watchdog.set_peer_group(ctx.coord(Axis::pp));
  const int rank = ctx.rank();
  const bool speak = rank == 0 && !opts.quiet;
  if (speak && world > 1 && cfg.comm.progress_poll_us > 0 && !progress.running())
    std::printf(
        "note: no progress thread (comm.progress_poll_us): this MPI library does not provide "
        "MPI_THREAD_MULTIPLE, so non-blocking transfers move only inside MPI calls\n");
  const auto& t = cfg.train;
  const double tokens_per_step = static_cast<double>(t.global_batch) * cfg.model.seq_len;
  // Before anything large is allocated: refuse what cannot fit, hold the
  // checkpoint folder (one writer; proven usable now, not at the first save).
  agree_on_errors(comm, [&] { require_memory_fits(cfg, layout, ctx.mesh().ranks_per_node()); });
  fault::FaultPlan faults;
  agree_on_errors(comm, [&] { faults = fault::FaultPlan(cfg.fault, rank, world); });
  std::unique_ptr<io::CheckpointDirLock> dir_lock;
  const bool saves = cfg.checkpoint.every > 0 || cfg.checkpoint.at_start;
  if (saves || opts.resume)
    dir_lock = std::make_unique<io::CheckpointDirLock>(comm, cfg.checkpoint.dir,
                                                       saves ? io::DirAccess::write : io::DirAccess::read,
                                                       saves ? checkpoint_bytes(cfg.model) : 0);

  // Reading the data is rank-local: agree on the outcome, so one rank's
  // missing file stops every rank with its message instead of a hang.
  DataSources sources;
  agree_on_errors(comm, [&] { sources = make_data_sources(cfg); });
  const std::unique_ptr<DataSource>& data = sources.train;
  StageRuntime model(cfg.model, t.micro_batch, model_parallel(ctx, cfg, layout), layout.recompute);
  model.init(t.seed);
  ParamStore& store = model.store();
  AdamW opt(store);
  CheckpointState ckpt(cfg.model, store, opt);
  RunSummary summary;

  auto save = [&](std::int64_t step) {
    const ProfileRegion region("ndmini::checkpoint save");
    const auto t0 = Clock::now();
    ckpt.from_device(store, opt);
    io::CheckpointInfo info{step,
                            static_cast<std::int64_t>(step * tokens_per_step),
                            t.seed,
                            cfg.toml,
                            layout.mesh.str(),
                            data->provenance()};
    io::SaveOptions save_options;
    save_options.hook = faults.save_hook();
    io::save_checkpoint(comm, cfg.checkpoint.dir, info, ckpt.slabs(), cfg.checkpoint.keep, save_options);
    summary.io_ms += ms_since(t0);
    if (speak)
      std::printf("checkpoint: saved step %lld to %s/%s (%.0f ms)\n", static_cast<long long>(step),
                  cfg.checkpoint.dir.c_str(), io::checkpoint_dirname(step).c_str(), ms_since(t0));
  };

  std::int64_t start = 0;
  if (opts.resume) {
    const ProfileRegion region("ndmini::checkpoint load");
    const auto t0 = Clock::now();
    const auto info = io::load_checkpoint(comm, cfg.checkpoint.dir, opts.resume_step, ckpt.slabs());
    const std::string where = cfg.checkpoint.dir + "/" + io::checkpoint_dirname(info.step);
    check_resume_compatible(cfg, info, where);
    const std::string data_note = check_resume_data(info.data, data->provenance(), cfg.data, where);
    if (speak && !data_note.empty()) std::printf("%s\n", data_note.c_str());
    ckpt.to_device(store, opt);
    start = info.step;
    summary.io_ms += ms_since(t0);
    if (speak)
      std::printf("checkpoint: resumed from %s/%s at step %lld (written by %s)\n", cfg.checkpoint.dir.c_str(),
                  io::checkpoint_dirname(info.step).c_str(), static_cast<long long>(start), info.layout.c_str());
  }

  // Opened after a resume succeeded, so a failed resume leaves the old file alone.
  std::unique_ptr<MetricsWriter> metrics_file;
  agree_on_errors(comm, [&] { metrics_file = std::make_unique<MetricsWriter>(rank == 0 ? opts.metrics_path : ""); });
  MetricsWriter& metrics = *metrics_file;

  summary.peak = peak_flops(cfg.perf, comm);
  const double flops_per_token = gpt_flops_per_token(cfg.model);
  const MemoryEstimate memory = estimate_memory(cfg, layout);
  summary.state_bytes = static_cast<std::int64_t>(store.persistent_bytes() + 2 * opt.exp_avg.extent(0) * sizeof(real));
  summary.mem_bytes = memory.total();
  const std::string validation = sources.validation ? "every " + std::to_string(t.eval_every) +
                                                          " steps and at the last, " + std::to_string(t.eval_batches) +
                                                          " global batch(es) of " + sources.validation->describe()
                                                    : "";
  if (speak) print_banner(cfg, layout, ctx, data->describe(), validation, summary.peak, opts.show_mesh);
  // A due save waits until the state it holds is shown sane (train/step_check.hpp).
  std::int64_t pending_save = -1;  // the step of the state to save; -1: none
  if (cfg.checkpoint.at_start && !opts.resume) pending_save = 0;
  if (speak && start >= t.steps)
    std::printf("checkpoint: step %lld is train.steps = %d; nothing left to train (raise train.steps to go on)\n",
                static_cast<long long>(start), t.steps);

  const StagePlan plan(cfg.model.layers, layout.split.pp, layout.split.virtual_stages);
  const Schedule schedule(layout.schedule, layout.split.pp, layout.split.virtual_stages, layout.micro_batches);
  summary.ideal_bubble = schedule.ideal_bubble();
  PipelineRunner runner(ctx.pp(), plan, schedule);
  const int local_batch = t.global_batch / layout.data_parallel;
  MicroBatchFeed feed(*data, model.cp_layout(), t.micro_batch, ctx.data_parallel_index() * local_batch);
  TrainingStage stage(model, feed, static_cast<real>(1.0 / tokens_per_step), layout.micro_batches);

  // The validation loss: the held-out batches 0 .. eval_batches - 1, forward
  // only (PipelineRunner::evaluate), so parameters, gradients and AdamW state
  // are untouched and training is bitwise the same with it or without it.
  std::unique_ptr<MicroBatchFeed> val_feed;
  std::unique_ptr<TrainingStage> val_stage;
  if (sources.validation) {
    val_feed = std::make_unique<MicroBatchFeed>(*sources.validation, model.cp_layout(), t.micro_batch,
                                                ctx.data_parallel_index() * local_batch);
    val_stage = std::make_unique<TrainingStage>(model, *val_feed, real(0), layout.micro_batches);
  }
  auto validation_loss = [&] {
    const ProfileRegion region("ndmini::validation loss");
    const double local = runner.evaluate(*val_stage, t.eval_batches * layout.micro_batches);
    model.end_evaluation();
    return ctx.batch().all_reduce_scalar(local) / (tokens_per_step * t.eval_batches);
  };

  TrainResult result;
  result.first_step = start;
  result.peak_flops = summary.peak.flops_per_rank;
  std::vector<StepStats> steps;
  int stop_signal = 0;  // agreed at a step boundary with steps left
  for (const auto& g : ctx.reported())
    if (g.comm != nullptr) g.comm->reset_stats();

  for (std::int64_t step = start; step < t.steps; ++step) {
    faults.at_step_start(step);
    // Before the step, outside its time and its communication figures: the
    // held-out loss of the same parameters as this step's loss.
    std::optional<double> val_loss;
    double eval_ms = 0;
    if (val_stage && (step % t.eval_every == 0 || step + 1 == t.steps)) {
      const auto e0 = Clock::now();
      val_loss = validation_loss();
      eval_ms = ms_since(e0);
      for (const auto& g : ctx.reported())
        if (g.comm != nullptr) g.comm->reset_stats();
      result.val_losses.emplace_back(step, *val_loss);
      summary.val_loss = result.val_losses.back();
      summary.eval_ms += eval_ms;
    }
    // This rank "forgets" the step's loss reduction: the others wait for it.
    if (faults.skip_collective_at(step, rank)) ctx.batch().skip_next_for_fault_injection();
    mpi_barrier(comm, "the step's start");  // steps start together, so per-step times compare across ranks
    const auto t0 = Clock::now();
    const double io_ms_before = summary.io_ms;
    const ProfileRegion region([&] { return "ndmini::step " + std::to_string(step); });
    stage.set_step(step);
    const double loss_sum = runner.run(stage);
    {
      const ProfileRegion finish("ndmini::finish gradient reductions");
      model.finish_grads();
    }
    if (faults.nan_at(step)) poison_first_gradient(model);
    const double loss = ctx.batch().all_reduce_scalar(loss_sum) / tokens_per_step;
    const double grad_norm = std::sqrt(grad_norm_squared(store, ctx.norm()));
    require_finite_step(comm, step, loss, grad_norm, loss_sum, model, cfg);
    if (pending_save >= 0) {  // the state before this step's update, now shown sane
      save(pending_save);
      pending_save = -1;
    }
    if (opts.capture != nullptr && step == start)
      opts.capture->first_step_grads = gather_global(cfg.model, store, store.shard_grads(), comm);
    const double clip = (t.grad_clip > 0 && grad_norm > t.grad_clip) ? t.grad_clip / (grad_norm + 1e-6) : 1.0;
    const double lr = learning_rate(t, step);
    {
      const ProfileRegion optimizer_region("ndmini::optimizer");
      opt.step(store, t, lr, clip, step + 1);
    }
    Kokkos::fence();
    const StepStats stats =
        reduce_step(ctx, ms_since(t0) - (summary.io_ms - io_ms_before), runner.bubble_ms(), model.take_recompute_ms());
    steps.push_back(stats);
    result.losses.push_back(loss);

    if (rank == 0 && (step % t.log_every == 0 || step + 1 == t.steps || val_loss)) {
      StepRecord r;
      r.step = step;
      r.loss = loss;
      r.val_loss = val_loss;
      r.eval_ms = eval_ms;
      r.lr = lr;
      r.grad_norm = grad_norm;
      r.step_ms = stats.step_ms;
      r.tokens_per_s = tokens_per_step / (stats.step_ms / 1e3);
      r.mfu = flops_per_token * r.tokens_per_s / (summary.peak.flops_per_rank * world);
      r.exposed_comm_ms = stats.exposed_comm_ms();
      r.bubble_ms_per_stage = stats.bubble_ms;
      r.bubble_ms = *std::max_element(stats.bubble_ms.begin(), stats.bubble_ms.end());
      r.io_ms = summary.io_ms - io_ms_before;
      r.mem_bytes = summary.mem_bytes;
      r.comm = stats.comm;
      if (!opts.quiet) std::printf("%s\n", progress_line(r).c_str());
      std::fflush(stdout);
      metrics.step(r);
    }
    // Only rank 0 writes: a full disk there stops every rank. A stop signal
    // on any rank stops every rank after this same step.
    const int agreed_signal = agree_max(comm, metrics.error(), stop_signal_received());
    if (cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0) pending_save = step + 1;
    if (agreed_signal != 0 && step + 1 < t.steps) {
      stop_signal = agreed_signal;
      pending_save = saves && cfg.checkpoint.on_signal ? step + 1 : -1;
      break;
    }
  }
  if (pending_save >= 0) {
    // The final state (or the one a signal stopped at): the loss of one more
    // batch (forward only, through the pipeline) shows it sane before it is saved.
    TrainingStage forward_only(model, feed, real(0), layout.micro_batches);  // a loss scale of 0: no backward
    forward_only.set_step(pending_save);
    double local = runner.evaluate(forward_only, layout.micro_batches);
    model.end_evaluation();
    if (faults.nan_at(pending_save)) local = std::numeric_limits<double>::quiet_NaN();
    require_finite_state(comm, pending_save, ctx.batch().all_reduce_scalar(local), local, cfg);
    save(pending_save);
  }
  if (opts.capture != nullptr) {
    opts.capture->final_params = gather_global(cfg.model, store, store.shard_params(), comm);
    int same = model.tied_wte_identical() ? 1 : 0;
    mpi_all_reduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, comm, "the tied embedding's copies");
    opts.capture->tied_wte_identical = same == 1;
  }

  // The first step pays for first-touch page faults and BLAS warm-up: leave
  // it out of the figures when there are others.
  const std::size_t skip = steps.size() > 1 ? 1 : 0;
  summary.timed.assign(steps.begin() + skip, steps.end());
  std::vector<double> step_ms;
  for (const StepStats& s : summary.timed) step_ms.push_back(s.step_ms);
  summary.median_step_ms = median(step_ms);
  summary.tokens_per_s = summary.median_step_ms > 0 ? tokens_per_step / (summary.median_step_ms / 1e3) : 0;
  summary.mfu = flops_per_token * summary.tokens_per_s / (summary.peak.flops_per_rank * world);
  summary.peak_activation_bytes.assign(layout.split.pp, 0);
  summary.peak_activation_bytes[ctx.coord(Axis::pp)] = static_cast<std::int64_t>(model.peak_activation_bytes());
  mpi_all_reduce(MPI_IN_PLACE, summary.peak_activation_bytes.data(), layout.split.pp, MPI_INT64_T, MPI_MAX, comm,
                 "the activation peaks");

  result.median_step_ms = summary.median_step_ms;
  result.tokens_per_s = summary.tokens_per_s;
  result.mfu = summary.mfu;
  result.peak_activation_bytes = static_cast<std::int64_t>(model.peak_activation_bytes());
  for (int s = 0; s < layout.split.pp; ++s) {
    std::vector<double> b;
    for (const StepStats& st : summary.timed) b.push_back(st.bubble_ms[s]);
    result.bubble_ms.push_back(median(b));
  }
  if (speak) print_performance(layout, ctx, summary);
  if (rank == 0)
    metrics.summary(summary_json(layout, ctx, summary, static_cast<std::int64_t>(steps.size()),
                                 result.losses.empty() ? std::nullopt : std::optional(result.losses.back())));
  // A signal after the last step's agreement finds the run complete.
  const int late_signal = agree_max(comm, metrics.error(), stop_signal_received());
  if (const int signal_number = stop_signal != 0 ? stop_signal : late_signal; signal_number != 0) {
    if (rank == 0)
      std::fprintf(stderr, "%s\n",
                   stop_line(cfg, signal_number, result.first_step + static_cast<std::int64_t>(result.losses.size()),
                             stop_signal != 0 ? pending_save : -1, stop_signal != 0)
                       .c_str());
    result.exit_status = signal_exit_status(signal_number);
  }
  return result;
}

}  // namespace ndmini
