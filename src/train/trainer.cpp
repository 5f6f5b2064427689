// SPDX-License-Identifier: BSD-3-Clause
#include "train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "comm/communicator.hpp"
#include "comm/mpi/mpi_calls.hpp"
#include "comm/progress.hpp"
#include "config/effective.hpp"
#include "core/error.hpp"
#include "core/profiling.hpp"
#include "core/signals.hpp"
#include "core/timer.hpp"
#include "fault/fault.hpp"
#include "io/checkpoint.hpp"
#include "model/gpt.hpp"
#include "model/moe.hpp"
#include "parallel/context.hpp"
#include "parallel/pipeline/pipeline.hpp"
#include "parallel/stage_runtime.hpp"
#include "run/budget.hpp"
#include "run/calibration.hpp"
#include "run/layout.hpp"
#include "train/capture.hpp"
#include "train/checkpoint_state.hpp"
#include "train/data.hpp"
#include "train/feed.hpp"
#include "train/metrics.hpp"
#include "train/optimizer.hpp"
#include "train/prediction.hpp"
#include "train/preflight.hpp"
#include "train/report.hpp"
#include "train/step_check.hpp"

namespace ndmini {
namespace {

// The groups the model on this rank is split over, and the chunks of its stage.
ModelParallel model_parallel(ParallelContext& ctx, const Config& cfg, const RunLayout& layout) {
  ModelParallel par;
  par.tp = &ctx.tp();
  par.sequence_parallel = layout.dims.sequence_parallel;
  par.cp = &ctx.cp();
  par.data.fsdp = &ctx.fsdp();
  par.data.expert_fsdp = ctx.expert_fsdp();
  par.data.dp_replicate = &ctx.dp_replicate();
  par.data.reshard_after_forward = cfg.parallel.reshard_after_forward;
  par.data.reduce_dtype = cfg.comm.reduce_dtype;
  par.tied_embedding = ctx.tied_embedding();
  par.chunks = layout.plan.chunks_of(ctx.coord(Axis::pp));
  par.experts = ctx.experts();
  par.moe_max_load = cfg.train.moe_max_load;
  par.moe_z_loss = cfg.train.moe_z_loss;
  par.moe_seq_aux = cfg.train.moe_seq_aux;
  return par;
}

// The deck with every key, the degrees as the layout resolved them.
Config resolved_config(const Config& cfg, const ParallelDims& dims) {
  Config resolved = cfg;
  resolved.parallel.pp = dims.pp;
  resolved.parallel.dp_replicate = dims.dp_replicate;
  resolved.parallel.dp_shard = dims.dp_shard;
  resolved.parallel.cp = dims.cp;
  resolved.parallel.tp = dims.tp;
  return resolved;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// "2026-12-04T04:09:51Z"
std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The metrics file's first record: what ran (version, commit, deck, every key
// with the degrees resolved), on how many ranks, where and when.
std::string metrics_header(const Config& resolved, const TrainOptions& opts, int world, std::int64_t first_step) {
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  for (const KeyValue& kv : key_values(resolved)) {
    // A TOML scalar or array of scalars is JSON text too; anything else stays the TOML text.
    nlohmann::json value = nlohmann::json::parse(kv.value, nullptr, false);
    config[kv.key] = value.is_discarded() ? nlohmann::ordered_json(kv.value) : nlohmann::ordered_json(value);
  }
  const nlohmann::ordered_json header = {
      {"record", "header"}, {"version", NDMINI_VERSION}, {"git_sha", opts.git_sha}, {"deck", opts.deck_path},
      {"ranks", world},     {"first_step", first_step},  {"host", host_name()},     {"start_time", utc_now()},
      {"config", config}};
  return header.dump();
}

// One line per setting of the run that differs from the checkpoint's run.
// The ones that would change what was trained are refused before
// (check_resume_compatible); the layout, the checkpoint and the fault
// sections may differ freely (a checkpoint loads into any layout).
std::vector<std::string> resume_changes(const Config& saved, const Config& cfg) {
  std::vector<std::string> lines;
  const auto before = key_values(saved), now = key_values(cfg);
  for (std::size_t i = 0; i < now.size() && i < before.size(); ++i) {
    const std::string& key = now[i].key;
    if (before[i].value == now[i].value) continue;
    if (key.rfind("parallel.", 0) == 0 || key.rfind("checkpoint.", 0) == 0 || key.rfind("fault.", 0) == 0 ||
        key.rfind("perf.", 0) == 0)
      continue;
    lines.push_back("resume: " + key + " = " + now[i].value + " (the checkpoint's run had " + before[i].value + ")");
  }
  return lines;
}

// The committed checkpoints of `dir` newer than `step`, ascending; rank 0's view.
std::vector<std::int64_t> newer_checkpoints(const std::string& dir, std::int64_t step) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (const auto s = io::step_of_dirname(entry.path().filename().string()); s && *s > step && entry.is_directory(ec))
      steps.push_back(*s);
  std::sort(steps.begin(), steps.end());
  return steps;
}

// The training run on this rank, in the order of the algorithm: the
// constructor sets up (layout, mesh, model, data, resume), step() runs one
// optimizer step, evaluate() is the one forward-only loss, finish() checks
// and saves the final state and reports.
class Trainer {
 public:
  Trainer(const Config& cfg, const TrainOptions& opts, MPI_Comm comm);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Steps are left and no stop signal was agreed on.
  bool running() const { return next_step_ < cfg_.train.steps && stop_signal_ == 0; }
  void step();
  TrainResult finish();

