// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Pre-emption. SIGTERM, SIGINT and SIGUSR1 ask the run to stop; a scheduler
// sends one before it ends a job (Slurm's --signal). The handler records the
// first one. The training loop agrees on it at the next step boundary and
// saves, and the process exits with signal_exit_status(). A save cut short
// leaves only debris, and `latest` names the previous checkpoint.
//
// One request often reaches a rank more than once: Slurm signals every
// process of the step, so a rank gets its own copy and the one mpiexec
// forwards, milliseconds apart. So a signal counts by its source and time,
// not its count: the same signal again within kCopyWindowSeconds of the
// first is a copy of that request and changes nothing. A deliberate second
// request ends the job at once: the same signal after the window, another
// stop signal, or a second SIGINT from the terminal (Ctrl-C twice; the
// kernel sends those, si_code SI_KERNEL, and a key is pressed once per
// request). The at-once end goes through the EndAtOnce the driver gives
// (MPI_Abort: the launcher ends every rank together, so none is left inside
// a transfer with a peer that is gone, and its status is the abort's).
//
// Why not simply die of the signal, or _exit? MPICH's mpiexec reports a job
// whose ranks a forwarded signal ended as status 0 (it drops the ranks'
// statuses once it forwarded a signal). So the driver hands the status over
// through MPI_Abort instead, once everything is saved (miniapp/exit_status.cpp).
namespace ndmini {

// Copies of one stop request arrive within this many seconds of the first:
// the launcher forwards its copy within milliseconds, a few hundred on a
// loaded node; a person or script that asks again does so seconds later.
constexpr double kCopyWindowSeconds = 2.0;

// Ends the job at once with the status given (128 + the signal). Called on
// a thread of its own, never inside the signal handler; it must not return
// (when it does, the process _exits with the status).
using EndAtOnce = void (*)(int status);

// Installs the handler for SIGTERM, SIGINT and SIGUSR1 from construction
// (clearing any signal recorded before) to destruction, which restores the
// handlers that were there; a signal the parent left ignored stays ignored.
// A deliberate second request calls end_at_once (nullptr: _exit). One at a time.
class StopSignals {
 public:
  explicit StopSignals(EndAtOnce end_at_once = nullptr);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// The first stop signal received while a StopSignals was installed (its
// number), 0 when none.
int stop_signal_received();

// "SIGTERM", "SIGINT", "SIGUSR1"; "signal" for others.
const char* signal_name(int sig);

// The exit status of a run a signal stopped: 128 + its number (143 for
// SIGTERM, 130 for SIGINT, 138 for SIGUSR1), what a shell shows for a
// process the signal killed.
int signal_exit_status(int sig);

}  // namespace ndmini
