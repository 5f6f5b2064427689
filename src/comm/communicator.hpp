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
//   message for send/recv), ms (issue to completion), and exposed_ms (time the
//   caller was blocked: the whole call when blocking, the wait when not).
//   Non-blocking calls count calls and bytes at issue, ms and exposed_ms at
//   completion (exposed_ms then also holds the issue and any test() calls).
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
  void all_reduce(real* buf, std::size_t count, ReduceOp op = ReduceOp::sum);
  // recv holds size() * count_per_rank: rank r's `send` lands at r * count_per_rank.
  void all_gather(const real* send, real* recv, std::size_t count_per_rank);
  // send holds size() * count_per_rank; recv gets the sum of every rank's block `rank()`.
  void reduce_scatter(const real* send, real* recv, std::size_t count_per_rank);
  void broadcast(real* buf, std::size_t count, int root);
  void send(const real* buf, std::size_t count, int peer, int tag = 0);
  void recv(real* buf, std::size_t count, int peer, int tag = 0);

  // Non-blocking forms; buffers must stay alive until wait(), and the
  // Communicator must outlive the request (it accounts into stats()).
  CommRequest iall_reduce(real* buf, std::size_t count, ReduceOp op = ReduceOp::sum);
  CommRequest iall_gather(const real* send, real* recv, std::size_t count_per_rank);
  CommRequest ireduce_scatter(const real* send, real* recv, std::size_t count_per_rank);

  // Non-blocking point-to-point: every send and receive of `ops` is issued
  // at once (MPI_Isend/MPI_Irecv; one ncclGroupStart/End group on NCCL, so a
  // ring exchange -- send to the next rank, receive from the previous -- or a
  // pipeline stage's send and receive cannot deadlock); one request completes
  // them all. Accounted as one call; bytes are those sent plus received.
  CommRequest batch_p2p(const std::vector<P2POp>& ops);
  CommRequest isend(const real* buf, std::size_t count, int peer, int tag = 0);
  CommRequest irecv(real* buf, std::size_t count, int peer, int tag = 0);

  // Host scalars (loss sums, squared norms): blocking, double precision.
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::sum);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

  struct BackendImpl;  // MPI or NCCL

 private:
  MPI_Comm comm_;
  std::string name_;
  int size_ = 1, rank_ = 0;
  Backend backend_ = Backend::mpi;
  CommStats stats_;
  std::unique_ptr<BackendImpl> impl_;
};

// True when this build has the NCCL backend.
bool nccl_available();

// The backend for the mesh axes' collectives on MemSpace buffers: NCCL where
// this build has it, MemSpace is a GPU's memory and every rank has a GPU of
// its own; MPI otherwise (and always on host memory). NDMINI_COMM_BACKEND=mpi
// or nccl overrides. Collective over `world`; the same answer on every rank.
Communicator::Backend device_collectives_backend(MPI_Comm world);

}  // namespace ndmini
