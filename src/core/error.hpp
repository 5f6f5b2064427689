// SPDX-License-Identifier: BSD-3-Clause
#pragma once
#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace ndmini {

// Every user-facing failure (bad deck, missing file, corrupted checkpoint,
// non-finite loss) is an Error whose message names the key or file and says
// what would fix it. The driver prints it once and exits non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A broken invariant of ndmini itself (a bug, not bad input). Unlike Error it
// may hold on one rank only, so the driver takes the whole job down
// (MPI_Abort) instead of trusting every rank to fail alike.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error("internal: " + what) {}
};

// Throws Error(message) when cond is false.
void require(bool cond, const std::string& message);

// Runs a rank-local step (reading a file, opening one) on every rank of
// `comm` and agrees on the outcome: if it threw on any rank, every rank
// throws Error with the lowest failing rank's message. Collective; without
// it, one rank's error would leave the others waiting in the next collective.
void agree_on_errors(MPI_Comm comm, const std::function<void()>& body);

// The same agreement for an outcome already known: `local_error` is empty
// where this rank succeeded.
void agree(MPI_Comm comm, const std::string& local_error);

// agree, folding one more rank-local value (>= 0) into the same collective:
// returns the largest `local_value` of any rank when no rank failed. The
// training loop agrees on a received stop signal this way at no extra cost.
int agree_max(MPI_Comm comm, const std::string& local_error, int local_value);

}  // namespace ndmini
