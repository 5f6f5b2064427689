// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Pipeline parallelism, part 1: which layers each stage runs and in which
// order a stage runs the forward and backward steps of the micro-batches.
//
// Stages. The L layers are cut into S = pp x virtual_stages chunks of
// contiguous layers (the first L mod S chunks get one layer more); chunk k
// runs on pp rank k mod pp, so with virtual stages each rank holds the chunks
// r, r + pp, r + 2pp, ... (Megatron's interleaved assignment). The embedding
// runs in chunk 0, the final LayerNorm and the tied LM head in chunk S - 1.
// Activations flow from chunk k to chunk k + 1 (pp rank r to r + 1, and from
// the last rank back to the first between virtual stages); their gradients
// flow back.
//
// Schedules, for m micro-batches (the gradient-accumulation steps):
//   none     pp = 1: forward and backward of each micro-batch in turn.
//   gpipe    all forwards, then all backwards: m micro-batches in flight.
//   1f1b     pp - r - 1 warm-up forwards on rank r, then one forward and one
//            backward in turn, then the remaining backwards: at most pp - r in flight.
//   interleaved_1f1b
//            1F1B over virtual stages (Megatron): m must be a multiple of pp;
//            warm-up 2(pp - r - 1) + (v - 1) pp forward chunks; the bubble
//            shrinks by v.
// Bubble fraction of the ideal schedule: (pp - 1) / (v m + pp - 1), v = 1
// for GPipe and 1F1B.
#include <string>
#include <vector>

#include "config/config.hpp"
#include "model/chunk.hpp"

namespace ndmini {

// ScheduleKind and its names: config/config.hpp (parsed with the deck).

class StagePlan {
 public:
  StagePlan(int layers, int pp, int virtual_stages);
  int pp() const { return pp_; }
  int virtual_stages() const { return v_; }
  int chunks() const { return pp_ * v_; }
  Chunk chunk(int index) const;
  int rank_of(int chunk) const { return chunk % pp_; }
  // The chunks pp rank `stage` runs, in model order.
  std::vector<Chunk> chunks_of(int stage) const;
  // "stage 0: layers 0-2 (+embedding) | stage 1: layers 3-5 (+head)"
  std::string describe() const;

 private:
  int layers_, pp_, v_;
};

// One step of a stage's schedule: the forward or backward of one micro-batch
// through one chunk.
struct PipelineAction {
  enum class Kind { forward, backward };
  Kind kind;
  int micro_batch;
  int chunk;  // global chunk index
  bool operator==(const PipelineAction& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

class Schedule {
 public:
  // pp = 1 gives `none` whatever `kind` is; checks nothing (see check_schedule).
  Schedule(ScheduleKind kind, int pp, int virtual_stages, int micro_batches);
  ScheduleKind kind() const { return kind_; }
  int micro_batches() const { return m_; }
  // Every action of pp rank `stage` for one optimizer step, in order.
  std::vector<PipelineAction> actions(int stage) const;
  // Most micro-batches whose activations a stage holds at once (forwards
  // done, backwards not yet), summed over its chunks.
  int max_in_flight(int stage) const;
  // The ideal bubble fraction: (pp - 1) / (v m + pp - 1).
  double ideal_bubble() const;

 private:
  ScheduleKind kind_;
  int pp_, v_, m_;
};

// The layout rules of pipelining, checked once where the layout is resolved;
// throws Error naming the key and the fix.
void check_schedule(ScheduleKind kind, int pp, int virtual_stages, int micro_batches, int layers);

}  // namespace ndmini
