// SPDX-License-Identifier: BSD-3-Clause
#pragma once
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

// An Error that some ranks meet while others go on: an MoE expert group
// refusing a load while the other groups train on, their ranks already in
// the step's next collectives. A rank that meets it cannot leave the others
// waiting until comm.timeout_s: the driver prints it (where `speaks`, one
// rank per group that fails alike) and ends the whole job (MPI_Abort, exit
// status 1).
class JobError : public Error {
 public:
  JobError(const std::string& what, bool speaks) : Error(what), speaks_(speaks) {}
  bool speaks() const { return speaks_; }

 private:
  bool speaks_;
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

}  // namespace ndmini
