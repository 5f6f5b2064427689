// SPDX-License-Identifier: BSD-3-Clause
// NCCL backend: one NCCL communicator per Communicator (per mesh axis),
// bootstrapped over that axis's MPI communicator. See nccl_backend.hpp for
// the buffer, device, stream and watchdog rules.
#include "comm/nccl/nccl_backend.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/backend.hpp"
#include "comm/ledger.hpp"
#include "core/error.hpp"

namespace ndmini::detail {
namespace {

static_assert(std::is_same_v<real, float>, "the NCCL backend sends real as ncclFloat");

void cuda_check(cudaError_t rc, const char* call, const std::string& name) {
  if (rc == cudaSuccess) return;
  throw Error("Communicator '" + name + "': " + call + " failed: " + cudaGetErrorString(rc));
}

// Seconds a wait may take before the watchdog aborts, when no
// CollectiveWatchdog is alive (comm.timeout_s governs otherwise); 0 waits forever.
double timeout_from_env() {
  const char* s = std::getenv("NDMINI_NCCL_TIMEOUT_S");
  if (s == nullptr || *s == '\0') return 600.0;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  require(end != s && *end == '\0' && v >= 0,
          std::string("NDMINI_NCCL_TIMEOUT_S='") + s + "' is not a number of seconds >= 0 (0 disables the watchdog)");
  return v;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::max ? ncclMax : ncclSum; }

class NcclBackend;

// Non-blocking = enqueue on the stream + record an event; completion is the
// event, so wait/test never block the stream for other work.
class NcclRequest final : public CommRequest::Impl {
 public:
  NcclRequest(NcclBackend* backend, cudaEvent_t event) : backend_(backend), event_(event) {}
  ~NcclRequest() override { cudaEventDestroy(event_); }

 protected:
  void wait_backend() override;
  bool test_backend() override;
  void abort_backend() override;
  bool yield_while_polling() const override { return true; }  // the GPU moves the data

 private:
  NcclBackend* backend_;
  cudaEvent_t event_;
};

class NcclBackend final : public SumsOverElementType<NcclBackend> {
 public:
  NcclBackend(MPI_Comm comm, std::string name) : name_(std::move(name)), timeout_s_(timeout_from_env()) {
    int devices = 0;
    cudaError_t rc = cudaGetDeviceCount(&devices);
    if (rc != cudaSuccess || devices == 0) {
      throw Error("Communicator '" + name_ +
                  "': the NCCL backend needs a CUDA device and none is visible (cudaGetDeviceCount: " +
                  (rc == cudaSuccess ? std::string("0 devices") : std::string(cudaGetErrorString(rc))) +
                  "); use the MPI backend on this machine");
    }
    int size = 0, rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);

    // Rank 0 broadcasts its id together with whether it got one, so a failure
    // there is an Error on every rank rather than a hang in ncclCommInitRank.
    struct {
      int ok;
      ncclUniqueId id;
    } boot{};
    std::string boot_error;
    if (rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&boot.id);
      boot.ok = r == ncclSuccess;
      if (!boot.ok) boot_error = ncclGetErrorString(r);
    }
    MPI_Bcast(&boot, sizeof boot, MPI_BYTE, 0, comm);
    if (!boot.ok) {
      throw Error("Communicator '" + name_ + "': ncclGetUniqueId failed on rank 0" +
                  (boot_error.empty() ? std::string() : ": " + boot_error));
    }
    check(ncclCommInitRank(&comm_, size, boot.id, rank), "ncclCommInitRank");

#ifdef KOKKOS_ENABLE_CUDA
    // Kokkos's stream: the kernels and cuBLAS products a collective must follow.
    compute_ = Kokkos::Cuda().cuda_stream();
#else
    // Host Kokkos: callers fill device buffers with synchronous copies or on
    // the legacy default stream (nullptr), which the comm stream then follows.
    compute_ = nullptr;
#endif
    // The communication stream, at the highest priority, so a collective's
    // kernels start as soon as their inputs are ready instead of queueing
    // behind compute.
    int least = 0, greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange", name_);
    cuda_check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority",
               name_);
    cuda_check(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags", name_);
  }