 private:
  // The loss sum of `batches` global batches of `stage`'s data from step
  // `first_step` on, forward only through the pipeline (a loss scale of 0:
  // parameters, gradients and AdamW state untouched): this rank's and the
  // sum over the batch group. `poison`: fault injection, this rank's is NaN.
  struct LossSum {
    double local = 0, global = 0;
  };
  LossSum evaluate(TrainingStage& stage, std::int64_t first_step, int batches, bool poison = false);
  void setup();
  void resume();
  void announce();
  void build_pipeline();
  struct StepLoss {
    double loss = 0, grad_norm = 0;
  };
  StepLoss compute_gradients(std::int64_t step);
  double update(std::int64_t step, double grad_norm);
  void agree_on_stop(std::int64_t step);
  void summarise();
  void save(std::int64_t step);
  void commit_async_save_if_written();
  void finish_async_save();
  std::optional<double> validate_if_due(std::int64_t step, double* eval_ms);
  double mfu(double tokens_per_s) const;
  void log_step(std::int64_t step, double loss, std::optional<double> val_loss, double eval_ms, double lr,
                double grad_norm, const StepStats& stats, double io_ms, const std::optional<MoeLoad>& moe_load);
  void reset_comm_stats();
  // The routing log's pass: the step of the parameters, training or forward-only.
  void name_moe_pass(std::int64_t params_step, bool evaluation) {
    moe_log_.next.step = params_step;
    moe_log_.next.evaluation = evaluation;
  }

