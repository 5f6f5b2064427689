// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// One function per subcommand. Each runs on every rank launched and returns
// that rank's exit status (exit_status.hpp).
#include "command_line.hpp"
#include "runtime.hpp"

namespace ndmini::driver {

// Trains. Ends Kokkos itself: a stop signal's status leaves through MPI_Abort after it.
int run_train(Runtime& runtime, const Options& options);
// Validates the deck and prints what a run would use.
int run_check(const Runtime& runtime, const Options& options);
// Every key of the deck, its value (the -1 degrees resolved) and its origin, on rank 0.
int run_config(const Runtime& runtime, const Options& options);
// The deck's schema, on rank 0.
int run_keys(const Runtime& runtime);
// ckpt info and ckpt verify, on rank 0; the others learn its status.
int run_ckpt(const Runtime& runtime, const Options& options);
// plan, and plan --fit, on rank 0; the others learn its status.
int run_plan(const Runtime& runtime, const Options& options);
// plan --calibrate: every rank measures.
int run_plan_calibrate(const Runtime& runtime, const Options& options);

}  // namespace ndmini::driver