  ~NcclBackend() override {
    // Errors here cannot be reported; the job is ending or already failed.
    if (comm_ != nullptr) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Ordered on the device (an event from the compute stream), so the
  // Communicator need not fence the host before a collective.
  bool orders_with_compute() const override { return true; }

  // The sums of fp32 and of bf16 values. bf16 uses NCCL's own bf16 reduction
  // (its kernels add in fp32 and round each partial sum to bf16, as the MPI
  // backend's bf16_sum_into does).
  std::unique_ptr<CommRequest::Impl> ireduce_scatter(const bf16* send, bf16* recv,
                                                     std::size_t count_per_rank) override {
    return ireduce_scatter_of(send, recv, count_per_rank);
  }

  void all_gather(const real* send, real* recv, std::size_t count_per_rank) override {
    complete(iall_gather(send, recv, count_per_rank));
  }
  void broadcast(real* buf, std::size_t count, int root) override { complete(ibroadcast(buf, count, root)); }
  std::unique_ptr<CommRequest::Impl> ibroadcast(real* buf, std::size_t count, int root) override {
    return issue("ncclBroadcast", [&] { return ncclBroadcast(buf, buf, count, ncclFloat, root, comm_, stream_); });
  }
  // NCCL has no tags: messages between a pair match in the order issued. A
  // blocking send completes only once the peer receives, so an exchange must
  // order its sends and receives (lower rank sends first) as with MPI_Ssend.
  void send(const real* buf, std::size_t count, int peer, int /*tag*/) override {
    complete(issue("ncclSend", [&] { return ncclSend(buf, count, ncclFloat, peer, comm_, stream_); }));
  }
  void recv(real* buf, std::size_t count, int peer, int /*tag*/) override {
    complete(issue("ncclRecv", [&] { return ncclRecv(buf, count, ncclFloat, peer, comm_, stream_); }));
  }

  std::unique_ptr<CommRequest::Impl> iall_gather(const real* send, real* recv, std::size_t count_per_rank) override {
    return issue("ncclAllGather", [&] { return ncclAllGather(send, recv, count_per_rank, ncclFloat, comm_, stream_); });
  }
  // One NCCL group: the sends and receives progress together, so an exchange
  // in which every rank sends and receives cannot deadlock.
  std::unique_ptr<CommRequest::Impl> batch_p2p(const std::vector<P2POp>& ops) override {
    return issue("ncclGroupEnd", [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      for (const P2POp& op : ops) {
        const ncclResult_t rc = op.kind == P2POp::Kind::send
                                    ? ncclSend(op.buf, op.count, ncclFloat, op.peer, comm_, stream_)
                                    : ncclRecv(op.buf, op.count, ncclFloat, op.peer, comm_, stream_);
        if (rc != ncclSuccess) {
          ncclGroupEnd();  // close the group before reporting, or NCCL stays inside it
          check(rc, op.kind == P2POp::Kind::send ? "ncclSend" : "ncclRecv");
        }
      }
      return ncclGroupEnd();
    });
  }

  // Polls the event under the watchdog (see nccl_backend.hpp). With a
  // CollectiveWatchdog alive, a deadline wait never gets here (the comm
  // layer polls test_backend under comm.timeout_s), and comm.timeout_s = 0
  // means no deadline at all.
  void wait_event(cudaEvent_t event) {
    const double timeout_s = watch_alive() ? 0.0 : timeout_s_;
    auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    while (!query_event(event)) {
      if (timeout_s > 0 && Clock::now() > deadline) {
        abort_comm();
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", timeout_s);
        throw Error("Communicator '" + name_ + "': an NCCL collective did not complete within " + seconds +
                    " s; the NCCL communicator was aborted. A peer rank probably died or the ranks issued "
                    "collectives in different orders (raise NDMINI_NCCL_TIMEOUT_S if the step is just slow)");
      }
      std::this_thread::yield();
    }
  }

  // True when the event has completed; throws on a CUDA or asynchronous NCCL error.
  bool query_event(cudaEvent_t event) {
    cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) cuda_check(rc, "cudaEventQuery", name_);
    require(comm_ != nullptr, "Communicator '" + name_ + "': the NCCL communicator was aborted");
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) {
      std::string detail = ncclGetLastError(comm_);
      abort_comm();
      throw Error("Communicator '" + name_ + "': asynchronous NCCL error: " + ncclGetErrorString(async) +
                  (detail.empty() ? std::string() : " (" + detail + ")") + "; the NCCL communicator was aborted");
    }
    return false;
  }

 private:
  // The sums of fp32 and of bf16 values, written once over the element type
  // T. bf16 uses NCCL's own bf16 reduction (its kernels add in fp32 and round
  // each partial sum to bf16, as the MPI backend's bf16_sum_into does).
  friend struct SumsOverElementType<NcclBackend>;
  template <class T>
  static ncclDataType_t nccl_type() {
    return std::is_same_v<T, bf16> ? ncclBfloat16 : ncclFloat;
  }
  template <class T>
  void all_reduce_of(T* buf, std::size_t count, ReduceOp op) {
    complete(iall_reduce_of(buf, count, op));
  }
  template <class T>
  void reduce_scatter_of(const T* send, T* recv, std::size_t count_per_rank) {
    complete(ireduce_scatter_of(send, recv, count_per_rank));
  }
  template <class T>
  std::unique_ptr<CommRequest::Impl> iall_reduce_of(T* buf, std::size_t count, ReduceOp op) {
    return issue("ncclAllReduce",
                 [&] { return ncclAllReduce(buf, buf, count, nccl_type<T>(), nccl_op(op), comm_, stream_); });
  }
  template <class T>
  std::unique_ptr<CommRequest::Impl> ireduce_scatter_of(const T* send, T* recv, std::size_t count_per_rank) {
    return issue("ncclReduceScatter", [&] {
      return ncclReduceScatter(send, recv, count_per_rank, nccl_type<T>(), ncclSum, comm_, stream_);
    });
  }
  // NCCL has no all-to-all-v: one group of a send and a receive per peer, in
  // rank order, as batch_p2p. Zero-count pairs are left out on both sides
  // (a receive count is its peer's send count), as PyTorch's NCCL
  // all-to-all does.
  template <class T>
  std::unique_ptr<CommRequest::Impl> iall_to_all_v_of(const T* send, T* recv, const AllToAllCounts& counts) {
    return issue("ncclGroupEnd", [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      for (std::size_t r = 0; r < counts.send_counts.size(); ++r) {
        const int peer = static_cast<int>(r);
        ncclResult_t rc = ncclSuccess;
        if (counts.send_counts[r] > 0)
          rc = ncclSend(send + counts.send_displs[r], counts.send_counts[r], nccl_type<T>(), peer, comm_, stream_);
        if (rc == ncclSuccess && counts.recv_counts[r] > 0)
          rc = ncclRecv(recv + counts.recv_displs[r], counts.recv_counts[r], nccl_type<T>(), peer, comm_, stream_);
        if (rc != ncclSuccess) {
          ncclGroupEnd();  // close the group before reporting, or NCCL stays inside it
          check(rc, "ncclSend/ncclRecv");
        }
      }
      return ncclGroupEnd();
    });
  }

  // Enqueues one NCCL call on the communication stream, after everything
  // already enqueued on the compute stream (the kernels that wrote its
  // inputs: an event, not a host fence, so compute enqueued later overlaps
  // the transfer), and records its completion event.
  template <class Call>
  std::unique_ptr<CommRequest::Impl> issue(const char* what, Call&& call) {
    require(comm_ != nullptr, "Communicator '" + name_ + "': the NCCL communicator was aborted");
    cuda_check(cudaEventRecord(inputs_ready_, compute_), "cudaEventRecord", name_);
    cuda_check(cudaStreamWaitEvent(stream_, inputs_ready_, 0), "cudaStreamWaitEvent", name_);
    check(call(), what);
    cudaEvent_t event = nullptr;
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags", name_);
    auto r = std::make_unique<NcclRequest>(this, event);  // owns the event from here on
    cuda_check(cudaEventRecord(event, stream_), "cudaEventRecord", name_);
    return r;
  }

  // Blocking = non-blocking + wait: the buffer is ready when the call returns.
  void complete(std::unique_ptr<CommRequest::Impl> r) { r->wait(); }

  void check(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess) return;
    std::string detail = comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
    throw Error("Communicator '" + name_ + "': " + call + " failed: " + ncclGetErrorString(rc) +
                (detail.empty() ? std::string() : " (" + detail + ")"));
  }

 public:
  void abort_comm() {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  std::string name_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t compute_ = nullptr;      // Kokkos' stream (CUDA build) or the legacy default stream
  cudaStream_t stream_ = nullptr;       // the communication stream, owned
  cudaEvent_t inputs_ready_ = nullptr;  // recorded on compute_ at each issue; reused (a wait copies its state)
};