  const Config& cfg_;
  const TrainOptions& opts_;
  const MPI_Comm comm_;
  const int world_;
  const RunLayout layout_;
  const double tokens_per_step_;
  // Hang detection for every collective of the run (comm.timeout_s); built
  // before the communicators, so the ledger names their ranks in `comm`.
  CollectiveWatchdog watchdog_;
  // Non-blocking MPI transfers move during compute (comm.progress_poll_us).
  const MpiProgressThread progress_;
  std::unique_ptr<ParallelContext> ctx_;
  int rank_ = 0;
  bool speak_ = false;  // rank 0, not quiet
  bool saves_ = false;  // the run saves checkpoints
  fault::FaultPlan faults_;
  std::unique_ptr<io::CheckpointDirLock> dir_lock_;
  DataSources sources_;
  std::unique_ptr<StageRuntime> model_;
  MoeRoutingLog moe_log_;  // tests (TrainCapture::routing, TrainOptions::replay_routing); unused otherwise
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<CheckpointState> ckpt_;
  // checkpoint.async: the save being written in the background (at most one:
  // the next waits for it), and its phase times. After ckpt_, so destroyed
  // first: its thread reads ckpt_'s copies.
  io::SaveTimes async_times_;
  std::unique_ptr<io::AsyncSave> async_save_;
  // The last one committed, kept while its thread removes the checkpoints
  // its prune dropped: destroyed (waited for) before the next save.
  std::unique_ptr<io::AsyncSave> committed_async_save_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<PipelineRunner> runner_;
  std::unique_ptr<MicroBatchFeed> feed_, val_feed_;
  std::unique_ptr<TrainingStage> stage_, val_stage_;
  std::optional<RunPrediction> prediction_;  // perf.cluster's prediction of this layout's step
  std::string effective_config_;             // every key, -1s resolved: what a checkpoint stores as `config`
  TrainResult result_;
  std::vector<StepStats> steps_;
  std::int64_t next_step_ = 0;
  // A due save waits until the state it holds is shown sane (train/step_check.hpp).
  std::int64_t pending_save_ = -1;  // the step of the state to save; -1: none
  int stop_signal_ = 0;             // agreed at a step boundary with steps left
  Clock::time_point run_start_{};   // when this run's first step began: the progress line's elapsed time
  std::size_t window_first_ = 0;    // result_.losses' first step not yet in a progress line's mean
};

int world_size(MPI_Comm comm) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  return world;
}

Trainer::Trainer(const Config& cfg, const TrainOptions& opts, MPI_Comm comm)
    : cfg_(cfg),
      opts_(opts),
      comm_(comm),
      world_(world_size(comm)),
      layout_(resolve_layout(cfg, world_)),
      tokens_per_step_(static_cast<double>(cfg.train.global_batch) * cfg.model.seq_len),
      watchdog_(comm, cfg.comm.timeout_s),
      progress_(comm, cfg.comm.progress_poll_us) {
  effective_config_ = effective_toml(resolved_config(cfg_, layout_.dims));
  setup();
  if (opts_.resume) resume();
  // Opened after a resume succeeded, so a failed resume leaves the old file alone.
  agree_on_errors(comm_, [&] { metrics_ = std::make_unique<MetricsWriter>(rank_ == 0 ? opts_.metrics_path : ""); });
  if (rank_ == 0 && !opts_.metrics_path.empty())
    metrics_->header(metrics_header(resolved_config(cfg_, layout_.dims), opts_, world_, next_step_));
  announce();
  build_pipeline();
  result_.first_step = next_step_;
  reset_comm_stats();
}

// The figures the report needs from the start, and the banner.
void Trainer::announce() {
  const auto& t = cfg_.train;
  result_.peak = peak_flops(cfg_.perf, comm_, t.precision, product_shapes(cfg_));
  result_.state_bytes =
      static_cast<std::int64_t>(model_->store().persistent_bytes() + 2 * opt_->exp_avg.extent(0) * sizeof(real));
  result_.mem_bytes = estimate_memory(cfg_, layout_).total();
  result_.staged_bytes = static_cast<std::int64_t>(ckpt_->staged_bytes());
  result_.ideal_bubble = layout_.schedule.ideal_bubble();
  const std::string validation = sources_.validation ? "every " + std::to_string(t.eval_every) +
                                                           " steps and at the last, " + std::to_string(t.eval_batches) +
                                                           " global batch(es) of " + sources_.validation->describe()
                                                     : "";
  if (speak_)
    print_banner(cfg_, layout_, *ctx_, sources_.train->describe(), validation, result_.peak, opts_.show_mesh,
                 prediction_);
  if (cfg_.checkpoint.at_start && !opts_.resume) pending_save_ = 0;
  if (speak_ && next_step_ >= t.steps)
    std::printf("checkpoint: step %lld is train.steps = %d; nothing left to train (raise train.steps to go on)\n",
                static_cast<long long>(next_step_), t.steps);
}

// The layout's schedule run over this rank's model, fed with this rank's
// share of the training batches and, for the validation loss, of the held-out ones.
void Trainer::build_pipeline() {
  const auto& t = cfg_.train;
  runner_ =
      std::make_unique<PipelineRunner>(ctx_->pp(), layout_.plan, layout_.schedule, t.precision == Precision::bf16);
  const int local_batch = t.global_batch / layout_.dims.data_parallel();
  const int first_sequence = ctx_->data_parallel_index() * local_batch;
  feed_ = std::make_unique<MicroBatchFeed>(*sources_.train, model_->cp_layout(), t.micro_batch, first_sequence);
  stage_ = std::make_unique<TrainingStage>(*model_, *feed_, static_cast<real>(1.0 / tokens_per_step_),
                                           layout_.micro_batches);
  // The validation loss: the held-out batches 0 .. eval_batches - 1 (evaluate()).
  if (sources_.validation) {
    val_feed_ =
        std::make_unique<MicroBatchFeed>(*sources_.validation, model_->cp_layout(), t.micro_batch, first_sequence);
    val_stage_ = std::make_unique<TrainingStage>(*model_, *val_feed_, real(0), layout_.micro_batches);
  }
}

// The mesh's communicators, the checks that refuse a run before anything
// large is allocated, the data and the model.
void Trainer::setup() {
  // Communicator creation has no non-blocking form: the watchdog's monitor
  // thread keeps its deadline.
  mpi_blocking(comm_, "building the mesh's communicators",
               [&] { ctx_ = std::make_unique<ParallelContext>(layout_.dims, comm_, cfg_.model.moe()); });
  // Ranks of one pipeline stage issue the same collectives: the diagnosis compares them.
  watchdog_.set_peer_group(ctx_->coord(Axis::pp));
  rank_ = ctx_->rank();
  speak_ = rank_ == 0 && !opts_.quiet;
  if (speak_ && world_ > 1 && cfg_.comm.progress_poll_us > 0 && !progress_.running())
    std::printf(
        "note: no progress thread (comm.progress_poll_us): this MPI library does not provide "
        "MPI_THREAD_MULTIPLE, so non-blocking transfers move only inside MPI calls\n");
  // Refuse what cannot fit, hold the checkpoint folder (one writer; proven
  // usable now, not at the first save).
  agree_on_errors(comm_, [&] { require_memory_fits(cfg_, layout_, ctx_->mesh().ranks_per_node()); });
  agree_on_errors(comm_, [&] {
    faults_ = fault::FaultPlan(cfg_.fault, rank_, world_);
    if (cfg_.fault.kind == FaultKind::skip_collective && cfg_.fault.rank == -1 &&
        ctx_->group(cfg_.fault.group).size < 2)
      throw Error("fault.group = \"" + cfg_.fault.group +
                  "\" has fewer than 2 ranks in this layout: dropping its sums would change nothing, so the fault "
                  "would never fire");
  });
  // The cluster file, the checkpoint folder and the data: what `ndmini check` opens too.
  RunInputs inputs = open_run_inputs(cfg_, layout_, ctx_->mesh().ranks_per_node(), opts_.resume, comm_);
  prediction_ = std::move(inputs.prediction);
  dir_lock_ = std::move(inputs.dir_lock);
  sources_ = std::move(inputs.sources);
  saves_ = inputs.saves;
  model_ = std::make_unique<StageRuntime>(cfg_.model, cfg_.train.micro_batch, model_parallel(*ctx_, cfg_, layout_),
                                          layout_.recompute, cfg_.train.precision);
  if (opts_.capture != nullptr) model_->record_unit_events(&opts_.capture->unit_events);
  if (opts_.replay_routing != nullptr && !cfg_.model.moe())
    throw InternalError("a routing to replay was given to a model without MoE blocks");
  if ((opts_.capture != nullptr || opts_.replay_routing != nullptr) && cfg_.model.moe()) {
    moe_log_.record = opts_.capture != nullptr ? &opts_.capture->routing : nullptr;
    moe_log_.replay = opts_.replay_routing;
    model_->set_moe_routing_log(&moe_log_);
  }
  model_->init(cfg_.train.seed);
  opt_ = std::make_unique<AdamW>(model_->store());
  ckpt_ = std::make_unique<CheckpointState>(cfg_.model, model_->store(), *opt_, saves_ && cfg_.checkpoint.async);
}

void Trainer::resume() {
  const ProfileRegion region("ndmini::checkpoint load");
  const auto t0 = Clock::now();
  const auto info = io::load_checkpoint(comm_, cfg_.checkpoint.dir, opts_.resume_step, ckpt_->slabs());
  const std::string where = cfg_.checkpoint.dir + "/" + io::checkpoint_dirname(info.step);
  check_resume_compatible(cfg_, info, where);
  const std::string data_note = check_resume_data(info.data, sources_.train->provenance(), cfg_.data, where);
  if (speak_ && !data_note.empty()) std::printf("%s\n", data_note.c_str());
  if (speak_) {
    for (const std::string& line : resume_changes(parse_config(info.config, where + " (config attribute)"), cfg_))
      std::printf("%s\n", line.c_str());
    // A resume from an older step: the saves of this run replace the newer
    // checkpoints of the same steps; the newer ones it does not save stay.
    std::string replaced, kept;
    for (const std::int64_t s : newer_checkpoints(cfg_.checkpoint.dir, info.step)) {
      const bool saved_again = cfg_.checkpoint.every > 0 && s <= cfg_.train.steps && s % cfg_.checkpoint.every == 0;
      (saved_again ? replaced : kept) += (saved_again ? replaced : kept).empty() ? "" : ", ";
      (saved_again ? replaced : kept) += io::checkpoint_dirname(s);
    }
    if (!replaced.empty() || !kept.empty())
      std::printf("checkpoint: %s holds checkpoints newer than step %lld: %s%s%s\n", cfg_.checkpoint.dir.c_str(),
                  static_cast<long long>(info.step),
                  replaced.empty() ? "" : ("this run's saves replace " + replaced).c_str(),
                  !replaced.empty() && !kept.empty() ? "; " : "",
                  kept.empty() ? "" : ("it leaves " + kept + " as they are (steps it does not save)").c_str());
  }
  ckpt_->to_device(model_->store(), *opt_);
  next_step_ = info.step;
  result_.io_ms += ms_since(t0);
  if (speak_)
    std::printf("checkpoint: resumed from %s/%s at step %lld (written by %s)\n", cfg_.checkpoint.dir.c_str(),
                io::checkpoint_dirname(info.step).c_str(), static_cast<long long>(next_step_), info.layout.c_str());
}

void Trainer::save(std::int64_t step) {
  const ProfileRegion region("ndmini::checkpoint save");
  finish_async_save();  // one host copy: the previous save is written first
  const auto t0 = Clock::now();
  ckpt_->from_device(model_->store(), *opt_);
  committed_async_save_.reset();  // its old checkpoints removed (during the copy) before this save's space check
  io::CheckpointInfo info{step,
                          static_cast<std::int64_t>(step * tokens_per_step_),
                          cfg_.train.seed,
                          effective_config_,
                          layout_.dims.str(),
                          sources_.train->provenance()};
  io::SaveOptions save_options;
  save_options.hook = faults_.save_hook();
  if (cfg_.checkpoint.async) {
    save_options.times = &async_times_;
    async_save_ = std::make_unique<io::AsyncSave>(comm_, cfg_.checkpoint.dir, info, ckpt_->slabs(),
                                                  cfg_.checkpoint.keep, save_options);
    result_.io_ms += ms_since(t0);
    if (speak_)
      std::printf(
          "checkpoint: step %lld copied to host memory and its write started (%.0f ms); written in the "
          "background\n",
          static_cast<long long>(step), ms_since(t0));
    return;
  }
  io::save_checkpoint(comm_, cfg_.checkpoint.dir, info, ckpt_->slabs(), cfg_.checkpoint.keep, save_options);
  result_.io_ms += ms_since(t0);
  if (speak_)
    std::printf("checkpoint: saved step %lld to %s/%s (%.0f ms)\n", static_cast<long long>(step),
                cfg_.checkpoint.dir.c_str(), io::checkpoint_dirname(step).c_str(), ms_since(t0));
}

// At a step boundary: commits the async save once every rank has written
// its part (one all-reduce while a save is in flight).
void Trainer::commit_async_save_if_written() {
  if (!async_save_) return;
  const auto t0 = Clock::now();
  const bool written = async_save_->written_everywhere();
  result_.io_ms += ms_since(t0);
  if (written) finish_async_save();
}

// Waits for the async save's thread, then commits it on every rank (the
// agreement, digests, metadata, rename, `latest`); its error, if any, is
// thrown here on every rank as a sync save's would be.
void Trainer::finish_async_save() {
  if (!async_save_) return;
  const ProfileRegion region("ndmini::checkpoint commit");
  const auto t0 = Clock::now();
  committed_async_save_ = std::move(async_save_);
  const std::unique_ptr<io::AsyncSave>& s = committed_async_save_;
  const double waited_ms = 1e3 * s->finish();
  result_.io_ms += ms_since(t0);
  const double written_ms = 1e3 * (async_times_.write + async_times_.flush);
  ++result_.async_saves;
  result_.async_written_ms += written_ms;
  result_.async_waited_ms += waited_ms;
  if (speak_)
    std::printf(
        "checkpoint: saved step %lld to %s/%s (async: %.0f ms written in the background, %.0f ms of it "
        "waited for)\n",
        static_cast<long long>(s->step()), cfg_.checkpoint.dir.c_str(), io::checkpoint_dirname(s->step()).c_str(),
        written_ms, std::min(waited_ms, written_ms));
}

Trainer::LossSum Trainer::evaluate(TrainingStage& stage, std::int64_t first_step, int batches, bool poison) {
  stage.set_step(first_step);
  double local = runner_->evaluate(stage, batches * layout_.micro_batches);
  model_->end_evaluation();
  if (poison) local = std::numeric_limits<double>::quiet_NaN();
  return {local, ctx_->batch().all_reduce_scalar(local)};
}

// Before the step, outside its time and its communication figures: the
// held-out loss of the same parameters as this step's loss. Training is
// bitwise the same with it or without it.
std::optional<double> Trainer::validate_if_due(std::int64_t step, double* eval_ms) {
  *eval_ms = 0;
  const auto& t = cfg_.train;
  if (!val_stage_ || (step % t.eval_every != 0 && step + 1 != t.steps)) return std::nullopt;
  const auto e0 = Clock::now();
  double val_loss = 0;
  {
    const ProfileRegion region("ndmini::validation loss");
    name_moe_pass(step, true);
    val_loss = evaluate(*val_stage_, 0, t.eval_batches).global / (tokens_per_step_ * t.eval_batches);
  }
  *eval_ms = ms_since(e0);
  reset_comm_stats();
  result_.val_losses.emplace_back(step, val_loss);
  result_.eval_ms += *eval_ms;
  return val_loss;
}

// DeepSeek-V3's balancing without an auxiliary loss: after each step every
// MoE block's selection bias moves by `rate` towards the mean load, up for an
// expert that received fewer tokens than the mean, down for one that received
// more, from the counts summed over every token-holding rank (`routed`, the
// step's [layer E + expert]), so every layout moves it alike. The bias is
// never trained (its gradient is zero): only this changes it. Returns the
// moved biases' range over the world; none where the model has no bias (the
// balanced router, a dense model: the rate moves nothing).
std::optional<std::pair<double, double>> move_selection_bias(ParamStore& store, const ModelConfig& m,
                                                             const std::vector<std::int64_t>& routed, double rate,
                                                             MPI_Comm world) {
  const std::string suffix = "/mlp/router/selection_bias";
  const std::size_t E = static_cast<std::size_t>(m.moe_experts);
  // The range of the moved biases over the world (-min, max: one MPI_MAX).
  double range[2] = {-std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  for (const ParamStore::Piece& piece : store.pieces()) {
    const std::string& name = store.layout().params[piece.param].name;
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::size_t layer = std::stoul(name.substr(2));  // "h/<layer>/..."
    double total = 0;
    for (std::size_t e = 0; e < E; ++e) total += static_cast<double>(routed[layer * E + e]);
    const double mean = total / static_cast<double>(E);
    const auto values =
        Kokkos::subview(store.shard_params(), std::make_pair(piece.shard_offset, piece.shard_offset + piece.length));
    const auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), values);
    for (std::size_t i = 0; i < piece.length; ++i) {
      const auto load = static_cast<double>(routed[layer * E + piece.local_begin + i]);
      h(i) += static_cast<real>(rate * ((load < mean) - (load > mean)));
      range[0] = std::max(range[0], -static_cast<double>(h(i)));
      range[1] = std::max(range[1], static_cast<double>(h(i)));
    }
    Kokkos::deep_copy(values, h);
  }
  store.params_changed();
  mpi_all_reduce(MPI_IN_PLACE, range, 2, MPI_DOUBLE, MPI_MAX, world, "the selection bias's range");
  if (range[1] == -std::numeric_limits<double>::infinity()) return std::nullopt;
  return std::make_pair(-range[0], range[1]);
}

