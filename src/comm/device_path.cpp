// SPDX-License-Identifier: BSD-3-Clause
// How collectives reach device buffers: the MPI backend's direct or staged
// path (device_path.hpp), and the choice between NCCL and MPI for the axes.
#include "comm/device_path.hpp"

#if defined(OPEN_MPI) && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_CUDA_AWARE_SUPPORT and MPIX_Query_cuda_support
#endif
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_backend.hpp"
#include "core/error.hpp"

#ifdef NDMINI_HAVE_NCCL
#include "comm/nccl/nccl_backend.hpp"
#endif

namespace ndmini {
namespace detail {
namespace {

// Page-locked host memory where there is a GPU: copies run at full link
// speed and an MPI may register it for RDMA.
#ifdef KOKKOS_ENABLE_CUDA
using StagingSpace = Kokkos::CudaHostPinnedSpace;
#else
using StagingSpace = HostSpace;
#endif
using StagingView = Kokkos::View<real*, Kokkos::LayoutRight, StagingSpace>;

// Copies on Kokkos' stream, then a fence of that stream only: a global fence
// (two-argument deep_copy) would also wait for NCCL's streams, collectives of
// other axes still in flight. The host may reuse `host` once they return.
// T: real, or bf16 (bf16 sums).
template <class T>
void to_host(T* host, const T* device, std::size_t n) {
  if (n == 0) return;
  const ExecSpace exec;
  Kokkos::deep_copy(exec, Kokkos::View<T*, Kokkos::LayoutRight, StagingSpace, Unmanaged>(host, n),
                    Kokkos::View<const T*, Kokkos::LayoutRight, MemSpace, Unmanaged>(device, n));
  exec.fence();
}
template <class T>
void to_device(T* device, const T* host, std::size_t n) {
  if (n == 0) return;
  const ExecSpace exec;
  Kokkos::deep_copy(exec, Kokkos::View<T*, Kokkos::LayoutRight, MemSpace, Unmanaged>(device, n),
                    Kokkos::View<const T*, Kokkos::LayoutRight, StagingSpace, Unmanaged>(host, n));
  exec.fence();
}

// What the MPI says about device memory: 1 it reads it, 0 it does not, -1 it cannot tell.
int ask_mpi(std::string& how) {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
#if MPIX_CUDA_AWARE_SUPPORT
  how = "Open MPI's MPIX_Query_cuda_support()";
  return MPIX_Query_cuda_support() == 1 ? 1 : 0;
#else
  how = "Open MPI built without CUDA support";
  return 0;
#endif
#elif defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40000000
  how = "MPICH's MPIX_Query_cuda_support()";
  return MPIX_Query_cuda_support() == 1 ? 1 : 0;
#else
  // MPICH 3 derivatives: their own switches say it.
  for (const char* var : {"MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::string(v) == "1") {
      how = std::string(var) + "=1";
      return 1;
    }
  }
  how = "this MPI has no MPIX_Query_cuda_support()";
  return -1;
#endif
}

struct Choice {
  bool staged = false;
  std::string line;  // what world rank 0 prints; empty: nothing to say (host memory)
};

const Choice& choice() {
  static const Choice c = [] {
    const char* env = std::getenv("NDMINI_MPI_CUDA_AWARE");
    if (env != nullptr && *env != '\0') {
      const std::string v(env);
      require(v == "0" || v == "1", "NDMINI_MPI_CUDA_AWARE='" + v +
                                        "' must be 1 (MPI reads device memory itself) or 0 (stage device buffers "
                                        "through host memory); unset, ndmini asks the MPI");
      if (v == "1")
        return Choice{false, kDeviceMemory ? "MPI on device buffers: direct (NDMINI_MPI_CUDA_AWARE=1)" : ""};
      return Choice{true, "MPI on device buffers: staged through host memory (NDMINI_MPI_CUDA_AWARE=0)"};
    }
    if (!kDeviceMemory) return Choice{false, ""};  // host memory: MPI reads it whatever it is
    std::string how;
    const int aware = ask_mpi(how);
    if (aware == 1) return Choice{false, "MPI on device buffers: direct, CUDA-aware MPI (" + how + ")"};
    return Choice{true, "MPI on device buffers: staged through pinned host memory (" +
                            (aware == 0 ? "not CUDA-aware, says " : std::string()) + how +
                            "; set NDMINI_MPI_CUDA_AWARE=1 if this MPI reads GPU memory)"};
  }();
  return c;
}

// Says each line once per process, on world rank 0.
void say_once(const std::string& line) {
  static std::vector<std::string> said;
  if (line.empty()) return;
  for (const std::string& s : said)
    if (s == line) return;
  said.push_back(line);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::printf("ndmini: %s\n", line.c_str());
    std::fflush(stdout);
  }
}

std::size_t g_staged = 0;  // buffers staged so far (staged_buffers())

// Host buffers lent to transfers in flight and kept for the next ones, so a
// training step allocates nothing once the pool has grown to its needs.
class StagingPool {
 public:
  // A free buffer of at least n floats; give it back with release(slot).
  real* acquire(std::size_t n, int& slot) {
    int best = -1, any_free = -1;
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      if (slots_[i].busy) continue;
      any_free = i;
      if (slots_[i].view.extent(0) >= n && (best < 0 || slots_[i].view.extent(0) < slots_[best].view.extent(0)))
        best = i;
    }
    if (best < 0 && any_free >= 0) {  // grow a free one rather than add one
      best = any_free;
      slots_[best].view = StagingView();
      slots_[best].view = StagingView(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ndmini::mpi_staging"), n);
    }
    if (best < 0) {
      best = static_cast<int>(slots_.size());
      slots_.push_back({StagingView(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ndmini::mpi_staging"), n), false});
    }
    slots_[best].busy = true;
    slot = best;
    return slots_[best].view.data();
  }
  void release(int slot) { slots_[slot].busy = false; }

 private:
  struct Slot {
    StagingView view;
    bool busy;
  };
  std::vector<Slot> slots_;
};

// The host buffers of one call: lent on the way in, copied back to the
// device (receives) and returned on the way out.
class Staging {
 public:
  explicit Staging(StagingPool& pool) : pool_(&pool) {}
  Staging(Staging&&) = default;
  Staging& operator=(Staging&&) = default;
  ~Staging() { release(); }
  // A host copy of n device values (T: real or bf16).
  template <class T>
  T* in(const T* device, std::size_t n) {
    T* h = lend<T>(n);
    to_host(h, device, n);
    return h;
  }
  // A host buffer whose n values go to `device` at finish().
  template <class T>
  T* out(T* device, std::size_t n) {
    T* h = lend<T>(n);
    copies_.push_back({device, h, n, std::is_same_v<T, bf16>});
    return h;
  }
  // Both: a host copy that goes back.
  template <class T>
  T* in_out(T* device, std::size_t n) {
    T* h = in(device, n);
    copies_.push_back({device, h, n, std::is_same_v<T, bf16>});
    return h;
  }
  void finish() {
    for (const Copy& c : copies_) {
      if (c.bf16_values)
        to_device(static_cast<bf16*>(c.device), static_cast<const bf16*>(c.host), c.n);
      else
        to_device(static_cast<real*>(c.device), static_cast<const real*>(c.host), c.n);
    }
    copies_.clear();
    release();
  }

 private:
  struct Copy {
    void* device;
    const void* host;
    std::size_t n;
    bool bf16_values;
  };
  // The pool lends floats: n values of T take ceil(n sizeof(T) / sizeof(real)) of them.
  template <class T>
  T* lend(std::size_t n) {
    static_assert(sizeof(real) % sizeof(T) == 0, "values pack whole into the pool's floats");
    ++g_staged;
    int slot = 0;
    real* h = pool_->acquire((n * sizeof(T) + sizeof(real) - 1) / sizeof(real), slot);
    slots_.push_back(slot);
    return reinterpret_cast<T*>(h);
  }
  void release() {
    for (int s : slots_) pool_->release(s);
    slots_.clear();
  }
  StagingPool* pool_;
  std::vector<int> slots_;
  std::vector<Copy> copies_;
};

// A staged non-blocking call: the MPI request on host buffers, then the
// copies back to the device once it completes (in wait or a successful test).
class StagedRequest final : public CommRequest::Impl {
 public:
  StagedRequest(std::unique_ptr<CommRequest::Impl> mpi, Staging staging)
      : mpi_(std::move(mpi)), staging_(std::move(staging)) {}
  bool moved_by_mpi() const override { return mpi_->moved_by_mpi(); }
  bool mpi_transfer_done() const override { return mpi_->mpi_transfer_done(); }

 protected:
  void wait_backend() override {
    mpi_->wait();
    staging_.finish();
  }
  bool test_backend() override {
    if (!mpi_->test()) return false;
    staging_.finish();
    return true;
  }
  // abort_backend and yield_while_polling keep the defaults, as the MPI
  // request underneath does: nothing to abort, and this rank moves the data.

 private:
  std::unique_ptr<CommRequest::Impl> mpi_;  // no stats: the outer request accounts
  Staging staging_;
};

// The MPI backend with every device buffer staged through host memory.
class StagedMpiBackend final : public SumsOverElementType<StagedMpiBackend> {
 public:
  StagedMpiBackend(std::unique_ptr<Communicator::BackendImpl> mpi, int size, int rank)
      : mpi_(std::move(mpi)), size_(size), rank_(rank) {}

  std::unique_ptr<CommRequest::Impl> ireduce_scatter(const bf16* send, bf16* recv,
                                                     std::size_t count_per_rank) override {
    return ireduce_scatter_of(send, recv, count_per_rank);
  }

  void all_gather(const real* send, real* recv, std::size_t count_per_rank) override {
    Staging s(pool_);
    real* h = gather_buffer(s, send, recv, count_per_rank);
    mpi_->all_gather(h + rank_ * count_per_rank, h, count_per_rank);
    s.finish();
  }
  void broadcast(real* buf, std::size_t count, int root) override {
    Staging s(pool_);
    mpi_->broadcast(s.in_out(buf, count), count, root);
    s.finish();
  }
  std::unique_ptr<CommRequest::Impl> ibroadcast(real* buf, std::size_t count, int root) override {
    Staging s(pool_);
    auto r = mpi_->ibroadcast(s.in_out(buf, count), count, root);
    return std::make_unique<StagedRequest>(std::move(r), std::move(s));
  }
  void send(const real* buf, std::size_t count, int peer, int tag) override {
    Staging s(pool_);
    mpi_->send(s.in(buf, count), count, peer, tag);
  }
  void recv(real* buf, std::size_t count, int peer, int tag) override {
    Staging s(pool_);
    mpi_->recv(s.out(buf, count), count, peer, tag);
    s.finish();
  }

  std::unique_ptr<CommRequest::Impl> iall_gather(const real* send, real* recv, std::size_t count_per_rank) override {
    Staging s(pool_);
    real* h = gather_buffer(s, send, recv, count_per_rank);
    auto r = mpi_->iall_gather(h + rank_ * count_per_rank, h, count_per_rank);
    return std::make_unique<StagedRequest>(std::move(r), std::move(s));
  }
  std::unique_ptr<CommRequest::Impl> batch_p2p(const std::vector<P2POp>& ops) override {
    Staging s(pool_);
    std::vector<P2POp> host_ops = ops;
    for (P2POp& op : host_ops) op.buf = op.kind == P2POp::Kind::send ? s.in(op.buf, op.count) : s.out(op.buf, op.count);
    auto r = mpi_->batch_p2p(host_ops);
    return std::make_unique<StagedRequest>(std::move(r), std::move(s));
  }

 private:
  // The sums, written once over the element type T (real or bf16).
  friend struct SumsOverElementType<StagedMpiBackend>;
  template <class T>
  void all_reduce_of(T* buf, std::size_t count, ReduceOp op) {
    Staging s(pool_);
    mpi_->all_reduce(s.in_out(buf, count), count, op);
    s.finish();
  }
  template <class T>
  void reduce_scatter_of(const T* send, T* recv, std::size_t count_per_rank) {
    Staging s(pool_);
    const T* hs = s.in(send, size_ * count_per_rank);
    mpi_->reduce_scatter(hs, s.out(recv, count_per_rank), count_per_rank);
    s.finish();
  }
  template <class T>
  std::unique_ptr<CommRequest::Impl> iall_reduce_of(T* buf, std::size_t count, ReduceOp op) {
    Staging s(pool_);
    auto r = mpi_->iall_reduce(s.in_out(buf, count), count, op);
    return std::make_unique<StagedRequest>(std::move(r), std::move(s));
  }
  template <class T>
  std::unique_ptr<CommRequest::Impl> ireduce_scatter_of(const T* send, T* recv, std::size_t count_per_rank) {
    Staging s(pool_);
    const T* hs = s.in(send, size_ * count_per_rank);
    auto r = mpi_->ireduce_scatter(hs, s.out(recv, count_per_rank), count_per_rank);
    return std::make_unique<StagedRequest>(std::move(r), std::move(s));
  }

  // The blocks keep their displacements on the host: the copies span from
  // each buffer's start to the end of its last block.
  template <class T>
  std::unique_ptr<CommRequest::Impl> iall_to_all_v_of(const T* send, T* recv, const AllToAllCounts& counts) {
    require_mpi_all_to_all_counts(counts);  // refuse before copying what MPI cannot take
    Staging s(pool_);
    const T* hs = s.in(send, span(counts.send_counts, counts.send_displs));
    const std::size_t recv_span = span(counts.recv_counts, counts.recv_displs);
    // recv is written only inside its blocks: where they leave gaps, the
    // device's values travel there and back unchanged.
    T* hr = counts.recv_total() == recv_span ? s.out(recv, recv_span) : s.in_out(recv, recv_span);
    auto r = mpi_->iall_to_all_v(hs, hr, counts);
    return std::make_unique<StagedRequest>(std::move(r), std::move(s));
  }
  static std::size_t span(const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs) {
    std::size_t end = 0;
    for (std::size_t r = 0; r < counts.size(); ++r)
      if (counts[r] > 0) end = std::max(end, displs[r] + counts[r]);
    return end;
  }

  // The gathered buffer on the host, this rank's block already in place (an
  // in-place gather, whether or not `send` lies inside `recv`).
  real* gather_buffer(Staging& s, const real* send, real* recv, std::size_t count_per_rank) {
    real* h = s.out(recv, size_ * count_per_rank);
    to_host(h + rank_ * count_per_rank, send, count_per_rank);
    return h;
  }

  std::unique_ptr<Communicator::BackendImpl> mpi_;
  int size_, rank_;
  StagingPool pool_;
};

}  // namespace

std::unique_ptr<Communicator::BackendImpl> with_device_path(std::unique_ptr<Communicator::BackendImpl> mpi,
                                                            MPI_Comm comm, const std::string& /*name*/) {
  const Choice& c = choice();
  say_once(c.line);
  if (!c.staged) return mpi;
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  return std::make_unique<StagedMpiBackend>(std::move(mpi), size, rank);
}

std::string mpi_device_path_description() { return choice().line; }

std::size_t staged_buffers() { return g_staged; }

}  // namespace detail

Communicator::Backend device_collectives_backend(MPI_Comm world) {
  const char* env = std::getenv("NDMINI_COMM_BACKEND");
  const std::string forced = env != nullptr ? env : "";
  require(forced.empty() || forced == "mpi" || forced == "nccl",
          "NDMINI_COMM_BACKEND='" + forced + "' must be mpi or nccl (unset: NCCL where it can run)");
  if (forced == "mpi") return Communicator::Backend::mpi;
  if (forced == "nccl") {
    require(nccl_available(),
            "NDMINI_COMM_BACKEND=nccl but this build has no NCCL backend; reconfigure with "
            "-DNDMINI_ENABLE_NCCL=ON (needs NCCL and the CUDA toolkit) or unset it");
    return Communicator::Backend::nccl;
  }
  // NCCL moves device memory only: a host build keeps MPI.
  if (!nccl_available() || !kDeviceMemory) return Communicator::Backend::mpi;
#ifdef NDMINI_HAVE_NCCL
  const std::string problem = detail::nccl_device_problem(world);
  if (!problem.empty()) {
    detail::say_once("NCCL not used: " + problem + "; the mesh axes use MPI");
    return Communicator::Backend::mpi;
  }
  return Communicator::Backend::nccl;
#else
  (void)world;
  return Communicator::Backend::mpi;
#endif
}

}  // namespace ndmini
