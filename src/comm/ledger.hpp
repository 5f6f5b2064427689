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
// Waits: a rank's main thread marks each blocking wait (a comm-layer
// request, a raw MPI call of comm/mpi/mpi_calls.hpp) with a WaitScope; the
// deadline counts from the start of the wait.
//
// Diagnosis (with a CollectiveWatchdog alive): a wait that passes the
// deadline sends an alarm to every rank over the watchdog's own duplicate of
// the world communicator, and every rank answers with its ledger and the wait
// it is in (or none: it computes). Where MPI provides MPI_THREAD_MULTIPLE a
// monitor thread of the watchdog does both, whatever the main thread is
// blocked in; elsewhere the waits poll for them themselves (and a blocking
// MPI call with no non-blocking form has no deadline). Rank 0 (or, when rank
// 0 does not answer, the lowest rank that raised an alarm) names the ranks
// that did not answer (the stalled ones), compares the ledgers of SPMD peers
// (ranks of one pipeline stage), prints who waits for whom, and ends the job
// with MPI_Abort. Each answering rank prints its own last entries.
#include <mpi.h>

#include <chrono>
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
  barrier,
  setup,  // a blocking call with no non-blocking form (communicator creation)
  all_to_all_v,
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
  const char* what = nullptr;  // a raw MPI call's purpose ("the step agreement"); static text
};

// Registers a communicator for the ledger: its name and the world ranks of
// its group (computed here, once). Local; returns the id entries refer to.
int register_comm(MPI_Comm comm, const std::string& name);
const std::string& comm_name(int id);

// Appends an entry; returns its index. Process-wide; the watchdog's monitor
// thread reads the ledger while the main thread writes it, so both lock.
std::uint64_t ledger_record(int comm, std::uint64_t seq, CollOp op, std::int64_t bytes, bool blocking,
                            const char* what = nullptr);
void ledger_complete(std::uint64_t index);
std::vector<LedgerEntry> ledger_entries();  // oldest first

// What SPMD peers must agree on at each position of their ledgers, as the
// diagnosis compares them: the communicator's name (not its group: the two
// dp groups of a 4-rank job are different groups), the operation, a raw
// call's purpose (`what`, ": the step agreement" or empty) and the bytes --
// except for all_to_all_v, whose bytes follow each rank's data.
std::string spmd_signature(const std::string& comm_name, const LedgerEntry& e, const std::string& what);

// The deadline of a wait in seconds; 0 when no watchdog is alive (or it is disabled).
double watch_timeout_s();
bool watch_alive();

// Whether this rank's node runs more host threads than it has cores: its
// ranks (MPI_COMM_TYPE_SHARED) times each rank's Kokkos host threads above
// the node's online CPUs, found once by the watchdog alive (false without
// one). There MPI_Wait's spin holds a core the rank waited for needs (8
// ranks on 2 cores: steps 10x slower), so a wait for an MPI request sleeps
// kSharedCoreNap between tests instead (CommRequest::Impl::wait).
bool waits_share_cores();
inline constexpr auto kSharedCoreNap = std::chrono::microseconds(50);

// The calling thread waits for ledger entry `waiting` while it lives. With
// a monitor thread, that thread enforces the deadline and answers alarms;
// without one, a polling wait calls poll() about once a millisecond. Waits
// do not nest (an inner one keeps the outer one's start).
class WaitScope {
 public:
  explicit WaitScope(std::uint64_t waiting);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;
  // Without a monitor thread: answers another rank's alarm, or raises one
  // when the deadline passed (on_expiry runs first, e.g. to abort an NCCL
  // communicator); neither returns. With one: does nothing.
  template <class OnExpiry>
  void poll(OnExpiry&& on_expiry) const {
    if (!polls_) return;
    if (expired()) {
      on_expiry();
      expire();
    }
    answer_alarm();
  }
  // Whether this wait must poll (no monitor thread watches it).
  bool polls() const { return polls_; }

 private:
  bool expired() const;
  [[noreturn]] void expire() const;
  void answer_alarm() const;
  bool outer_ = false;  // nested inside another wait of this thread
  bool polls_ = false;
};

// Exit status of a job ended by the watchdog (MPI_Abort's error code).
inline constexpr int kCollectiveTimeoutExit = 12;

}  // namespace ndmini::detail