// Tests: the routed experts' gradients multiplied by ep after their sums (a
// negative control, TrainOptions::moe_controls).
void scale_expert_grads(ParamStore& store, int ep) {
  for (const ParamStore::Piece& piece : store.pieces()) {
    if (store.layout().params[piece.param].split != TpSplit::experts) continue;
    const auto grads =
        Kokkos::subview(store.shard_grads(), std::make_pair(piece.shard_offset, piece.shard_offset + piece.length));
    const auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), grads);
    for (std::size_t i = 0; i < piece.length; ++i) h(i) *= static_cast<real>(ep);
    Kokkos::deep_copy(grads, h);
  }
}

// One optimizer step: the validation loss when due (outside the step's
// time), the gradients, the save of the state they showed sane, the update,
// the figures, and the agreement on stopping.
void Trainer::step() {
  const auto& t = cfg_.train;
  const std::int64_t step = next_step_++;
  faults_.at_step_start(step);
  double eval_ms = 0;
  const std::optional<double> val_loss = validate_if_due(step, &eval_ms);
  // This rank "forgets" the step's loss reduction: the others wait for it.
  if (faults_.skip_collective_at(step, rank_)) ctx_->batch().skip_next_for_fault_injection();
  // Every rank drops its sums over fault.group from here on (a negative control).
  if (faults_.drops_sums_at(step))
    if (Communicator* group = ctx_->group(cfg_.fault.group).comm) group->drop_sums_for_fault_injection();
  mpi_barrier(comm_, "the step's start");  // steps start together, so per-step times compare across ranks
  const auto t0 = Clock::now();
  if (step == result_.first_step) run_start_ = t0;
  const double io_ms_before = result_.io_ms;
  const ProfileRegion region([&] { return "ndmini::step " + std::to_string(step); });

  const auto [loss, grad_norm] = compute_gradients(step);
  if (pending_save_ >= 0) {  // the state before this step's update, now shown sane
    save(pending_save_);
    pending_save_ = -1;
  }
  if (opts_.capture != nullptr && step == result_.first_step)
    opts_.capture->first_step_grads = gather_global(cfg_.model, model_->store(), model_->store().shard_grads(), comm_);
  const double lr = update(step, grad_norm);
  commit_async_save_if_written();

  const double io_ms = result_.io_ms - io_ms_before;
  const StepStats stats = reduce_step(*ctx_, ms_since(t0) - io_ms, runner_->bubble_ms(), model_->take_recompute_ms());
  std::vector<std::int64_t> routed = model_->take_routed_rows();
  if (opts_.moe_controls.bias_counts_without_tp && ctx_->coord(Axis::tp) != 0)
    std::fill(routed.begin(), routed.end(), 0);
  const StageRuntime::AuxSums aux = model_->take_aux_sums();
  std::optional<MoeLoad> moe_load =
      reduce_moe_load(cfg_.model, t, routed, aux.z_loss, aux.seq_aux, tokens_per_step_, t.global_batch, comm_);
  if (t.moe_bias_rate > 0)
    if (const auto range = move_selection_bias(model_->store(), cfg_.model, routed, t.moe_bias_rate, comm_); range)
      std::tie(moe_load->bias_min, moe_load->bias_max) = *range;
  steps_.push_back(stats);
  result_.losses.push_back(loss);
  if (moe_load) result_.moe_loads.push_back(*moe_load);
  if (rank_ == 0 && (step % t.log_every == 0 || step + 1 == t.steps || val_loss))
    log_step(step, loss, val_loss, eval_ms, lr, grad_norm, stats, io_ms, moe_load);
  agree_on_stop(step);
}

