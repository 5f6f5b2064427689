// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Collectives bound to one mesh axis (or flattened group), with accounting.
//
// Every collective the model issues goes through the Communicator of the
// axis that owns it. Buffers are float32 in ndmini::MemSpace (host memory on
// the host backends, device memory on CUDA). The MPI backend works on either
// (device memory directly with a CUDA-aware MPI, else staged through host
// memory: comm/device_path.hpp); the NCCL backend (comm/nccl, built with
// NDMINI_ENABLE_NCCL) runs on its own stream, ordered with Kokkos' by events.
//
// Accounting, per communicator, reset by the caller each step:
//   calls, bytes (this rank's payload: the full buffer for all-reduce and
//   broadcast, the gathered size for all-gather and reduce-scatter, the
//   message for send/recv, sent plus received for all-to-all-v), ms (issue
//   to completion), and exposed_ms (time the caller was blocked: the whole
//   call when blocking, the wait when not).
//   Non-blocking calls count calls and bytes at issue, ms and exposed_ms at
//   completion (exposed_ms then also holds the issue and any test() calls).
//
// Ledger and hang detection: every rank keeps a ledger of its last 64
// collectives over all communicators (sequence number per communicator,
// operation, bytes, completed or not; recent_collectives() shows one
// communicator's part). While a CollectiveWatchdog is alive, every wait has
// a deadline (comm.timeout_s): blocking calls are issued non-blocking and
// waited for under it, and so are the raw MPI calls of comm/mpi/mpi_calls.hpp.
// When a wait passes it, the ranks exchange their ledgers over the
// watchdog's own communicator (a monitor thread answers for a rank whatever
// it does), each prints its last collectives, rank 0 names the ranks that
// did not answer (the stalled ones), the first collective that diverged
// between peers and who waits for whom, and the job ends with MPI_Abort
// (exit 12) instead of hanging. The NCCL backend's watchdog uses the
// same deadline (and NDMINI_NCCL_TIMEOUT_S only when no CollectiveWatchdog is alive).
//
// MPI backend: all-reduce and broadcast above 16 MiB are sent as several
// calls of at most 16 MiB, issued together; and the first MPI Communicator
// tells glibc to keep freed memory in the process and to take large blocks
// from its heap too (the MPI library's temporary buffers are otherwise
// faulted in afresh on every step). Both are explained in mpi/mpi_backend.cpp.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/types.hpp"

namespace ndmini {

struct CommStats {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  double ms = 0;
  double exposed_ms = 0;
  // Reports only (train/report.cpp): the least-blocked rank's exposed_ms, next
  // to the slowest rank's above. What the two differ by is waiting for slower
  // ranks, not the transfer.
  double exposed_min_ms = 0;
  CommStats& operator+=(const CommStats& o);
};

enum class ReduceOp { sum, max };

// One point-to-point transfer of a batch (see Communicator::batch_p2p).
struct P2POp {
  enum class Kind { send, recv };
  Kind kind;
  real* buf;  // send: read only; recv: written
  std::size_t count;
  int peer;     // rank in this communicator
  int tag = 0;  // MPI matches on it; NCCL matches in issue order (tags ignored)
};

// The layout of a variable all-to-all (Communicator::all_to_all_v): element
// counts and displacements, one entry per rank of the communicator, in its
// rank order. send_counts[r] elements from send + send_displs[r] go to rank
// r; recv_counts[r] elements from rank r land at recv + recv_displs[r], and
// must equal rank r's send_counts[rank()] (exchange the counts first).
struct AllToAllCounts {
  std::vector<std::size_t> send_counts, send_displs;
  std::vector<std::size_t> recv_counts, recv_displs;

