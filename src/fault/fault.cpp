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
    : kind_name_(cfg.kind), phase_(cfg.phase), rank_(cfg.rank), my_rank_(world_rank), step_(cfg.step) {
  if (cfg.kind == "none") return;
  kind_ = cfg.kind == "kill"     ? Kind::kill
          : cfg.kind == "nan"    ? Kind::nan
          : cfg.kind == "enospc" ? Kind::enospc
                                 : Kind::skip_collective;
  require(cfg.rank < world_size, "fault.rank = " + std::to_string(cfg.rank) + " is not a rank of this job (" +
                                     std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks") +
                                     "): the fault would never fire");
}

void FaultPlan::report_fired() const {
  std::fprintf(stderr, "fault: %s%s fired on rank %d at step %lld\n", kind_name_.c_str(),
               phase_.empty() ? "" : (" at phase '" + phase_ + "'").c_str(), my_rank_, static_cast<long long>(step_));
  std::fflush(stderr);
}

void FaultPlan::at_step_start(std::int64_t step) const {
  if (kind_ != Kind::kill || !phase_.empty() || step != step_ || my_rank_ != rank_) return;
  report_fired();
  kill_self();
}

bool FaultPlan::nan_at(std::int64_t step) const {
  if (kind_ != Kind::nan || step != step_ || my_rank_ != rank_) return false;
  report_fired();
  return true;
}

bool FaultPlan::skip_collective_at(std::int64_t step, int rank) const {
  return kind_ == Kind::skip_collective && step == step_ && rank == rank_;
}

std::function<void(io::SavePhase, std::int64_t, const std::string&)> FaultPlan::save_hook() const {
  if ((kind_ != Kind::enospc && kind_ != Kind::kill) || phase_.empty() || my_rank_ != rank_) return {};
  const FaultPlan plan = *this;
  return [plan](io::SavePhase phase, std::int64_t step, const std::string& file) {
    if (step != plan.step_ || plan.phase_ != io::phase_name(phase)) return;
    plan.report_fired();
    if (plan.kind_ == Kind::kill) kill_self();
    throw Error("'" + file + "': No space left on device (injected by fault.kind = \"enospc\")");
  };
}

}  // namespace ndmini::fault