// Forward and backward of every micro-batch, the gradient reductions, and
// the checks of the loss and the gradient norm.
Trainer::StepLoss Trainer::compute_gradients(std::int64_t step) {
  stage_->set_step(step);
  name_moe_pass(step, false);
  const double loss_sum = runner_->run(*stage_);
  {
    const ProfileRegion finish("ndmini::finish gradient reductions");
    model_->finish_grads();
  }
  if (opts_.moe_controls.expert_grads_times_ep) scale_expert_grads(model_->store(), ctx_->dims().ep);
  if (faults_.nan_at(step)) poison_first_gradient(*model_);
  const double loss = ctx_->batch().all_reduce_scalar(loss_sum) / tokens_per_step_;
  const double grad_norm = std::sqrt(grad_norm_squared(model_->store(), ctx_->norm()));
  require_finite_step(comm_, step, loss, grad_norm, loss_sum, *model_, cfg_);
  return {loss, grad_norm};
}

// Clips and takes the AdamW step; returns the learning rate it used.
double Trainer::update(std::int64_t step, double grad_norm) {
  const auto& t = cfg_.train;
  const double clip = (t.grad_clip > 0 && grad_norm > t.grad_clip) ? t.grad_clip / (grad_norm + 1e-6) : 1.0;
  const double lr = learning_rate(t, step);
  {
    const ProfileRegion optimizer_region("ndmini::optimizer");
    opt_->step(model_->store(), t, lr, clip, step + 1);
  }
  Kokkos::fence();
  return lr;
}

