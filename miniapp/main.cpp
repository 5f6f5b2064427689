// SPDX-License-Identifier: BSD-3-Clause
// The ndmini executable. It initialises MPI, parses the command line,
// initialises Kokkos and runs the subcommand; everything else lives in the
// library.
#include <csignal>
#include <cstdlib>
#include <optional>

#include "command_line.hpp"
#include "core/signals.hpp"
#include "exit_status.hpp"
#include "runtime.hpp"
#include "subcommands.hpp"

namespace {

// `check` and `ckpt` have no step boundary to stop at: a signal ends them
// at once, as by default.
void stop_at_once(std::optional<ndmini::StopSignals>& stop_signals) {
  stop_signals.reset();
  if (const int sig = ndmini::stop_signal_received(); sig != 0) std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ndmini::driver;
  // From the first moment: a signal during start-up is handled at the first
  // step boundary, not left to kill a rank (which mpiexec may report as 0).
  std::optional<ndmini::StopSignals> stop_signals(std::in_place, &end_job_at_once);
  Runtime runtime(argc, argv);
  if (runtime.kokkos_help()) return 0;

  Options options;
  if (const auto status = parse_command_line(argc, argv, runtime.rank(), runtime.world(), options)) return *status;
  runtime.start_kokkos();  // after the parse: --version and --help need no device
  switch (options.subcommand) {
    case Subcommand::kTrain: {
      int status = run_train(runtime, options);  // a stopped run does not return from it
      runtime.finalize();
      // A stop signal during MPI_Finalize, after the last look at it: the run
      // is complete and saved, MPI gone; the status still says it was asked.
      if (const int sig = ndmini::stop_signal_received(); status == 0 && sig != 0)
        status = ndmini::signal_exit_status(sig);
      // Exit with the handlers still installed: a signal from here on is
      // absorbed, never kills the rank (mpiexec read that as a failure, 15).
      std::exit(status);
    }
    case Subcommand::kCheck:
      stop_at_once(stop_signals);
      return run_check(runtime, options);
    case Subcommand::kConfig:
      stop_at_once(stop_signals);
      return run_config(runtime, options);
    case Subcommand::kKeys:
      stop_at_once(stop_signals);
      return run_keys(runtime);
    case Subcommand::kCkptInfo:
    case Subcommand::kCkptVerify:
      stop_at_once(stop_signals);
      return run_ckpt(runtime, options);
    case Subcommand::kPlan:
      return run_plan(runtime, options);
    case Subcommand::kPlanCalibrate:
      return run_plan_calibrate(runtime, options);
  }
  return 0;
}
