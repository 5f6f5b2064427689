// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The exit statuses of docs/running.md, in one place. A subcommand says how
// it ended (an Ending); exit_status() gives the number. Three statuses come
// from elsewhere:
//   3        a bug (abort_on_bug() takes the job down with it)
//   12       a collective timed out (comm/ledger.hpp's watchdog aborts with kCollectiveTimeoutExit)
//   128 + N  stopped by signal N (signal_exit_status() in core/signals.hpp; the trainer's result carries it)
#include <exception>
#include <string>

#include "core/error.hpp"

namespace ndmini::driver {

enum class Ending {
  kDone,      // 0
  kError,     // 1: an ndmini::Error (the deck, a file, a checkpoint), or a checkpoint that does not verify
  kBadInput,  // 2: a command-line mistake; every problem of `ndmini plan`, whose input is its command line
};

int exit_status(Ending ending);

// "ndmini: error: MESSAGE" on stderr, the form of every error.
void print_error(const std::string& message);

// Runs work() (it returns an exit status). An ndmini::Error it throws is
// printed where `speaks` is true (one rank speaks for ranks that fail alike)
// and ends the work as `on_error`.
template <class Work>
int status_of(Work&& work, bool speaks, Ending on_error) {
  try {
    return work();
  } catch (const Error& e) {
    if (speaks) print_error(e.what());
    return exit_status(on_error);
  }
}

// An exception other than an Error is a bug, which may hold on this rank
// only. The rank names it and takes the job down (MPI_Abort, status 3).
[[noreturn]] void abort_on_bug(int rank, const std::exception& e);

// A JobError: printed where it speaks, then the whole job ends with status 1
// (MPI_Abort, after a moment for the line to pass), since the ranks that did
// not meet it wait for this one in a collective.
[[noreturn]] void end_job_on(const JobError& e);

// status_of for work every rank does alike (train, check): rank 0 speaks for
// all; anything but an Error ends in abort_on_bug().
// An Error some ranks meet while others go on (a JobError) ends the job at
// once: see end_job_on().
template <class Work>
int collective_status_of(int rank, Work&& work) {
  try {
    try {
      return work();
    } catch (const JobError& e) {
      end_job_on(e);
    }
  } catch (const Error& e) {
    if (rank == 0) print_error(e.what());
    return exit_status(Ending::kError);
  } catch (const std::exception& e) {
    abort_on_bug(rank, e);
  }
}

// The end of a training run, once Kokkos is finalised: a stop signal's
// status (`signalled`, or a signal after the run's last agreement) is handed
// to mpiexec through MPI_Abort, and then this never returns: rank 0 aborts,
// the other ranks of a signalled run wait for that without finalising MPI
// (a second request meanwhile aborts through end_job_at_once, and they
// abort themselves should rank 0 not within a backstop). Returns the status otherwise.
int hand_over_stop_status(int rank, int status, bool signalled);

// A deliberate second stop request (core/signals.hpp's EndAtOnce): the whole
// job ends at once through MPI_Abort, so mpiexec reports `status` and ends
// every rank together (none is left inside a transfer with a peer that is
// gone); before MPI_Init or after MPI_Finalize, this process _exits.
[[noreturn]] void end_job_at_once(int status);

}  // namespace ndmini::driver