// Only rank 0 writes: a full disk there stops every rank. A stop signal on
// any rank stops every rank after this same step.
void Trainer::agree_on_stop(std::int64_t step) {
  const auto& t = cfg_.train;
  const int agreed_signal = agree_max(comm_, metrics_->error(), stop_signal_received());
  if (cfg_.checkpoint.every > 0 && (step + 1) % cfg_.checkpoint.every == 0) pending_save_ = step + 1;
  if (agreed_signal != 0 && step + 1 < t.steps) {
    stop_signal_ = agreed_signal;
    pending_save_ = saves_ && cfg_.checkpoint.on_signal ? step + 1 : -1;
  }
}

// Model FLOPs utilisation of a throughput, over the peak of every rank.
double Trainer::mfu(double tokens_per_s) const {
  return model_counts(cfg_.model).flops_per_token * tokens_per_s / (result_.peak.flops_per_rank * world_);
}

void Trainer::log_step(std::int64_t step, double loss, std::optional<double> val_loss, double eval_ms, double lr,
                       double grad_norm, const StepStats& stats, double io_ms, const std::optional<MoeLoad>& moe_load) {
  StepRecord r;
  r.step = step;
  r.steps = cfg_.train.steps;
  r.loss = loss;
  // The losses of this run since the last logged step (a resume starts a window).
  const auto first = result_.losses.begin() + static_cast<std::ptrdiff_t>(window_first_);
  const auto window_steps = static_cast<double>(result_.losses.end() - first);
  r.window_loss = std::accumulate(first, result_.losses.end(), 0.0) / window_steps;
  window_first_ = result_.losses.size();
  r.elapsed_s = ms_since(run_start_) / 1e3;
  const double steps_done = static_cast<double>(step + 1 - result_.first_step);
  r.eta_s = r.elapsed_s / steps_done * static_cast<double>(cfg_.train.steps - step - 1);
  r.unix_time = unix_seconds();
  r.tokens = (step + 1) * static_cast<std::int64_t>(cfg_.train.global_batch) * cfg_.model.seq_len;
  r.val_loss = val_loss;
  r.eval_ms = eval_ms;
  r.lr = lr;
  r.grad_norm = grad_norm;
  r.step_ms = stats.step_ms;
  r.tokens_per_s = tokens_per_step_ / (stats.step_ms / 1e3);
  r.mfu = mfu(r.tokens_per_s);
  r.exposed_comm_ms = stats.exposed_comm_ms();
  r.bubble_ms_per_stage = stats.bubble_ms;
  r.bubble_ms = *std::max_element(stats.bubble_ms.begin(), stats.bubble_ms.end());
  r.io_ms = io_ms;
  r.mem_bytes = result_.mem_bytes;
  r.comm = stats.comm;
  r.moe = moe_load;
  if (!opts_.quiet) std::printf("%s\n", progress_line(r).c_str());
  std::fflush(stdout);
  metrics_->step(r);
}

