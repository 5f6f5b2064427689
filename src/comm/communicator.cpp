// SPDX-License-Identifier: BSD-3-Clause
// The Communicator: accounting and dispatch around a backend, and the MPI
// backend (host or device buffers; device buffers need a CUDA-aware MPI).
#include "comm/communicator.hpp"

#include <climits>
#include <cstdio>
#include <type_traits>
#include <utility>

#include "comm/backend.hpp"
#include "comm/device_path.hpp"
#include "core/error.hpp"

#ifdef NDMINI_HAVE_NCCL
#include "comm/nccl/nccl_backend.hpp"
#endif

namespace ndmini {

static_assert(std::is_same_v<real, float>, "the MPI backend sends real as MPI_FLOAT");

CommStats& CommStats::operator+=(const CommStats& o) {
  calls += o.calls;
  bytes += o.bytes;
  ms += o.ms;
  exposed_ms += o.exposed_ms;
  return *this;
}

bool nccl_available() {
#ifdef NDMINI_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

// --- CommRequest -------------------------------------------------------------

void CommRequest::Impl::finish(detail::Clock::time_point now) {
  done = true;
  if (stats) {
    stats->ms += detail::ms_between(start, now);
    stats->exposed_ms += blocked_ms;
  }
}

void CommRequest::Impl::wait() {
  if (done) return;
  auto t0 = detail::Clock::now();
  wait_backend();
  auto t1 = detail::Clock::now();
  blocked_ms += detail::ms_between(t0, t1);
  finish(t1);
}

bool CommRequest::Impl::test() {
  if (done) return true;
  auto t0 = detail::Clock::now();
  bool complete = test_backend();
  auto t1 = detail::Clock::now();
  // Polling is time the caller spent on communication too, however short.
  blocked_ms += detail::ms_between(t0, t1);
  if (complete) finish(t1);
  return complete;
}

CommRequest::CommRequest() = default;
CommRequest::CommRequest(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CommRequest::CommRequest(CommRequest&&) noexcept = default;

namespace {
// For the noexcept paths (destructor, move-assignment): they cannot throw,
// and the peers are stuck in the same collective, so say why and take the
// job down rather than hang.
void complete_or_abort(CommRequest::Impl& impl) noexcept {
  try {
    impl.wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ndmini: error completing a collective: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}
}  // namespace

CommRequest& CommRequest::operator=(CommRequest&& o) noexcept {
  if (this != &o) {
    // Complete what this request held first, so overwriting never leaks one.
    if (impl_) complete_or_abort(*impl_);
    impl_ = std::move(o.impl_);
  }
  return *this;
}

CommRequest::~CommRequest() {
  if (impl_) complete_or_abort(*impl_);
}

void CommRequest::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}

bool CommRequest::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}

bool CommRequest::active() const { return impl_ != nullptr; }

// --- MPI backend ---------------------------------------------------------------

namespace detail {
namespace {

void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string(call) + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
}

// MPI counts are int; a larger message would have to be split.
int mpi_count(std::size_t count, const char* call) {
  require(count <= static_cast<std::size_t>(INT_MAX),
          std::string(call) + ": " + std::to_string(count) + " elements exceed MPI's int count");
  return static_cast<int>(count);
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

class MpiRequest final : public CommRequest::Impl {
 public:
  MPI_Request request = MPI_REQUEST_NULL;

 protected:
  void wait_backend() override { mpi_check(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait"); }
  bool test_backend() override {
    int flag = 0;
    mpi_check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  }
};

// Several point-to-point requests completed together.
class MpiRequests final : public CommRequest::Impl {
 public:
  std::vector<MPI_Request> requests;

 protected:
  void wait_backend() override {
    mpi_check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
  bool test_backend() override {
    int flag = 0;
    mpi_check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    return flag != 0;
  }
};

class MpiBackend final : public Communicator::BackendImpl {
 public:
  MpiBackend(MPI_Comm comm, int rank) : comm_(comm), rank_(rank) {}

  void all_reduce(real* buf, std::size_t count, ReduceOp op) override {
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, mpi_count(count, "MPI_Allreduce"), MPI_FLOAT, mpi_op(op), comm_),
              "MPI_Allreduce");
  }
  void all_gather(const real* send, real* recv, std::size_t count_per_rank) override {
    int n = mpi_count(count_per_rank, "MPI_Allgather");
    mpi_check(MPI_Allgather(gather_send(send, recv, count_per_rank), n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_),
              "MPI_Allgather");
  }
  void reduce_scatter(const real* send, real* recv, std::size_t count_per_rank) override {
    mpi_check(MPI_Reduce_scatter_block(send, recv, mpi_count(count_per_rank, "MPI_Reduce_scatter_block"), MPI_FLOAT,
                                       MPI_SUM, comm_),
              "MPI_Reduce_scatter_block");
  }
  void broadcast(real* buf, std::size_t count, int root) override {
    mpi_check(MPI_Bcast(buf, mpi_count(count, "MPI_Bcast"), MPI_FLOAT, root, comm_), "MPI_Bcast");
  }
  void send(const real* buf, std::size_t count, int peer, int tag) override {
    mpi_check(MPI_Send(buf, mpi_count(count, "MPI_Send"), MPI_FLOAT, peer, tag, comm_), "MPI_Send");
  }
  void recv(real* buf, std::size_t count, int peer, int tag) override {
    mpi_check(MPI_Recv(buf, mpi_count(count, "MPI_Recv"), MPI_FLOAT, peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  }

  std::unique_ptr<CommRequest::Impl> iall_reduce(real* buf, std::size_t count, ReduceOp op) override {
    auto r = std::make_unique<MpiRequest>();
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, mpi_count(count, "MPI_Iallreduce"), MPI_FLOAT, mpi_op(op), comm_,
                             &r->request),
              "MPI_Iallreduce");
    return r;
  }
  std::unique_ptr<CommRequest::Impl> iall_gather(const real* send, real* recv, std::size_t count_per_rank) override {
    auto r = std::make_unique<MpiRequest>();
    int n = mpi_count(count_per_rank, "MPI_Iallgather");
    mpi_check(
        MPI_Iallgather(gather_send(send, recv, count_per_rank), n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_, &r->request),
        "MPI_Iallgather");
    return r;
  }
  std::unique_ptr<CommRequest::Impl> ireduce_scatter(const real* send, real* recv,
                                                     std::size_t count_per_rank) override {
    auto r = std::make_unique<MpiRequest>();
    mpi_check(MPI_Ireduce_scatter_block(send, recv, mpi_count(count_per_rank, "MPI_Ireduce_scatter_block"), MPI_FLOAT,
                                        MPI_SUM, comm_, &r->request),
              "MPI_Ireduce_scatter_block");
    return r;
  }
  std::unique_ptr<CommRequest::Impl> batch_p2p(const std::vector<P2POp>& ops) override {
    auto r = std::make_unique<MpiRequests>();
    r->requests.reserve(ops.size());
    for (const P2POp& op : ops) {
      MPI_Request req = MPI_REQUEST_NULL;
      if (op.kind == P2POp::Kind::send)
        mpi_check(MPI_Isend(op.buf, mpi_count(op.count, "MPI_Isend"), MPI_FLOAT, op.peer, op.tag, comm_, &req),
                  "MPI_Isend");
      else
        mpi_check(MPI_Irecv(op.buf, mpi_count(op.count, "MPI_Irecv"), MPI_FLOAT, op.peer, op.tag, comm_, &req),
                  "MPI_Irecv");
      r->requests.push_back(req);
    }
    return r;
  }

 private:
  // In-place all-gather (this rank's block already sits in recv, as NCCL
  // allows) must be spelled MPI_IN_PLACE: MPI forbids aliased buffers.
  const void* gather_send(const real* send, const real* recv, std::size_t count_per_rank) const {
    return send == recv + static_cast<std::size_t>(rank_) * count_per_rank ? MPI_IN_PLACE : send;
  }

  MPI_Comm comm_;
  int rank_;
};

// Data a kernel wrote must be in memory before MPI reads it (directly, or
// to stage it through host memory). NCCL orders itself on the device instead
// (orders_with_compute). The fence also keeps the compute before the
// collective out of its timing.
void fence_compute() {
  if (Kokkos::is_initialized()) ExecSpace().fence();
}

}  // namespace
}  // namespace detail

// --- Communicator ------------------------------------------------------------

Communicator::Communicator(MPI_Comm comm, std::string name, Backend backend)
    : comm_(comm), name_(std::move(name)), backend_(backend) {
  require(comm_ != MPI_COMM_NULL, "Communicator '" + name_ + "': MPI_COMM_NULL (this rank is not in the group)");
  detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  if (backend == Backend::mpi) {
    // Device buffers reach MPI directly (CUDA-aware) or through host memory.
    impl_ = detail::with_device_path(std::make_unique<detail::MpiBackend>(comm_, rank_), comm_, name_);
    return;
  }
#ifdef NDMINI_HAVE_NCCL
  impl_ = detail::make_nccl_backend(comm_, name_);
#else
  throw Error("Communicator '" + name_ +
              "': the NCCL backend was requested but this build has none; reconfigure with "
              "-DNDMINI_ENABLE_NCCL=ON (needs NCCL and the CUDA toolkit) or use the MPI backend");
#endif
}

Communicator::~Communicator() = default;

namespace detail {
namespace {

std::int64_t real_bytes(std::size_t count) { return static_cast<std::int64_t>(count * sizeof(real)); }

// Blocking calls: the caller waits for the whole call, so exposed == ms.
template <class Call>
void blocking(const Communicator::BackendImpl& impl, CommStats& stats, std::int64_t bytes, Call&& call) {
  if (!impl.orders_with_compute()) fence_compute();
  auto t0 = Clock::now();
  call();
  double ms = ms_between(t0, Clock::now());
  stats.calls += 1;
  stats.bytes += bytes;
  stats.ms += ms;
  stats.exposed_ms += ms;
}

// Non-blocking calls: calls and bytes are counted at issue; ms and exposed_ms
// when the request completes (wait, a successful test, or its destructor).
template <class Issue>
CommRequest nonblocking(const Communicator::BackendImpl& impl, CommStats& stats, std::int64_t bytes, Issue&& issue) {
  if (!impl.orders_with_compute()) fence_compute();
  auto t0 = Clock::now();
  std::unique_ptr<CommRequest::Impl> r = issue();
  r->stats = &stats;
  r->start = t0;
  r->blocked_ms = ms_between(t0, Clock::now());  // issuing blocks the caller too
  stats.calls += 1;
  stats.bytes += bytes;
  return CommRequest(std::move(r));
}

}  // namespace
}  // namespace detail

void Communicator::all_reduce(real* buf, std::size_t count, ReduceOp op) {
  detail::blocking(*impl_, stats_, detail::real_bytes(count), [&] { impl_->all_reduce(buf, count, op); });
}

void Communicator::all_gather(const real* send, real* recv, std::size_t count_per_rank) {
  detail::blocking(*impl_, stats_, detail::real_bytes(static_cast<std::size_t>(size_) * count_per_rank),
                   [&] { impl_->all_gather(send, recv, count_per_rank); });
}

void Communicator::reduce_scatter(const real* send, real* recv, std::size_t count_per_rank) {
  detail::blocking(*impl_, stats_, detail::real_bytes(static_cast<std::size_t>(size_) * count_per_rank),
                   [&] { impl_->reduce_scatter(send, recv, count_per_rank); });
}

void Communicator::broadcast(real* buf, std::size_t count, int root) {
  require(root >= 0 && root < size_, "Communicator '" + name_ + "': broadcast root " + std::to_string(root) +
                                         " is not a rank of a group of " + std::to_string(size_));
  detail::blocking(*impl_, stats_, detail::real_bytes(count), [&] { impl_->broadcast(buf, count, root); });
}

void Communicator::send(const real* buf, std::size_t count, int peer, int tag) {
  detail::blocking(*impl_, stats_, detail::real_bytes(count), [&] { impl_->send(buf, count, peer, tag); });
}

void Communicator::recv(real* buf, std::size_t count, int peer, int tag) {
  detail::blocking(*impl_, stats_, detail::real_bytes(count), [&] { impl_->recv(buf, count, peer, tag); });
}

CommRequest Communicator::iall_reduce(real* buf, std::size_t count, ReduceOp op) {
  return detail::nonblocking(*impl_, stats_, detail::real_bytes(count),
                             [&] { return impl_->iall_reduce(buf, count, op); });
}

CommRequest Communicator::iall_gather(const real* send, real* recv, std::size_t count_per_rank) {
  return detail::nonblocking(*impl_, stats_, detail::real_bytes(static_cast<std::size_t>(size_) * count_per_rank),
                             [&] { return impl_->iall_gather(send, recv, count_per_rank); });
}

CommRequest Communicator::ireduce_scatter(const real* send, real* recv, std::size_t count_per_rank) {
  return detail::nonblocking(*impl_, stats_, detail::real_bytes(static_cast<std::size_t>(size_) * count_per_rank),
                             [&] { return impl_->ireduce_scatter(send, recv, count_per_rank); });
}

CommRequest Communicator::batch_p2p(const std::vector<P2POp>& ops) {
  std::size_t count = 0;
  for (const P2POp& op : ops) {
    require(op.peer >= 0 && op.peer < size_, "Communicator '" + name_ + "': point-to-point peer " +
                                                 std::to_string(op.peer) + " is not a rank of a group of " +
                                                 std::to_string(size_));
    count += op.count;
  }
  return detail::nonblocking(*impl_, stats_, detail::real_bytes(count), [&] { return impl_->batch_p2p(ops); });
}

CommRequest Communicator::isend(const real* buf, std::size_t count, int peer, int tag) {
  return batch_p2p({{P2POp::Kind::send, const_cast<real*>(buf), count, peer, tag}});
}

CommRequest Communicator::irecv(real* buf, std::size_t count, int peer, int tag) {
  return batch_p2p({{P2POp::Kind::recv, buf, count, peer, tag}});
}

// Host scalars go over MPI whatever the backend: NCCL wants device buffers,
// and a round trip through device memory costs more than the reduction.
double Communicator::all_reduce_scalar(double value, ReduceOp op) {
  auto t0 = detail::Clock::now();
  double out = 0;
  detail::mpi_check(MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, detail::mpi_op(op), comm_), "MPI_Allreduce");
  double ms = detail::ms_between(t0, detail::Clock::now());
  stats_.calls += 1;
  stats_.bytes += sizeof(double);
  stats_.ms += ms;
  stats_.exposed_ms += ms;
  return out;
}

}  // namespace ndmini
