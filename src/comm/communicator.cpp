// SPDX-License-Identifier: BSD-3-Clause
// The Communicator: accounting and dispatch around a backend, and the MPI
// backend (host or device buffers; device buffers go to a CUDA-aware MPI
// directly, else through host memory: comm/device_path.hpp).
#include "comm/communicator.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "comm/backend.hpp"
#include "comm/device_path.hpp"
#include "comm/ledger.hpp"
#include "comm/progress.hpp"
#include "core/error.hpp"
#include "core/profiling.hpp"

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

std::string nccl_version() {
#ifdef NDMINI_HAVE_NCCL
  return detail::nccl_library_version();
#else
  return "";
#endif
}

// --- CommRequest -------------------------------------------------------------

CommRequest::Impl::~Impl() {
  if (progress_counted) detail::mpi_request_finished(this);
}

void CommRequest::Impl::finish(detail::Clock::time_point now) {
  done = true;
  if (progress_counted) detail::mpi_request_finished(this);
  progress_counted = false;
  detail::ledger_complete(ledger_index);
  if (stats) {
    stats->ms += detail::ms_between(start, now);
    stats->exposed_ms += blocked_ms;
  }
}

void CommRequest::Impl::wait() {
  if (done) return;
  const ProfileRegion region([&] {
    const auto entries = detail::ledger_entries();
    for (const auto& e : entries)
      if (e.index == ledger_index)
        return "ndmini::comm " + detail::comm_name(e.comm) + " wait for " + detail::coll_op_name(e.op);
    return std::string("ndmini::comm wait");
  });
  auto t0 = detail::Clock::now();
  if (detail::watch_timeout_s() > 0) {
    // The deadline counts from the start of the wait: a request issued early
    // and waited for late is not a hang.
    const detail::WaitScope scope(ledger_index);
    if (scope.polls()) {
      while (!test_backend()) {
        scope.poll([&] { abort_backend(); });  // does not return once the deadline passed
        if (yield_while_polling()) std::this_thread::yield();
      }
    } else {
      wait_backend();  // the watchdog's monitor thread keeps the deadline
    }
  } else {
    wait_backend();
  }
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

// Completion (test, wait) holds detail::mpi_request_mutex(): the progress
// thread may be looking at the request (CommRequest::Impl::mpi_transfer_done).
class MpiRequest final : public CommRequest::Impl {
 public:
  MPI_Request request = MPI_REQUEST_NULL;
  bool moved_by_mpi() const override { return true; }
  bool mpi_transfer_done() const override { return transfer_done(request); }

  // MPI_Request_get_status on a copy of the handle (it does not free it).
  static bool transfer_done(MPI_Request r) {
    int flag = 1;
    if (r != MPI_REQUEST_NULL) MPI_Request_get_status(r, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }

 protected:
  void wait_backend() override {
    const std::lock_guard<std::mutex> lock(mpi_request_mutex());
    mpi_check(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  bool test_backend() override {
    const std::lock_guard<std::mutex> lock(mpi_request_mutex());
    int flag = 0;
    mpi_check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  }
};

// Several point-to-point requests completed together.
class MpiRequests final : public CommRequest::Impl {
 public:
  std::vector<MPI_Request> requests;
  bool moved_by_mpi() const override { return true; }
  bool mpi_transfer_done() const override {
    return std::all_of(requests.begin(), requests.end(), MpiRequest::transfer_done);
  }

 protected:
  void wait_backend() override {
    const std::lock_guard<std::mutex> lock(mpi_request_mutex());
    mpi_check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
  bool test_backend() override {
    const std::lock_guard<std::mutex> lock(mpi_request_mutex());
    int flag = 0;
    mpi_check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    return flag != 0;
  }
};

// MPI_Allreduce and MPI_Bcast of more than kMaxPieceBytes are sent as
// several calls of at most that size, issued together (non-blocking) or one
// after the other (blocking). MPICH 4.0 on this project's machines takes ten
// times longer per byte for one call above 32 MiB than below (its temporary
// buffers then come from mmap and are faulted in afresh on every call); the
// pieces keep every call below that, and cost nothing measurable at the
// sizes where one call was fine.
constexpr std::size_t kMaxPieceBytes = std::size_t{16} << 20;
constexpr std::size_t kPieceCount = kMaxPieceBytes / sizeof(real);

// Calls f(offset, count) for each piece of [0, count); once for count 0, so
// every rank still takes part.
template <class F>
void for_pieces(std::size_t count, F&& f) {
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(kPieceCount, count - offset);
    f(offset, n);
    offset += n;
  } while (offset < count);
}

// MPI libraries allocate temporary buffers per collective (MPICH: one the
// size of the message for an all-reduce), and glibc gives freed memory back
// to the system once more than a few MiB are free at the top of the heap, or
// right away for blocks above its mmap threshold. Every step then faults
// the same buffers in afresh: 7000 page faults per step on one rank of
// 2-rank data parallelism of small.toml (7 buckets of 7 MB in flight), at
// about 3 us each in a virtual machine, and the other rank waits for it.
// Keeping freed memory in the process removes them (0 faults per step after
// the first); it also keeps FSDP's per-unit gathered buffers resident. The
// cost is that the process's RSS stays at its high-water mark. glibc only;
// left alone when the user tunes malloc through its environment variables.
void keep_freed_memory() {
#if defined(__GLIBC__)
  static bool done = false;
  if (done) return;
  done = true;
  for (const char* var : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"})
    if (std::getenv(var) != nullptr) return;
  constexpr int kLargestHeapBlock = 32 << 20;  // glibc's ceiling for the mmap threshold on 64-bit
  mallopt(M_MMAP_THRESHOLD, kLargestHeapBlock);
  mallopt(M_TRIM_THRESHOLD, -1);  // never trim the heap
#endif
}

class MpiBackend final : public Communicator::BackendImpl {
 public:
  MpiBackend(MPI_Comm comm, int rank) : comm_(comm), rank_(rank) { keep_freed_memory(); }

  void all_reduce(real* buf, std::size_t count, ReduceOp op) override {
    for_pieces(count, [&](std::size_t at, std::size_t n) {
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf + at, mpi_count(n, "MPI_Allreduce"), MPI_FLOAT, mpi_op(op), comm_),
                "MPI_Allreduce");
    });
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
    for_pieces(count, [&](std::size_t at, std::size_t n) {
      mpi_check(MPI_Bcast(buf + at, mpi_count(n, "MPI_Bcast"), MPI_FLOAT, root, comm_), "MPI_Bcast");
    });
  }
  void send(const real* buf, std::size_t count, int peer, int tag) override {
    mpi_check(MPI_Send(buf, mpi_count(count, "MPI_Send"), MPI_FLOAT, peer, tag, comm_), "MPI_Send");
  }
  void recv(real* buf, std::size_t count, int peer, int tag) override {
    mpi_check(MPI_Recv(buf, mpi_count(count, "MPI_Recv"), MPI_FLOAT, peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  }

  std::unique_ptr<CommRequest::Impl> iall_reduce(real* buf, std::size_t count, ReduceOp op) override {
    auto r = std::make_unique<MpiRequests>();
    for_pieces(count, [&](std::size_t at, std::size_t n) {
      r->requests.push_back(MPI_REQUEST_NULL);
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf + at, mpi_count(n, "MPI_Iallreduce"), MPI_FLOAT, mpi_op(op), comm_,
                               &r->requests.back()),
                "MPI_Iallreduce");
    });
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
  std::unique_ptr<CommRequest::Impl> ibroadcast(real* buf, std::size_t count, int root) override {
    auto r = std::make_unique<MpiRequests>();
    for_pieces(count, [&](std::size_t at, std::size_t n) {
      r->requests.push_back(MPI_REQUEST_NULL);
      mpi_check(MPI_Ibcast(buf + at, mpi_count(n, "MPI_Ibcast"), MPI_FLOAT, root, comm_, &r->requests.back()),
                "MPI_Ibcast");
    });
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
  ledger_id_ = detail::register_comm(comm_, name_);
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

// Where a collective is issued: the communicator's accounting, its place in
// the ledger, and whether compute must be fenced first (not where the backend
// orders its transfers after the compute on the device: NCCL).
struct Site {
  CommStats& stats;
  int comm;
  std::uint64_t& seq;
  bool fence = true;
};

// Issues a non-blocking call whose ledger entry is `index`: calls and bytes
// are counted now; ms and exposed_ms when it completes (wait, a successful
// test, or its destructor).
// `background`: the caller computes while it is in flight, so MPI's transfers
// are counted for the progress thread (comm/progress.hpp).
template <class Issue>
CommRequest start(Site site, std::uint64_t index, std::int64_t bytes, Issue&& issue, bool background) {
  auto t0 = Clock::now();
  std::unique_ptr<CommRequest::Impl> r = issue();
  if (background && r->moved_by_mpi()) {
    mpi_request_started(r.get());
    r->progress_counted = true;
  }
  r->stats = &site.stats;
  r->start = t0;
  r->blocked_ms = ms_between(t0, Clock::now());  // issuing blocks the caller too
  r->ledger_index = index;
  site.stats.calls += 1;
  site.stats.bytes += bytes;
  return CommRequest(std::move(r));
}

// Blocking calls: the caller waits for the whole call, so exposed == ms.
// Under a watchdog's deadline the call is issued non-blocking and waited for
// (CommRequest::Impl::wait), since a blocking MPI call cannot be timed out.
template <class Call, class Issue>
void blocking(Site site, CollOp op, std::int64_t bytes, Call&& call, Issue&& issue) {
  const ProfileRegion region([&] { return "ndmini::comm " + comm_name(site.comm) + " " + coll_op_name(op); });
  if (site.fence) fence_compute();
  const std::uint64_t index = ledger_record(site.comm, site.seq++, op, bytes, true);
  if (watch_timeout_s() > 0) {
    CommStats own;  // the whole call is exposed, issue to completion, as below
    start({own, site.comm, site.seq}, index, bytes, issue, /*background=*/false).wait();
    own.exposed_ms = own.ms;
    site.stats += own;
    return;
  }
  auto t0 = Clock::now();
  call();
  double ms = ms_between(t0, Clock::now());
  ledger_complete(index);
  site.stats.calls += 1;
  site.stats.bytes += bytes;
  site.stats.ms += ms;
  site.stats.exposed_ms += ms;
}

template <class Issue>
CommRequest nonblocking(Site site, CollOp op, std::int64_t bytes, Issue&& issue) {
  if (site.fence) fence_compute();
  const std::uint64_t index = ledger_record(site.comm, site.seq++, op, bytes, false);
  return start(site, index, bytes, issue, /*background=*/true);
}

}  // namespace
}  // namespace detail

bool Communicator::skip(const char* op) {
  if (!skip_next_) return false;
  skip_next_ = false;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr, "ndmini: fault injection: rank %d skips %s on '%s' (it would have been #%llu there)\n",
               world_rank, op, name_.c_str(), static_cast<unsigned long long>(seq_));
  std::fflush(stderr);
  return true;
}

void Communicator::all_reduce(real* buf, std::size_t count, ReduceOp op) {
  if (skip("all_reduce")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_reduce, detail::real_bytes(count),
      [&] { impl_->all_reduce(buf, count, op); }, [&] { return impl_->iall_reduce(buf, count, op); });
}

void Communicator::all_gather(const real* send, real* recv, std::size_t count_per_rank) {
  if (skip("all_gather")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_gather,
      detail::real_bytes(static_cast<std::size_t>(size_) * count_per_rank),
      [&] { impl_->all_gather(send, recv, count_per_rank); },
      [&] { return impl_->iall_gather(send, recv, count_per_rank); });
}

void Communicator::reduce_scatter(const real* send, real* recv, std::size_t count_per_rank) {
  if (skip("reduce_scatter")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::reduce_scatter,
      detail::real_bytes(static_cast<std::size_t>(size_) * count_per_rank),
      [&] { impl_->reduce_scatter(send, recv, count_per_rank); },
      [&] { return impl_->ireduce_scatter(send, recv, count_per_rank); });
}

void Communicator::broadcast(real* buf, std::size_t count, int root) {
  require(root >= 0 && root < size_, "Communicator '" + name_ + "': broadcast root " + std::to_string(root) +
                                         " is not a rank of a group of " + std::to_string(size_));
  if (skip("broadcast")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::broadcast, detail::real_bytes(count),
      [&] { impl_->broadcast(buf, count, root); }, [&] { return impl_->ibroadcast(buf, count, root); });
}

void Communicator::send(const real* buf, std::size_t count, int peer, int tag) {
  if (skip("send")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::send, detail::real_bytes(count),
      [&] { impl_->send(buf, count, peer, tag); },
      [&] {
        return impl_->batch_p2p({{P2POp::Kind::send, const_cast<real*>(buf), count, peer, tag}});
      });
}

void Communicator::recv(real* buf, std::size_t count, int peer, int tag) {
  if (skip("recv")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::recv, detail::real_bytes(count),
      [&] { impl_->recv(buf, count, peer, tag); },
      [&] {
        return impl_->batch_p2p({{P2POp::Kind::recv, buf, count, peer, tag}});
      });
}

CommRequest Communicator::iall_reduce(real* buf, std::size_t count, ReduceOp op) {
  if (skip("all_reduce")) return CommRequest();
  return detail::nonblocking({stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_reduce,
                             detail::real_bytes(count), [&] { return impl_->iall_reduce(buf, count, op); });
}

CommRequest Communicator::iall_gather(const real* send, real* recv, std::size_t count_per_rank) {
  if (skip("all_gather")) return CommRequest();
  return detail::nonblocking({stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_gather,
                             detail::real_bytes(static_cast<std::size_t>(size_) * count_per_rank),
                             [&] { return impl_->iall_gather(send, recv, count_per_rank); });
}

CommRequest Communicator::ireduce_scatter(const real* send, real* recv, std::size_t count_per_rank) {
  if (skip("reduce_scatter")) return CommRequest();
  return detail::nonblocking({stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::reduce_scatter,
                             detail::real_bytes(static_cast<std::size_t>(size_) * count_per_rank),
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
  if (skip("p2p")) return CommRequest();
  return detail::nonblocking({stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::p2p,
                             detail::real_bytes(count), [&] { return impl_->batch_p2p(ops); });
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
  if (skip("all_reduce_scalar")) return value;
  double out = 0;
  detail::blocking(
      // host values: nothing on the device to wait for
      {stats_, ledger_id_, seq_, /*fence=*/false}, detail::CollOp::all_reduce_scalar, sizeof(double),
      [&] {
        detail::mpi_check(MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, detail::mpi_op(op), comm_), "MPI_Allreduce");
      },
      [&] {
        auto r = std::make_unique<detail::MpiRequest>();
        detail::mpi_check(MPI_Iallreduce(&value, &out, 1, MPI_DOUBLE, detail::mpi_op(op), comm_, &r->request),
                          "MPI_Iallreduce");
        return r;
      });
  return out;
}

std::vector<CollectiveRecord> Communicator::recent_collectives() const {
  std::vector<CollectiveRecord> out;
  for (const auto& e : detail::ledger_entries())
    if (e.comm == ledger_id_)
      out.push_back({e.index, e.seq, detail::coll_op_name(e.op), e.bytes, e.blocking, e.complete});
  return out;
}

}  // namespace ndmini