void Trainer::reset_comm_stats() {
  for (const auto& g : ctx_->reported())
    if (g.comm != nullptr) g.comm->reset_stats();
}

// The final state saved (when due, shown sane first), the figures of the
// run, the report, and the exit status a stop signal asks for.
TrainResult Trainer::finish() {
  if (pending_save_ >= 0) {
    // The final state (or the one a signal stopped at): the loss of one more
    // batch (forward only, through the pipeline) shows it sane before it is saved.
    TrainingStage forward_only(*model_, *feed_, real(0), layout_.micro_batches);  // a loss scale of 0: no backward
    name_moe_pass(pending_save_, true);
    const LossSum check = evaluate(forward_only, pending_save_, 1, faults_.nan_at(pending_save_));
    require_finite_state(comm_, pending_save_, check.global, check.local, cfg_);
    save(pending_save_);
  }
  finish_async_save();  // the last save committed before the report
  committed_async_save_.reset();
  if (opts_.capture != nullptr) {
    const ParamStore& store = model_->store();
    opts_.capture->final_params = gather_global(cfg_.model, store, store.shard_params(), comm_);
    int same = model_->tied_wte_identical() ? 1 : 0;
    mpi_all_reduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, comm_, "the tied embedding's copies");
    opts_.capture->tied_wte_identical = same == 1;
  }
  summarise();
  if (speak_) print_performance(layout_, *ctx_, result_, prediction_);
  if (rank_ == 0) metrics_->summary(summary_json(layout_, *ctx_, result_, prediction_));

  // A signal after the last step's agreement finds the run complete.
  const int late_signal = agree_max(comm_, metrics_->error(), stop_signal_received());
  if (const int signal_number = stop_signal_ != 0 ? stop_signal_ : late_signal; signal_number != 0) {
    if (rank_ == 0)
      std::fprintf(stderr, "%s\n",
                   stop_line(cfg_, signal_number, result_.first_step + result_.steps_run(),
                             stop_signal_ != 0 ? pending_save_ : -1, stop_signal_ != 0)
                       .c_str());
    result_.exit_status = signal_exit_status(signal_number);
  }
  return result_;
}

