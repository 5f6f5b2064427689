// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Internal to comm/: the collective ledger and the hang diagnosis behind
// CollectiveWatchdog (communicator.hpp).
//
// Ledger: every rank keeps its last kLedgerSize collectives, over all of its
// communicators, in program order: a rank-wide index, the sequence number
// on the communicator, the operation, the bytes, and whether it completed.
// Communicators are registered once (name and world ranks), so an entry
// costs a few stores and no strings.
//
// Diagnosis (with a CollectiveWatchdog alive): a wait that passes the
// deadline sends an alarm to every rank over the watchdog's own duplicate of
// the world communicator; every rank waiting in a collective of the comm
// layer polls for alarms and answers with its ledger. Rank 0 (or, when rank
// 0 does not answer, the lowest rank that raised an alarm) compares the
// ledgers, prints which rank issued a different collective first, and ends
// the job with MPI_Abort. Each answering rank prints its own last entries.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ndmini::detail {

enum class CollOp : std::uint8_t {
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  send,
  recv,
  p2p,
  all_reduce_scalar,
};
const char* coll_op_name(CollOp op);

inline constexpr std::size_t kLedgerSize = 64;    // entries kept per rank
inline constexpr std::uint64_t kNoEntry = ~0ull;  // "not a ledger index"

struct LedgerEntry {
  std::uint64_t index = kNoEntry;  // this rank's collectives over all communicators, from 0
  std::uint64_t seq = 0;           // this communicator's collectives, from 0
  int comm = -1;                   // registry id (register_comm)
  CollOp op = CollOp::all_reduce;
  bool blocking = false;
  bool complete = false;
  std::int64_t bytes = 0;
};

// Registers a communicator for the ledger: its name and the world ranks of
// its group (computed here, once). Local; returns the id entries refer to.
int register_comm(MPI_Comm comm, const std::string& name);
const std::string& comm_name(int id);

// Appends an entry; returns its index. Process-wide (MPI_THREAD_SINGLE: no lock).
std::uint64_t ledger_record(int comm, std::uint64_t seq, CollOp op, std::int64_t bytes, bool blocking);
void ledger_complete(std::uint64_t index);
std::vector<LedgerEntry> ledger_entries();  // oldest first

// The deadline of a wait in seconds; 0 when no watchdog is alive (or it is disabled).
double watch_timeout_s();
bool watch_alive();
// Called from wait loops about once a millisecond: when another rank raised
// an alarm, answers the diagnosis and does not return.
void watch_poll(std::uint64_t waiting, double waited_s);
// The wait for entry `waiting` passed the deadline: diagnose and end the job.
[[noreturn]] void watch_expired(std::uint64_t waiting, double waited_s);

// Exit status of a job ended by the watchdog (MPI_Abort's error code).
inline constexpr int kCollectiveTimeoutExit = 12;

}  // namespace ndmini::detail
