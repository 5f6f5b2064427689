// SPDX-License-Identifier: BSD-3-Clause
#include "run/layout.hpp"

#include "core/error.hpp"
#include "model/moe.hpp"
#include "parallel/pipeline/pipeline.hpp"
#include "run/feed_sizes.hpp"
#include "run/memory_estimate.hpp"

namespace ndmini {

RunLayout resolve_layout(const Config& cfg, int world) {
  using std::to_string;
  const ParallelDims dims = resolve_mesh(cfg.parallel, world);
  const auto& p = cfg.parallel;
  const auto& t = cfg.train;
  check_model_split(cfg.model, dims);
  check_moe_split(cfg.model, dims);

  // Each data-parallel rank runs whole micro-batches of distinct sequences.
  const long long unit = static_cast<long long>(dims.data_parallel()) * t.micro_batch;
  require(t.global_batch % unit == 0,
          "train.global_batch = " + to_string(t.global_batch) + " must be a multiple of dp_replicate x dp_shard x " +
              "micro_batch = " + to_string(unit) + " (each data-parallel rank runs whole micro-batches)");
  const int micro_batches = static_cast<int>(t.global_batch / unit);

  const ScheduleKind kind = p.schedule;
  check_schedule(kind, dims.pp, dims.virtual_stages, micro_batches, cfg.model.layers);
  return RunLayout{dims, micro_batches, t.recompute, StagePlan(cfg.model.layers, dims.pp, dims.virtual_stages),
                   Schedule(kind, dims.pp, dims.virtual_stages, micro_batches)};
}

std::vector<std::string> settings_without_effect(const Config& cfg, const RunLayout& l) {
  using std::to_string;
  std::vector<std::string> notes;
  const auto& p = cfg.parallel;
  // "1f1b" is the default, so only a schedule chosen on purpose is worth a word.
  if (l.dims.pp == 1 && p.schedule != ScheduleKind::one_f_one_b)
    notes.push_back("parallel.schedule = \"" + std::string(name_of(p.schedule)) +
                    "\" has no effect with parallel.pp = 1 (no pipeline)");
  if (p.sequence_parallel && l.dims.tp == 1)
    notes.push_back("parallel.sequence_parallel = true has no effect with parallel.tp = 1 (it splits over tp ranks)");
  const auto& t = cfg.train;
  if (t.steps > 0 && t.warmup_steps > t.steps) {
    // learning_rate(): the last step, steps - 1, runs at lr x steps / warmup_steps.
    notes.push_back("train.warmup_steps = " + to_string(t.warmup_steps) +
                    " exceeds train.steps = " + to_string(t.steps) + ": the run ends in warm-up, at " +
                    to_string(100LL * t.steps / t.warmup_steps) + "% of train.lr, and never decays to train.min_lr");
  }
  return notes;
}

std::vector<MemoryEstimate> estimate_memory_per_stage(const Config& cfg, const RunLayout& l) {
  const ParallelDims& d = l.dims;
  // The records and FSDP's peak follow the run's schedule; a step of very
  // many micro-batches is replayed for its first few rounds only (the pattern repeats).
  const Schedule replay = l.micro_batches <= 4096
                              ? l.schedule
                              : Schedule(l.schedule.kind(), d.pp, d.virtual_stages, 4 * d.pp * d.virtual_stages);
  const std::size_t activation =
      GptModel::activation_elements_of(cfg.model, cfg.train.micro_batch, d.tp, d.sequence_parallel, d.cp);
  std::vector<MemoryEstimate> out;
  for (int stage = 0; stage < d.pp; ++stage) {
    MemoryEstimate e = gpt_memory_estimate(cfg.model, d, cfg.train.micro_batch, l.plan.chunks_of(stage),
                                           l.schedule.max_in_flight(stage), l.recompute, replay.actions(stage),
                                           cfg.parallel.reshard_after_forward, cfg.train.precision,
                                           cfg.comm.reduce_dtype, cfg.train.moe_max_load);
    e.async_checkpoint = cfg.checkpoint.async && (cfg.checkpoint.every > 0 || cfg.checkpoint.at_start);
    // The pipeline's transfer buffers.
    if (d.pp > 1) {
      const auto sends = static_cast<std::int64_t>(
          PipelineRunner::most_buffer_bytes(l.plan, stage, l.micro_batches, l.schedule.max_in_flight(stage), activation,
                                            cfg.train.precision == Precision::bf16));
      e.scratch_bytes += sends;
      e.comm_buffer_bytes += sends;
    }
    out.push_back(e);
  }
  // Every stage also holds the tokens of its micro-batches: one feed, and
  // one more for the validation loss.
  const int feeds = cfg.train.eval_every > 0 ? 2 : 1;
  for (MemoryEstimate& e : out)
    e.scratch_bytes +=
        feeds * static_cast<std::int64_t>(feed_sizes(cfg.train.micro_batch, cfg.model.seq_len, d.cp).bytes());
  return out;
}

MemoryEstimate estimate_memory(const Config& cfg, const RunLayout& l) {
  MemoryEstimate worst;
  for (const MemoryEstimate& e : estimate_memory_per_stage(cfg, l))
    if (e.total() > worst.total()) worst = e;
  return worst;
}

}  // namespace ndmini