  // Blocks back to back in rank order: each displacement is the sum of the counts before it.
  static AllToAllCounts packed(std::vector<std::size_t> send_counts, std::vector<std::size_t> recv_counts);
  std::size_t send_total() const;
  std::size_t recv_total() const;
};

// One entry of the collective ledger (see above).
struct CollectiveRecord {
  std::uint64_t index;  // among this rank's collectives on all communicators, from 0
  std::uint64_t seq;    // among this communicator's collectives, from 0
  std::string op;       // "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "p2p",
                        // "all_reduce_scalar", "all_to_all_v"
  std::int64_t bytes;   // as counted in CommStats (the hang diagnosis compares them, except all_to_all_v's)
  bool blocking;
  bool complete;
};

// Hang detection for every Communicator while it is alive (see above).
// Collective over `world` (it duplicates it for the diagnosis). Nested ones
// stack: the newest governs until it is destroyed (destroy in reverse
// order). timeout_s = 0 keeps the ledger but sets no deadline.
class CollectiveWatchdog {
 public:
  CollectiveWatchdog(MPI_Comm world, double timeout_s);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;
  double timeout_s() const { return timeout_s_; }
  // Ranks of one peer group issue the same collectives in the same order
  // (SPMD peers: one pipeline stage); a hang's diagnosis compares the
  // ledgers only within a group. Local; 0 for every rank by default.
  void set_peer_group(int group);

 private:
  double timeout_s_;
};

// A non-blocking collective in flight. wait() completes it (and is called by
// the destructor if the owner forgets, so no request leaks).
class CommRequest {
 public:
  CommRequest();  // out of line: Impl is complete only in the .cpp
  CommRequest(CommRequest&&) noexcept;
  CommRequest& operator=(CommRequest&&) noexcept;
  ~CommRequest();
  void wait();
  bool test();  // true when complete (and then accounted); lets MPI progress
  bool active() const;

