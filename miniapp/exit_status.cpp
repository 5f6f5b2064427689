// SPDX-License-Identifier: BSD-3-Clause
#include "exit_status.hpp"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/signals.hpp"

namespace ndmini::driver {

int exit_status(Ending ending) {
  switch (ending) {
    case Ending::kDone:
      return 0;
    case Ending::kError:
      return 1;
    case Ending::kBadInput:
      return 2;
  }
  return 1;
}

void print_error(const std::string& message) { std::fprintf(stderr, "ndmini: error: %s\n", message.c_str()); }

void abort_on_bug(int rank, const std::exception& e) {
  std::fprintf(stderr, "ndmini: internal error on rank %d: %s\n", rank, e.what());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();  // MPI_Abort does not return
}

int hand_over_stop_status(int rank, int status, bool signalled) {
  // A signal after the run's last agreement still counts, on this rank.
  const bool late = status == 0 && stop_signal_received() != 0;
  if (late) status = signal_exit_status(stop_signal_received());
  // MPICH's mpiexec drops the ranks' exit statuses once it has forwarded a
  // signal to them, but keeps MPI_Abort's: hand the status over that way
  // (once per job; everything is saved and closed by now). It exits at the
  // abort, dropping output still in transit: give it a moment to pass on
  // the stop line first.
  if ((signalled && rank == 0) || late) {
    std::fflush(nullptr);
    // Test hook: NDMINI_TEST_HAND_OVER_PAUSE_MS lengthens the pause, so a test
    // can act while the rank is inside it (tests/cli/fault_signal.sh, leaving).
    long pause_ms = 200;
    if (const char* hook = std::getenv("NDMINI_TEST_HAND_OVER_PAUSE_MS")) pause_ms = std::strtol(hook, nullptr, 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  return status;
}

void end_job_at_once(int status) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);  // both may be called from any thread, at any time
  MPI_Finalized(&finalized);
  if (initialized != 0 && finalized == 0) MPI_Abort(MPI_COMM_WORLD, status);
  _exit(status);
}

}  // namespace ndmini::driver
