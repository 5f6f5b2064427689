// SPDX-License-Identifier: BSD-3-Clause
// The Communicator: accounting and dispatch around a backend (MPI:
// comm/mpi/mpi_backend.hpp; NCCL: comm/nccl/nccl_backend.hpp).
#include "comm/communicator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "comm/backend.hpp"
#include "comm/device_path.hpp"
#include "comm/ledger.hpp"
#include "comm/mpi/mpi_backend.hpp"
#include "comm/progress.hpp"
#include "core/error.hpp"
#include "core/profiling.hpp"

#ifdef NDMINI_HAVE_NCCL
#include "comm/nccl/nccl_backend.hpp"
#endif

namespace ndmini {
namespace {

// A reduce-scatter whose sum is dropped (fault injection): recv gets this
// rank's own block of send, as if the rank were alone in its group.
template <class T>
void own_block(const T* send, T* recv, std::size_t count_per_rank, int rank) {
  Kokkos::deep_copy(Kokkos::View<T*, MemSpace, Unmanaged>(recv, count_per_rank),
                    Kokkos::View<const T*, MemSpace, Unmanaged>(send + rank * count_per_rank, count_per_rank));
}

}  // namespace

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

void CommRequest::Impl::finish(Clock::time_point now) {
  done = true;
  if (progress_counted) detail::mpi_request_finished(this);
  progress_counted = false;
  detail::ledger_complete(ledger_index);
  if (stats) {
    stats->ms += ms_between(start, now);
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
  auto t0 = Clock::now();
  if (detail::watch_timeout_s() > 0) {
    // The deadline counts from the start of the wait: a request issued early
    // and waited for late is not a hang.
    const detail::WaitScope scope(ledger_index);
    // On a node of more threads than cores, a rank spinning in MPI_Wait holds
    // a core the rank it waits for needs: test and sleep instead (ledger.hpp).
    const bool nap = moved_by_mpi() && detail::waits_share_cores();
    if (scope.polls() || nap) {
      while (!test_backend()) {
        scope.poll([&] { abort_backend(); });  // does not return once the deadline passed
        if (nap)
          std::this_thread::sleep_for(detail::kSharedCoreNap);
        else if (yield_while_polling())
          std::this_thread::yield();
      }
    } else {
      wait_backend();  // the watchdog's monitor thread keeps the deadline
    }
  } else {
    wait_backend();
  }
  auto t1 = Clock::now();
  blocked_ms += ms_between(t0, t1);
  finish(t1);
}

bool CommRequest::Impl::test() {
  if (done) return true;
  auto t0 = Clock::now();
  bool complete = test_backend();
  auto t1 = Clock::now();
  // Polling is time the caller spent on communication too, however short.
  blocked_ms += ms_between(t0, t1);
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

namespace detail {
namespace {

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
    impl_ = detail::with_device_path(detail::make_mpi_backend(comm_, rank_), comm_, name_);
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

template <class T = real>
std::int64_t bytes_of(std::size_t count) {
  return static_cast<std::int64_t>(count * sizeof(T));
}

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

void Communicator::drop_sums_for_fault_injection() {
  drop_sums_ = true;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr, "ndmini: fault injection: rank %d drops its sums on '%s' from here on\n", world_rank,
               name_.c_str());
  std::fflush(stderr);
}

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

namespace {

// Sums of bf16 values take only ReduceOp::sum (the MPI backend's bf16 operation is a sum).
template <class T>
void require_sum(ReduceOp op) {
  if (std::is_same_v<T, bf16> && op != ReduceOp::sum) throw InternalError("a bf16 all-reduce can only sum");
}

}  // namespace

template <class T>
void Communicator::all_reduce(T* buf, std::size_t count, ReduceOp op) {
  require_sum<T>(op);
  if (skip_sum("all_reduce")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_reduce, detail::bytes_of<T>(count),
      [&] { impl_->all_reduce(buf, count, op); }, [&] { return impl_->iall_reduce(buf, count, op); });
}

void Communicator::all_gather(const real* send, real* recv, std::size_t count_per_rank) {
  if (skip("all_gather")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_gather,
      detail::bytes_of(static_cast<std::size_t>(size_) * count_per_rank),
      [&] { impl_->all_gather(send, recv, count_per_rank); },
      [&] { return impl_->iall_gather(send, recv, count_per_rank); });
}

template <class T>
void Communicator::reduce_scatter(const T* send, T* recv, std::size_t count_per_rank) {
  if (drop_sums_) return own_block(send, recv, count_per_rank, rank_);
  if (skip("reduce_scatter")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::reduce_scatter,
      detail::bytes_of<T>(static_cast<std::size_t>(size_) * count_per_rank),
      [&] { impl_->reduce_scatter(send, recv, count_per_rank); },
      [&] { return impl_->ireduce_scatter(send, recv, count_per_rank); });
}

void Communicator::broadcast(real* buf, std::size_t count, int root) {
  require(root >= 0 && root < size_, "Communicator '" + name_ + "': broadcast root " + std::to_string(root) +
                                         " is not a rank of a group of " + std::to_string(size_));
  if (skip("broadcast")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::broadcast, detail::bytes_of(count),
      [&] { impl_->broadcast(buf, count, root); }, [&] { return impl_->ibroadcast(buf, count, root); });
}

void Communicator::send(const real* buf, std::size_t count, int peer, int tag) {
  if (skip("send")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::send, detail::bytes_of(count),
      [&] { impl_->send(buf, count, peer, tag); },
      [&] {
        return impl_->batch_p2p({{P2POp::Kind::send, const_cast<real*>(buf), count, peer, tag}});
      });
}

void Communicator::recv(real* buf, std::size_t count, int peer, int tag) {
  if (skip("recv")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::recv, detail::bytes_of(count),
      [&] { impl_->recv(buf, count, peer, tag); },
      [&] {
        return impl_->batch_p2p({{P2POp::Kind::recv, buf, count, peer, tag}});
      });
}

template <class T>
CommRequest Communicator::iall_reduce(T* buf, std::size_t count, ReduceOp op) {
  require_sum<T>(op);
  if (skip_sum("all_reduce")) return CommRequest();
  return detail::nonblocking({stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_reduce,
                             detail::bytes_of<T>(count), [&] { return impl_->iall_reduce(buf, count, op); });
}

CommRequest Communicator::iall_gather(const real* send, real* recv, std::size_t count_per_rank) {
  if (skip("all_gather")) return CommRequest();
  return detail::nonblocking({stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_gather,
                             detail::bytes_of(static_cast<std::size_t>(size_) * count_per_rank),
                             [&] { return impl_->iall_gather(send, recv, count_per_rank); });
}

namespace {

// bf16 values travel as fp32 slots, two to one: a gather moves bits only.
std::size_t fp32_slots(std::size_t bf16_values) {
  static_assert(sizeof(real) == 2 * sizeof(bf16), "two bf16 values fill one fp32 slot");
  if (bf16_values % 2 != 0)
    throw InternalError("a bf16 all-gather moves an even count per rank, not " + std::to_string(bf16_values));
  return bf16_values / 2;
}

}  // namespace

void Communicator::all_gather(const bf16* send, bf16* recv, std::size_t count_per_rank) {
  all_gather(reinterpret_cast<const real*>(send), reinterpret_cast<real*>(recv), fp32_slots(count_per_rank));
}

CommRequest Communicator::iall_gather(const bf16* send, bf16* recv, std::size_t count_per_rank) {
  return iall_gather(reinterpret_cast<const real*>(send), reinterpret_cast<real*>(recv), fp32_slots(count_per_rank));
}

template <class T>
CommRequest Communicator::ireduce_scatter(const T* send, T* recv, std::size_t count_per_rank) {
  if (drop_sums_) {
    own_block(send, recv, count_per_rank, rank_);
    return CommRequest();
  }
  if (skip("reduce_scatter")) return CommRequest();
  return detail::nonblocking({stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::reduce_scatter,
                             detail::bytes_of<T>(static_cast<std::size_t>(size_) * count_per_rank),
                             [&] { return impl_->ireduce_scatter(send, recv, count_per_rank); });
}

template void Communicator::all_reduce<real>(real*, std::size_t, ReduceOp);
template void Communicator::all_reduce<bf16>(bf16*, std::size_t, ReduceOp);
template void Communicator::reduce_scatter<real>(const real*, real*, std::size_t);
template void Communicator::reduce_scatter<bf16>(const bf16*, bf16*, std::size_t);
template CommRequest Communicator::iall_reduce<real>(real*, std::size_t, ReduceOp);
template CommRequest Communicator::iall_reduce<bf16>(bf16*, std::size_t, ReduceOp);
template CommRequest Communicator::ireduce_scatter<real>(const real*, real*, std::size_t);
template CommRequest Communicator::ireduce_scatter<bf16>(const bf16*, bf16*, std::size_t);

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
                             detail::bytes_of(count), [&] { return impl_->batch_p2p(ops); });
}

namespace {

std::size_t sum_of(const std::vector<std::size_t>& counts) {
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  return total;
}

std::vector<std::size_t> prefix_sums(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> displs(counts.size());
  std::size_t at = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    displs[r] = at;
    at += counts[r];
  }
  return displs;
}

}  // namespace

AllToAllCounts AllToAllCounts::packed(std::vector<std::size_t> send_counts, std::vector<std::size_t> recv_counts) {
  AllToAllCounts c;
  c.send_displs = prefix_sums(send_counts);
  c.recv_displs = prefix_sums(recv_counts);
  c.send_counts = std::move(send_counts);
  c.recv_counts = std::move(recv_counts);
  return c;
}

std::size_t AllToAllCounts::send_total() const { return sum_of(send_counts); }
std::size_t AllToAllCounts::recv_total() const { return sum_of(recv_counts); }

void Communicator::check_layout(const AllToAllCounts& counts) const {
  const auto n = static_cast<std::size_t>(size_);
  require(counts.send_counts.size() == n && counts.send_displs.size() == n && counts.recv_counts.size() == n &&
              counts.recv_displs.size() == n,
          "Communicator '" + name_ + "': an all-to-all-v needs one count and one displacement per rank of its " +
              std::to_string(size_) + " (send: " + std::to_string(counts.send_counts.size()) + " and " +
              std::to_string(counts.send_displs.size()) + ", receive: " + std::to_string(counts.recv_counts.size()) +
              " and " + std::to_string(counts.recv_displs.size()) + ")");
}

template <class T>
void Communicator::all_to_all_v(const T* send, T* recv, const AllToAllCounts& counts) {
  check_layout(counts);
  if (skip("all_to_all_v")) return;
  detail::blocking(
      {stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_to_all_v,
      detail::bytes_of<T>(counts.send_total() + counts.recv_total()),
      // Only a non-blocking form in the backends: the blocking call waits for it.
      [&] { impl_->iall_to_all_v(send, recv, counts)->wait(); },
      [&] { return impl_->iall_to_all_v(send, recv, counts); });
}

template <class T>
CommRequest Communicator::iall_to_all_v(const T* send, T* recv, const AllToAllCounts& counts) {
  check_layout(counts);
  if (skip("all_to_all_v")) return CommRequest();
  return detail::nonblocking({stats_, ledger_id_, seq_, !impl_->orders_with_compute()}, detail::CollOp::all_to_all_v,
                             detail::bytes_of<T>(counts.send_total() + counts.recv_total()),
                             [&] { return impl_->iall_to_all_v(send, recv, counts); });
}

template void Communicator::all_to_all_v<real>(const real*, real*, const AllToAllCounts&);
template void Communicator::all_to_all_v<bf16>(const bf16*, bf16*, const AllToAllCounts&);
template CommRequest Communicator::iall_to_all_v<real>(const real*, real*, const AllToAllCounts&);
template CommRequest Communicator::iall_to_all_v<bf16>(const bf16*, bf16*, const AllToAllCounts&);

CommRequest Communicator::isend(const real* buf, std::size_t count, int peer, int tag) {
  return batch_p2p({{P2POp::Kind::send, const_cast<real*>(buf), count, peer, tag}});
}

CommRequest Communicator::irecv(real* buf, std::size_t count, int peer, int tag) {
  return batch_p2p({{P2POp::Kind::recv, buf, count, peer, tag}});
}

// Host scalars go over MPI whatever the backend: NCCL wants device buffers,
// and a round trip through device memory costs more than the reduction.
double Communicator::all_reduce_scalar(double value, ReduceOp op) {
  if (skip_sum("all_reduce_scalar")) return value;
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