  struct Impl;  // backend specific
  explicit CommRequest(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

class Communicator {
 public:
  enum class Backend { mpi, nccl };

  // Does not take ownership of `comm`. `name` labels the accounting ("tp").
  // Backend nccl throws Error unless built with NDMINI_ENABLE_NCCL.
  Communicator(MPI_Comm comm, std::string name, Backend backend = Backend::mpi);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const std::string& name() const { return name_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  MPI_Comm mpi() const { return comm_; }
  Backend backend() const { return backend_; }

  // Blocking collectives. Counts elements are per call as named.
  // The sums (all_reduce, reduce_scatter and their non-blocking forms) take
  // T = real or bf16; see "Sums of bf16 values" below.
  template <class T>
  void all_reduce(T* buf, std::size_t count, ReduceOp op = ReduceOp::sum);
  // recv holds size() * count_per_rank: rank r's `send` lands at r * count_per_rank.
  void all_gather(const real* send, real* recv, std::size_t count_per_rank);
  // bf16 values, two to an fp32 slot (as iall_gather's bf16 form below).
  void all_gather(const bf16* send, bf16* recv, std::size_t count_per_rank);
  // send holds size() * count_per_rank; recv gets the sum of every rank's block `rank()`.
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count_per_rank);
  void broadcast(real* buf, std::size_t count, int root);
  void send(const real* buf, std::size_t count, int peer, int tag = 0);
  void recv(real* buf, std::size_t count, int peer, int tag = 0);

  // Non-blocking forms; buffers must stay alive until wait(), and the
  // Communicator must outlive the request (it accounts into stats()).
  template <class T>
  CommRequest iall_reduce(T* buf, std::size_t count, ReduceOp op = ReduceOp::sum);
  CommRequest iall_gather(const real* send, real* recv, std::size_t count_per_rank);
  // The same for bf16 values (FSDP's gather of a bf16 working copy): a gather
  // only moves bits, so pairs of them travel as one fp32 slot; count_per_rank
  // must be even. The ledger counts the real bytes (2 per value).
  CommRequest iall_gather(const bf16* send, bf16* recv, std::size_t count_per_rank);
  template <class T>
  CommRequest ireduce_scatter(const T* send, T* recv, std::size_t count_per_rank);

  // Sums of bf16 values (T = bf16: gradient reductions under
  // comm.reduce_dtype = "bf16", tp's activations under bf16): on the wire 2
  // bytes a value, and the ledger counts those. Only ReduceOp::sum. The sum
  // is a bf16 sum: each pair of operands widened to fp32, added and rounded
  // to nearest even (MPI: a user-defined operation, bf16_sum_into; NCCL:
  // ncclBfloat16). It is not associative, so the result depends on the order
  // the library combines the ranks in. That order is the same every run for
  // a given group size, and the same on every rank of the group.

  // Non-blocking point-to-point: every send and receive of `ops` is issued
  // at once (MPI_Isend/MPI_Irecv; one ncclGroupStart/End group on NCCL, so a
  // ring exchange -- send to the next rank, receive from the previous -- or a
  // pipeline stage's send and receive cannot deadlock); one request completes
  // them all. Accounted as one call; bytes are those sent plus received.
  CommRequest batch_p2p(const std::vector<P2POp>& ops);

  // Variable all-to-all (expert parallelism's token dispatch and combine),
  // T = real or bf16 (bf16 activations travel as 2 bytes a value). Every rank
  // of the group calls it, zero counts included, with the layout of `counts`
  // (AllToAllCounts above); send and recv must not overlap, and recv is
  // written only inside its blocks. A pure copy: the result does not depend
  // on timing or on the backend's order of transfers. MPI: MPI_Ialltoallv
  // (counts and displacements must fit MPI's int, else Error before anything
  // moves); NCCL: one group of ncclSend/ncclRecv. `counts` may go once the
  // call returns. Accounted as one call of bytes sent plus received (all
  // blocks, this rank's own included); its ledger entry keeps the bytes, but
  // the hang diagnosis leaves them out when it compares ranks, which
  // legitimately move different amounts.
  template <class T>
  void all_to_all_v(const T* send, T* recv, const AllToAllCounts& counts);
  template <class T>
  CommRequest iall_to_all_v(const T* send, T* recv, const AllToAllCounts& counts);
  CommRequest isend(const real* buf, std::size_t count, int peer, int tag = 0);
  CommRequest irecv(real* buf, std::size_t count, int peer, int tag = 0);

  // Host scalars (loss sums, squared norms): blocking, double precision.
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::sum);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

  // This communicator's entries of the rank's ledger, oldest first.
  std::vector<CollectiveRecord> recent_collectives() const;

  // Fault injection (the fault plan's skip_collective): the next collective
  // called on this communicator, of any kind, returns at once without
  // communicating or touching its buffers (all_reduce_scalar returns its
  // argument), and is not entered in the ledger -- as if this rank's code
  // had not called it. The peers then wait for it; with a watchdog alive the
  // job ends with the diagnosis. Says so on stderr when it happens.
  void skip_next_for_fault_injection() { skip_next_ = true; }
  // Fault injection on every rank of the group (fault.rank = -1): from now
  // on every sum called here -- all-reduce, reduce-scatter, in fp32 or bf16,
  // blocking or not -- returns what this rank would get were it alone in
  // the group (an all-reduce leaves the buffer as it is, a reduce-scatter
  // copies this rank's own block) without communicating. Gathers and
  // exchanges still run. Says so on stderr once.
  void drop_sums_for_fault_injection();

  struct BackendImpl;  // MPI or NCCL

 private:
  // Throws Error unless `counts` has one entry per rank of the group.
  void check_layout(const AllToAllCounts& counts) const;
  // Consumes the fault-injection switch: true when this call is to be skipped.
  bool skip(const char* op);
  // True when sums are dropped (drop_sums_for_fault_injection) or this call is skipped.
  bool skip_sum(const char* op) { return drop_sums_ || skip(op); }

  MPI_Comm comm_;
  std::string name_;
  int size_ = 1, rank_ = 0;
  Backend backend_ = Backend::mpi;
  CommStats stats_;
  std::unique_ptr<BackendImpl> impl_;
  int ledger_id_ = -1;     // this communicator in the ledger's registry
  std::uint64_t seq_ = 0;  // collectives issued on it
  bool skip_next_ = false;
  bool drop_sums_ = false;
};

// The MPI bf16 sum's elementwise function: inout[i] = bf16(float(in[i]) +
// float(inout[i])), rounded to nearest even (a NaN stays a NaN).
void bf16_sum_into(const bf16* in, bf16* inout, std::size_t n);

// True when this build has the NCCL backend.
bool nccl_available();
// The NCCL library's version ("2.28.9"), empty without the NCCL backend.
std::string nccl_version();

// The backend for the mesh axes' collectives on MemSpace buffers: NCCL where
// this build has it, MemSpace is a GPU's memory and every rank has a GPU of
// its own; MPI otherwise (and always on host memory). NDMINI_COMM_BACKEND=mpi
// or nccl overrides. Collective over `world`; the same answer on every rank.
Communicator::Backend device_collectives_backend(MPI_Comm world);

}  // namespace ndmini