void NcclRequest::wait_backend() { backend_->wait_event(event_); }
bool NcclRequest::test_backend() { return backend_->query_event(event_); }
void NcclRequest::abort_backend() { backend_->abort_comm(); }

}  // namespace

std::unique_ptr<Communicator::BackendImpl> make_nccl_backend(MPI_Comm comm, const std::string& name) {
  return std::make_unique<NcclBackend>(comm, name);
}

std::string nccl_device_problem(MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_size = 1;
  MPI_Comm_size(node, &local_size);
  // The PCI bus id of each rank's current device ("" when it has none).
  constexpr int kBusIdChars = 32;
  char bus[kBusIdChars] = {};
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus, kBusIdChars, device) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later CUDA calls do not report it
    bus[0] = '\0';
  }
  std::vector<char> all(static_cast<std::size_t>(local_size) * kBusIdChars);
  MPI_Allgather(bus, kBusIdChars, MPI_CHAR, all.data(), kBusIdChars, MPI_CHAR, node);
  MPI_Comm_free(&node);
  // 1: a rank without a device; 2: two ranks of a node on one device.
  int problem = 0;
  std::vector<std::string> ids;
  for (int r = 0; r < local_size; ++r) ids.emplace_back(all.data() + static_cast<std::size_t>(r) * kBusIdChars);
  for (int r = 0; r < local_size; ++r) {
    if (ids[r].empty()) problem = std::max(problem, 1);
    for (int q = 0; q < r; ++q)
      if (!ids[r].empty() && ids[r] == ids[q]) problem = std::max(problem, 2);
  }
  MPI_Allreduce(MPI_IN_PLACE, &problem, 1, MPI_INT, MPI_MAX, world);
  if (problem == 1) return "a rank has no CUDA device";
  if (problem == 2) return "ranks of a node share a GPU (NCCL needs one GPU per rank)";
  return {};
}

std::string nccl_library_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before).
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

}  // namespace ndmini::detail
