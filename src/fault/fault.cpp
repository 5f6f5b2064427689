// SPDX-License-Identifier: BSD-3-Clause
#include "fault/fault.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include "core/error.hpp"

namespace ndmini::fault {
namespace {

[[noreturn]] void kill_self() {
  // SIGKILL, not abort(): nothing may run after it, as after a node failure.
  ::kill(::getpid(), SIGKILL);
  for (;;) ::pause();
}

}  // namespace

FaultPlan::FaultPlan(const FaultConfig& cfg, int world_rank, int world_size)
    : kind_(cfg.kind), phase_(cfg.phase), rank_(cfg.rank), my_rank_(world_rank), step_(cfg.step) {
  if (kind_ == FaultKind::none) return;
  require(cfg.rank < world_size, "fault.rank = " + std::to_string(cfg.rank) + " is not a rank of this job (" +
                                     std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks") +
                                     "): the fault would never fire");
}

void FaultPlan::report_fired() const {
  const std::string at = phase_ ? " at phase '" + std::string(name_of(*phase_)) + "'" : "";
  std::fprintf(stderr, "fault: %s%s fired on rank %d at step %lld\n", name_of(kind_), at.c_str(), my_rank_,
               static_cast<long long>(step_));
  std::fflush(stderr);
}

void FaultPlan::at_step_start(std::int64_t step) const {
  if (kind_ != FaultKind::kill || phase_ || step != step_ || my_rank_ != rank_) return;
  report_fired();
  kill_self();
}

bool FaultPlan::nan_at(std::int64_t step) const {
  if (kind_ != FaultKind::nan || step != step_ || my_rank_ != rank_) return false;
  report_fired();
  return true;
}

bool FaultPlan::skip_collective_at(std::int64_t step, int rank) const {
  return kind_ == FaultKind::skip_collective && step == step_ && rank == rank_;
}

bool FaultPlan::drops_sums_at(std::int64_t step) const {
  if (kind_ != FaultKind::skip_collective || rank_ != -1 || step != step_) return false;
  report_fired();
  return true;
}

std::function<void(SavePhase, std::int64_t, const std::string&)> FaultPlan::save_hook() const {
  if ((kind_ != FaultKind::enospc && kind_ != FaultKind::kill) || !phase_ || my_rank_ != rank_) return {};
  const FaultPlan plan = *this;
  return [plan](SavePhase phase, std::int64_t step, const std::string& file) {
    if (step != plan.step_ || plan.phase_ != phase) return;
    plan.report_fired();
    if (plan.kind_ == FaultKind::kill) kill_self();
    throw Error("'" + file + "': No space left on device (injected by fault.kind = \"enospc\")");
  };
}

}  // namespace ndmini::fault
