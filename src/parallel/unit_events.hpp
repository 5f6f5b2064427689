// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// A chunk's FSDP sequence, described once, as data. One micro-batch's
// forward or backward through a chunk is a list of events. They gather,
// prefetch and release a unit's parameters, open and end its gradients, let
// reductions progress, and run the model's compute. unit_events() builds the
// list. StageRuntime executes it around the model's compute; the memory
// estimate and the planner's FSDP traffic replay it without data
// (run/memory_estimate.hpp). Without FSDP the same list runs, and only
// end_grads does anything (data parallelism's bucket after the last micro-batch).
#include <string>
#include <vector>

#include "config/config.hpp"
#include "model/chunk.hpp"
#include "model/gpt.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/unit_id.hpp"

namespace ndmini {

enum class UnitOp {
  gather,      // the unit's full parameters available (waits for its prefetch)
  prefetch,    // start the all-gather of the unit that runs next
  release,     // drop its full parameters
  open_grads,  // zeroed full gradients (kept if already open)
  end_grads,   // start their reduction
  poll,        // let in-flight reductions progress
  compute,     // the model runs `part`
};

// The model's computations; every event belongs to one: a compute event
// runs it, the others are the FSDP scope around it (and its profile region).
enum class Part {
  embedding_forward,
  block_forward,
  head_forward,
  head_backward,
  block_recompute,  // recompute = block: the block's forward again, inside its backward
  block_backward,
  embedding_backward,
  end_of_evaluation,  // no compute: what a forward-only pass left gathered goes
};

struct UnitEvent {
  UnitOp op;
  Part part;
  int block = 0;  // which block of the chunk (block parts; 0 elsewhere)
  UnitId unit;    // the unit acted on; a compute: the block's unit, none for the embedding and the head
  friend bool operator==(const UnitEvent& a, const UnitEvent& b) {
    return a.op == b.op && a.part == b.part && a.block == b.block && a.unit == b.unit;
  }
  friend bool operator!=(const UnitEvent& a, const UnitEvent& b) { return !(a == b); }
};
std::string describe(const UnitEvent& e);  // "gather unit 3 (block 1 forward)", for messages

// parallel.reshard_after_forward: true releases a block's parameters after
// its forward (gathered again for the backward), false keeps them until then.
enum class Reshard { after_forward, after_backward };
inline Reshard reshard_of(bool reshard_after_forward) {
  return reshard_after_forward ? Reshard::after_forward : Reshard::after_backward;
}
// evaluation: forward only (a loss scale of 0), no gradients.
enum class Pass { train, evaluation };

// What decides the sequence besides the chunk itself (which holds the
// embedding, the head, or both: then wte stays gathered across the chunk).
struct UnitPolicy {
  Reshard reshard = Reshard::after_forward;
  Recompute recompute = Recompute::none;
  Pass pass = Pass::train;
};

// One micro-batch's `kind` (forward: with the head's backward under
// Pass::train) through chunk `c` of units `u`.
std::vector<UnitEvent> unit_events(const Chunk& c, const ChunkUnits& u, PipelineAction::Kind kind,
                                   const UnitPolicy& policy);
// After a stage's last forward-only micro-batch: every one of its `units`
// released (Reshard::after_backward and the tied wte of pp = 1 keep units gathered).
std::vector<UnitEvent> end_of_evaluation_events(int units);
// The events of a stage of `chunks` running `actions` in order (actions of
// chunks elsewhere are skipped): what StageRuntime executes for them.
std::vector<UnitEvent> stage_unit_events(const std::vector<Chunk>& chunks, const std::vector<PipelineAction>& actions,
                                         const UnitPolicy& policy);
// The same for chunks of units `units` (gpt_chunk_units of the deck's
// architecture: the form above is GPT-2's units).
std::vector<UnitEvent> stage_unit_events(const std::vector<Chunk>& chunks, const std::vector<ChunkUnits>& units,
                                         const std::vector<PipelineAction>& actions, const UnitPolicy& policy);

}  // namespace ndmini
