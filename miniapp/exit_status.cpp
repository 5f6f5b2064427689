// SPDX-License-Identifier: BSD-3-Clause
#include "exit_status.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
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

void end_job_on(const JobError& e) {
  if (e.speaks()) print_error(e.what());
  std::fflush(nullptr);
  end_job_at_once(exit_status(Ending::kError));
}

namespace {

// mpiexec exits at an MPI_Abort, dropping the output still in transit: the
// aborting rank gives it this long to pass on the lines just written.
constexpr long kOutputDrainMs = 200;
// A signalled run's ranks other than rank 0 wait this long beyond rank 0's
// pause for its hand-over before they hand the status over themselves.
constexpr long kHandOverBackstopMs = 10000;

// kOutputDrainMs, or NDMINI_TEST_HAND_OVER_PAUSE_MS: a test hook that keeps
// rank 0 in its pause before the hand-over, so a test can act while it is
// there (tests/cli/fault_signal.sh, leaving).
long hand_over_pause_ms() {
  if (const char* hook = std::getenv("NDMINI_TEST_HAND_OVER_PAUSE_MS"); hook != nullptr && *hook != '\0')
    return std::max(0L, std::strtol(hook, nullptr, 10));
  return kOutputDrainMs;
}

void sleep_ms(long ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace

int hand_over_stop_status(int rank, int status, bool signalled) {
  // A signal after the run's last agreement still counts, on this rank.
  const bool late = status == 0 && stop_signal_received() != 0;
  if (late) status = signal_exit_status(stop_signal_received());
  if (!signalled && !late) return status;
  // MPICH's mpiexec drops the ranks' exit statuses once it has forwarded a
  // signal to them, but keeps MPI_Abort's: hand the status over that way
  // (once per job; everything is saved and closed by now), after a moment
  // for the stop line to pass.
  std::fflush(nullptr);
  const long pause_ms = hand_over_pause_ms();
  if (rank == 0 || late) {
    sleep_ms(pause_ms);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  // The other ranks of a signalled run never finalise MPI or exit on their
  // own: an exit's status is lost, and a rank that has left cannot hand
  // any over. They wait for rank 0's abort to end them. A second request
  // meanwhile ends the job through their own MPI_Abort (end_job_at_once,
  // its status), even with rank 0 held (SIGSTOP) or stuck in its pause;
  // and should rank 0 never hand over, they do so after the backstop.
  sleep_ms(pause_ms + kHandOverBackstopMs);
  MPI_Abort(MPI_COMM_WORLD, status);
  return status;  // MPI_Abort does not return
}

void end_job_at_once(int status) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);  // both may be called from any thread, at any time
  MPI_Finalized(&finalized);
  if (initialized != 0 && finalized == 0) {
    sleep_ms(kOutputDrainMs);  // the second-signal line passes on first
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  _exit(status);
}

}  // namespace ndmini::driver
