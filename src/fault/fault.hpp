// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Fault injection. The deck's [fault] section (config/config.hpp) becomes a
// plan. The training loop, the checkpoint writer and the comm layer consult
// it at their fault points. Every fault that fires says so on stderr first,
// so a test can tell a handled fault from one that never happened:
//   fault: enospc at phase 'write' fired on rank 1 at step 4
// skip_collective says it in the comm layer's words ("ndmini: fault
// injection: ...").
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "config/config.hpp"
#include "io/checkpoint.hpp"

namespace ndmini::fault {

class FaultPlan {
 public:
  FaultPlan() = default;  // injects nothing
  // The deck's plan for this rank of a job of world_size ranks. Throws Error
  // when fault.rank is not a rank of the job (the caller agrees on it).
  FaultPlan(const FaultConfig& cfg, int world_rank, int world_size);

  bool none() const { return kind_ == FaultKind::none; }

  // kind "kill" without a phase: called at the start of every training step;
  // at the plan's step, on the plan's rank, the process SIGKILLs itself.
  void at_step_start(std::int64_t step) const;
  // kind "nan": true at the plan's step on the plan's rank (reported as
  // fired); the caller then poisons a gradient, or at step train.steps the
  // forward loss that shows the final state sane.
  bool nan_at(std::int64_t step) const;
  // kind "skip_collective": whether `rank` is to skip one collective at
  // `step`. The training loop then has the comm layer skip the step's loss
  // reduction (Communicator::skip_next_for_fault_injection), which says so
  // on stderr ("ndmini: fault injection: rank R skips ..."); the peers wait
  // and the hang detection ends the job.
  bool skip_collective_at(std::int64_t step, int rank) const;
  // kind "skip_collective" with fault.rank = -1: whether every rank starts
  // dropping its sums over fault.group at `step` (reported as fired). The
  // training loop then has that communicator sum as if alone in its group
  // (Communicator::drop_sums_for_fault_injection): nobody waits, and the run
  // goes on as a layout that forgot those sums -- the negative control of
  // the equivalence bounds.
  bool drops_sums_at(std::int64_t step) const;
  // For io::SaveOptions::hook: kind "enospc" fails, kind "kill" SIGKILLs,
  // the plan's phase of the save of the plan's step on the plan's rank.
  std::function<void(SavePhase, std::int64_t, const std::string&)> save_hook() const;

  // Writes "fault: KIND[ at phase 'P'] fired on rank R at step S" to stderr.
  void report_fired() const;

 private:
  FaultKind kind_ = FaultKind::none;
  std::optional<SavePhase> phase_;
  int rank_ = 0, my_rank_ = 0;  // rank_ -1: every rank
  std::int64_t step_ = 0;
};

}  // namespace ndmini::fault
