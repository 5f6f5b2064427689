// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Pre-emption. SIGTERM, SIGINT and SIGUSR1 ask the run to stop; a scheduler
// sends one before it ends a job (Slurm's --signal). The handler only records
// the first one. The training loop agrees on it at the next step boundary and
// saves, and the process exits with signal_exit_status(). A second signal
// ends the process at once, with the same status convention. A save cut
// short leaves only debris, and `latest` names the previous checkpoint.
//
// Why not simply die of the signal? MPICH's mpiexec reports a job whose
// ranks a forwarded signal ended as status 0 (it drops the ranks' statuses
// once it forwarded a signal). So the driver hands the status over through
// MPI_Abort instead, once everything is saved (miniapp/exit_status.cpp).
namespace ndmini {

// Installs the handler for SIGTERM, SIGINT and SIGUSR1 from construction
// (clearing any signal recorded before) to destruction, which restores the
// handlers that were there; a signal the parent left ignored stays ignored.
// One at a time.
class StopSignals {
 public:
  StopSignals();
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
