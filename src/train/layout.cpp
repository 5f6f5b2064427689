// SPDX-License-Identifier: BSD-3-Clause
#include "train/layout.hpp"

#include "core/error.hpp"

namespace ndmini {

RunLayout resolve_layout(const Config& cfg, int world) {
  using std::to_string;
  RunLayout l;
  l.mesh = resolve_mesh(cfg.parallel, world);
  const auto& p = cfg.parallel;
  const auto& t = cfg.train;
  l.split.tp = l.mesh.degree_of(Axis::tp);
  l.split.cp = l.mesh.degree_of(Axis::cp);
  l.split.pp = l.mesh.degree_of(Axis::pp);
  l.split.virtual_stages = p.virtual_stages;
  l.split.sequence_parallel = p.sequence_parallel;
  l.fsdp = l.mesh.degree_of(Axis::dp_shard) * l.split.cp;
  l.recompute = t.recompute == "block" ? Recompute::block : Recompute::none;
  check_model_split(cfg.model, l.split);

  // Each data-parallel rank runs whole micro-batches of distinct sequences.
  l.data_parallel = l.mesh.degree_of(Axis::dp_replicate) * l.mesh.degree_of(Axis::dp_shard);
  const long long unit = static_cast<long long>(l.data_parallel) * t.micro_batch;
  require(t.global_batch % unit == 0,
          "train.global_batch = " + to_string(t.global_batch) + " must be a multiple of dp_replicate x dp_shard x " +
              "micro_batch = " + to_string(unit) + " (each data-parallel rank runs whole micro-batches)");
  l.micro_batches = static_cast<int>(t.global_batch / unit);

  const ScheduleKind kind = schedule_kind(p.schedule);
  check_schedule(kind, l.split.pp, p.virtual_stages, l.micro_batches, cfg.model.layers);
  l.schedule = Schedule(kind, l.split.pp, p.virtual_stages, l.micro_batches).kind();  // none when pp = 1
  return l;
}

std::vector<MemoryEstimate> estimate_memory_per_stage(const Config& cfg, const RunLayout& l) {
  const StagePlan plan(cfg.model.layers, l.split.pp, l.split.virtual_stages);
  const Schedule schedule(l.schedule, l.split.pp, l.split.virtual_stages, l.micro_batches);
  std::vector<MemoryEstimate> out;
  for (int stage = 0; stage < l.split.pp; ++stage)
    out.push_back(gpt_memory_estimate(cfg.model, l.split, cfg.train.micro_batch, l.fsdp, plan.chunks_of(stage),
                                      schedule.max_in_flight(stage), l.recompute));
  return out;
}

MemoryEstimate estimate_memory(const Config& cfg, const RunLayout& l) {
  MemoryEstimate worst;
  for (const MemoryEstimate& e : estimate_memory_per_stage(cfg, l))
    if (e.total() > worst.total()) worst = e;
  return worst;
}

}  // namespace ndmini
