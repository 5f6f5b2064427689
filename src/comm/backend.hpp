// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Internal to comm/: the interface a backend (MPI, NCCL) implements, and the
// request every non-blocking collective returns. The Communicator owns the
// accounting; a backend only moves data and says when it is done.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/communicator.hpp"
#include "core/timer.hpp"

namespace ndmini {

// A collective in flight. The backend supplies wait_backend()/test_backend();
// this base turns completion into accounting on the owning Communicator's
// stats (which must outlive the request).
struct CommRequest::Impl {
  virtual ~Impl();  // communicator.cpp: ends the progress count if still held

  // Blocks until complete, then accounts ms (issue to completion) and the
  // time the caller was blocked (issue + every test() + this wait).
  void wait();
  // True when complete (and then accounted). Never blocks for long.
  bool test();

  CommStats* stats = nullptr;                      // set by the Communicator at issue
  Clock::time_point start{};                       // issue time
  double blocked_ms = 0;                           // caller time spent inside issue/test so far
  std::uint64_t ledger_index = ~std::uint64_t{0};  // its ledger entry (ledger.hpp)
  bool done = false;
  bool progress_counted = false;  // counted in flight for the progress thread

  // Whether MPI moves the data (MPI backend, or MPI staged through host
  // memory), so the progress thread helps it along.
  virtual bool moved_by_mpi() const { return false; }
  // Whether MPI has finished the transfer, without completing the request
  // (MPI_Request_get_status). The progress thread asks, holding
  // detail::mpi_request_mutex(), under which the MPI backend also tests and
  // waits, so a request is never freed while it is looked at.
  virtual bool mpi_transfer_done() const { return true; }

 protected:
  // Blocks until complete: the wait when no CollectiveWatchdog sets a deadline.
  virtual void wait_backend() = 0;
  virtual bool test_backend() = 0;
  // The deadline passed: leave the backend safe to abandon (NCCL aborts its communicator).
  virtual void abort_backend() {}
  // Whether a deadline wait yields the core between polls (NCCL: the GPU does
  // the work; MPI: the polling rank itself moves the data, as MPI_Wait does).
  virtual bool yield_while_polling() const { return false; }

 private:
  void finish(Clock::time_point now);
};

// Pure data movement on the communicator's group; buffers are in MemSpace.
// The Communicator fences compute (unless the backend orders its transfers
// after the compute on the device itself), times, and counts around these calls.
struct Communicator::BackendImpl {
  virtual ~BackendImpl() = default;

  // True when a transfer waits on the device for the compute enqueued before
  // its issue (NCCL: an event on the compute stream), so no host fence is needed.
  virtual bool orders_with_compute() const { return false; }

  // The sums, for fp32 and for bf16 values (Communicator's sums of either;
  // a bf16 sum is only ever ReduceOp::sum).
  virtual void all_reduce(real* buf, std::size_t count, ReduceOp op) = 0;
  virtual void all_reduce(bf16* buf, std::size_t count, ReduceOp op) = 0;
  virtual void reduce_scatter(const real* send, real* recv, std::size_t count_per_rank) = 0;
  virtual void reduce_scatter(const bf16* send, bf16* recv, std::size_t count_per_rank) = 0;
  virtual std::unique_ptr<CommRequest::Impl> iall_reduce(real* buf, std::size_t count, ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest::Impl> iall_reduce(bf16* buf, std::size_t count, ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest::Impl> ireduce_scatter(const real* send, real* recv,
                                                             std::size_t count_per_rank) = 0;
  virtual std::unique_ptr<CommRequest::Impl> ireduce_scatter(const bf16* send, bf16* recv,
                                                             std::size_t count_per_rank) = 0;

  virtual void all_gather(const real* send, real* recv, std::size_t count_per_rank) = 0;
  virtual void broadcast(real* buf, std::size_t count, int root) = 0;
  virtual std::unique_ptr<CommRequest::Impl> ibroadcast(real* buf, std::size_t count, int root) = 0;
  virtual void send(const real* buf, std::size_t count, int peer, int tag) = 0;
  virtual void recv(real* buf, std::size_t count, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest::Impl> iall_gather(const real* send, real* recv, std::size_t count_per_rank) = 0;
  virtual std::unique_ptr<CommRequest::Impl> batch_p2p(const std::vector<P2POp>& ops) = 0;
  // The variable all-to-all of fp32 and of bf16 values (the Communicator's
  // blocking form waits for it); `counts` has one entry per rank.
  virtual std::unique_ptr<CommRequest::Impl> iall_to_all_v(const real* send, real* recv,
                                                           const AllToAllCounts& counts) = 0;
  virtual std::unique_ptr<CommRequest::Impl> iall_to_all_v(const bf16* send, bf16* recv,
                                                           const AllToAllCounts& counts) = 0;
};

// A backend that writes each sum once, as member templates over the element
// type (all_reduce_of<T>, reduce_scatter_of<T>, iall_reduce_of<T>,
// ireduce_scatter_of<T>, T = real or bf16), and the variable all-to-all
// (iall_to_all_v_of<T>), derives from this: it turns the fp32 and bf16
// overrides into calls of those templates.
template <class Backend>
struct SumsOverElementType : Communicator::BackendImpl {
  void all_reduce(real* buf, std::size_t count, ReduceOp op) override { self().all_reduce_of(buf, count, op); }
  void all_reduce(bf16* buf, std::size_t count, ReduceOp op) override { self().all_reduce_of(buf, count, op); }
  void reduce_scatter(const real* send, real* recv, std::size_t count_per_rank) override {
    self().reduce_scatter_of(send, recv, count_per_rank);
  }
  void reduce_scatter(const bf16* send, bf16* recv, std::size_t count_per_rank) override {
    self().reduce_scatter_of(send, recv, count_per_rank);
  }
  std::unique_ptr<CommRequest::Impl> iall_reduce(real* buf, std::size_t count, ReduceOp op) override {
    return self().iall_reduce_of(buf, count, op);
  }
  std::unique_ptr<CommRequest::Impl> iall_reduce(bf16* buf, std::size_t count, ReduceOp op) override {
    return self().iall_reduce_of(buf, count, op);
  }
  std::unique_ptr<CommRequest::Impl> ireduce_scatter(const real* send, real* recv,
                                                     std::size_t count_per_rank) override {
    return self().ireduce_scatter_of(send, recv, count_per_rank);
  }
  std::unique_ptr<CommRequest::Impl> ireduce_scatter(const bf16* send, bf16* recv,
                                                     std::size_t count_per_rank) override {
    return self().ireduce_scatter_of(send, recv, count_per_rank);
  }
  std::unique_ptr<CommRequest::Impl> iall_to_all_v(const real* send, real* recv,
                                                   const AllToAllCounts& counts) override {
    return self().iall_to_all_v_of(send, recv, counts);
  }
  std::unique_ptr<CommRequest::Impl> iall_to_all_v(const bf16* send, bf16* recv,
                                                   const AllToAllCounts& counts) override {
    return self().iall_to_all_v_of(send, recv, counts);
  }

 private:
  Backend& self() { return static_cast<Backend&>(*this); }
};

}  // namespace ndmini