// The medians over the timed steps, and each stage's activation peak.
void Trainer::summarise() {
  // The first step pays for first-touch page faults and BLAS warm-up: leave
  // it out of the figures when there are others.
  const std::size_t skip = steps_.size() > 1 ? 1 : 0;
  result_.timed.assign(steps_.begin() + skip, steps_.end());
  std::vector<double> step_ms;
  for (const StepStats& s : result_.timed) step_ms.push_back(s.step_ms);
  result_.median_step_ms = median(step_ms);
  result_.tokens_per_s = result_.median_step_ms > 0 ? tokens_per_step_ / (result_.median_step_ms / 1e3) : 0;
  result_.mfu = mfu(result_.tokens_per_s);
  const int pp = layout_.dims.pp;
  result_.peak_activation_bytes.assign(pp, 0);
  result_.peak_activation_bytes[ctx_->coord(Axis::pp)] = static_cast<std::int64_t>(model_->peak_activation_bytes());
  mpi_all_reduce(MPI_IN_PLACE, result_.peak_activation_bytes.data(), pp, MPI_INT64_T, MPI_MAX, comm_,
                 "the activation peaks");
}

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& opts, MPI_Comm comm) {
  Trainer trainer(cfg, opts, comm);  // layout, mesh, model, data, resume
  while (trainer.running()) trainer.step();
  return trainer.finish();  // the final state checked and saved, the report
}

}  // namespace ndmini
