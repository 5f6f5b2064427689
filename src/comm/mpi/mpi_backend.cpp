// SPDX-License-Identifier: BSD-3-Clause
#include "comm/mpi/mpi_backend.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/error.hpp"

namespace ndmini {

void bf16_sum_into(const bf16* in, bf16* inout, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) inout[i] = bf16(static_cast<float>(in[i]) + static_cast<float>(inout[i]));
}

}  // namespace ndmini

namespace ndmini::detail {

static_assert(std::is_same_v<real, float>, "the MPI backend sends real as MPI_FLOAT");

void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string(call) + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

void MpiRequest::wait_backend() {
  const std::lock_guard<std::mutex> lock(mpi_request_mutex());
  mpi_check(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
}

bool MpiRequest::test_backend() {
  const std::lock_guard<std::mutex> lock(mpi_request_mutex());
  int flag = 0;
  mpi_check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
  return flag != 0;
}

namespace {

// MPI counts are int; a larger message would have to be split.
int mpi_count(std::size_t count, const char* call) {
  require(count <= static_cast<std::size_t>(INT_MAX),
          std::string(call) + ": " + std::to_string(count) + " elements exceed MPI's int count");
  return static_cast<int>(count);
}

// Several requests completed together: point-to-point transfers, the
// pieces of a large all-reduce, or one all-to-all-v with its arguments.
class MpiRequests final : public CommRequest::Impl {
 public:
  std::vector<MPI_Request> requests;
  std::vector<int> arguments;  // arrays MPI reads until completion (MPI_Ialltoallv's counts and displacements)
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

// The MPI datatype that moves T's bits (no arithmetic on them).
template <class T>
MPI_Datatype bits_of() {
  static_assert(sizeof(bf16) == sizeof(std::uint16_t), "bf16 travels as 16 bits");
  return std::is_same_v<T, bf16> ? MPI_UINT16_T : MPI_FLOAT;
}

// MPI_Ialltoallv's arguments laid end to end: send counts, send
// displacements, receive counts, receive displacements, n each.
constexpr std::size_t kAllToAllArrays = 4;

// MPI_Ialltoallv's counts and displacements as ints: each must fit, or the
// call is refused. (MPI 4's MPI_Ialltoallv_c takes MPI_Count, but not every
// MPI this code builds with has it; at 2^31 elements per block a rank would
// hold 8 GiB of fp32 tokens for one peer.)
std::vector<int> mpi_all_to_all_args(const AllToAllCounts& c, const char* call) {
  const std::size_t n = c.send_counts.size();
  std::vector<int> out;
  out.reserve(kAllToAllArrays * n);
  for (const std::vector<std::size_t>* v : {&c.send_counts, &c.send_displs, &c.recv_counts, &c.recv_displs})
    for (std::size_t x : *v) out.push_back(mpi_count(x, call));
  return out;
}

// MPI_Allreduce and MPI_Bcast of more than kMaxPieceBytes are sent as
// several calls of at most that size, issued together (non-blocking) or one
// after the other (blocking). MPICH 4.0 on this project's machines takes ten
// times longer per byte for one call above 32 MiB than below (its temporary
// buffers then come from mmap and are faulted in afresh on every call); the
// pieces keep every call below that, and cost nothing measurable at the
// sizes where one call was fine.
constexpr std::size_t kMaxPieceBytes = std::size_t{16} << 20;

// Calls f(offset, count) for each piece of [0, count) elements of T; once
// for count 0, so every rank still takes part.
template <class T = real, class F>
void for_pieces(std::size_t count, F&& f) {
  constexpr std::size_t kPieceCount = kMaxPieceBytes / sizeof(T);
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
// the first); it also keeps FSDP's per-unit gathered buffers resident.
// Blocks of any size come from the heap (glibc's mmap threshold cannot rise
// above 32 MiB, so it is switched off instead): FSDP's reduce-scatter of
// gpt2-124m's embedding unit (154 MB, not split into pieces as all-reduce
// is) otherwise mmaps MPICH's temporary buffer afresh on every call, and
// took 470 ms per step instead of 47 while the progress thread ran. The
// cost is that the process's RSS stays at its high-water mark. glibc only;
// left alone when the user tunes malloc through its environment variables.
void keep_freed_memory() {
#if defined(__GLIBC__)
  static bool done = false;
  if (done) return;
  done = true;
  for (const char* var : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES"})
    if (std::getenv(var) != nullptr) return;
  mallopt(M_TRIM_THRESHOLD, -1);  // never trim the heap
  mallopt(M_MMAP_MAX, 0);         // every block from the heap, none mmapped
#endif
}

// bf16 on the wire: a 16-bit datatype of its own and the sum over it
// (bf16_sum_into), made once per process. Commutative (a + b and b + a
// round the same), so MPI keeps its usual algorithms; not associative, so
// the result follows the algorithm MPI picks for the group's size and the
// message's, the same every run.
void bf16_sum_function(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_sum_into(static_cast<const bf16*>(in), static_cast<bf16*>(inout), static_cast<std::size_t>(*len));
}

struct Bf16Sum {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
};

Bf16Sum g_bf16_sum;

// Called at the start of MPI_Finalize (an attribute of MPI_COMM_SELF), so
// the type and the operation are freed while MPI still runs.
int free_bf16_sum(MPI_Comm, int, void*, void*) {
  MPI_Op_free(&g_bf16_sum.op);
  MPI_Type_free(&g_bf16_sum.type);
  return MPI_SUCCESS;
}

const Bf16Sum& bf16_sum() {
  if (g_bf16_sum.op != MPI_OP_NULL) return g_bf16_sum;
  static_assert(sizeof(bf16) == sizeof(std::uint16_t), "bf16 travels as 16 bits");
  mpi_check(MPI_Type_contiguous(1, MPI_UINT16_T, &g_bf16_sum.type), "MPI_Type_contiguous");
  mpi_check(MPI_Type_commit(&g_bf16_sum.type), "MPI_Type_commit");
  mpi_check(MPI_Op_create(bf16_sum_function, /*commute=*/1, &g_bf16_sum.op), "MPI_Op_create");
  int keyval = MPI_KEYVAL_INVALID;
  mpi_check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_bf16_sum, &keyval, nullptr), "MPI_Comm_create_keyval");
  mpi_check(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr), "MPI_Comm_set_attr");
  MPI_Comm_free_keyval(&keyval);  // the attribute keeps it until MPI_Finalize
  return g_bf16_sum;
}

// The MPI datatype and operation of a sum of T values: MPI_FLOAT with the
// op asked for, or bf16 with its own sum.
struct Wire {
  MPI_Datatype type;
  MPI_Op op;
};
template <class T>
Wire wire_of(ReduceOp op) {
  if constexpr (std::is_same_v<T, bf16>) {
    const Bf16Sum& sum = bf16_sum();
    return {sum.type, sum.op};
  } else {
    return {MPI_FLOAT, mpi_op(op)};
  }
}

class MpiBackend final : public SumsOverElementType<MpiBackend> {
 public:
  MpiBackend(MPI_Comm comm, int rank) : comm_(comm), rank_(rank) { keep_freed_memory(); }

  std::unique_ptr<CommRequest::Impl> ireduce_scatter(const bf16* send, bf16* recv,
                                                     std::size_t count_per_rank) override {
    return ireduce_scatter_of(send, recv, count_per_rank);
  }

  void all_gather(const real* send, real* recv, std::size_t count_per_rank) override {
    int n = mpi_count(count_per_rank, "MPI_Allgather");
    mpi_check(MPI_Allgather(gather_send(send, recv, count_per_rank), n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_),
              "MPI_Allgather");
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

  std::unique_ptr<CommRequest::Impl> iall_gather(const real* send, real* recv, std::size_t count_per_rank) override {
    auto r = std::make_unique<MpiRequest>();
    int n = mpi_count(count_per_rank, "MPI_Iallgather");
    mpi_check(
        MPI_Iallgather(gather_send(send, recv, count_per_rank), n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_, &r->request),
        "MPI_Iallgather");
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
  // The sums, written once over the element type T (real or bf16).
  friend struct SumsOverElementType<MpiBackend>;
  template <class T>
  void all_reduce_of(T* buf, std::size_t count, ReduceOp op) {
    const Wire wire = wire_of<T>(op);
    for_pieces<T>(count, [&](std::size_t at, std::size_t n) {
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf + at, mpi_count(n, "MPI_Allreduce"), wire.type, wire.op, comm_),
                "MPI_Allreduce");
    });
  }
  template <class T>
  void reduce_scatter_of(const T* send, T* recv, std::size_t count_per_rank) {
    const Wire wire = wire_of<T>(ReduceOp::sum);
    mpi_check(MPI_Reduce_scatter_block(send, recv, mpi_count(count_per_rank, "MPI_Reduce_scatter_block"), wire.type,
                                       wire.op, comm_),
              "MPI_Reduce_scatter_block");
  }
  template <class T>
  std::unique_ptr<CommRequest::Impl> iall_reduce_of(T* buf, std::size_t count, ReduceOp op) {
    const Wire wire = wire_of<T>(op);
    auto r = std::make_unique<MpiRequests>();
    for_pieces<T>(count, [&](std::size_t at, std::size_t n) {
      r->requests.push_back(MPI_REQUEST_NULL);
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf + at, mpi_count(n, "MPI_Iallreduce"), wire.type, wire.op, comm_,
                               &r->requests.back()),
                "MPI_Iallreduce");
    });
    return r;
  }
  template <class T>
  std::unique_ptr<CommRequest::Impl> ireduce_scatter_of(const T* send, T* recv, std::size_t count_per_rank) {
    const Wire wire = wire_of<T>(ReduceOp::sum);
    auto r = std::make_unique<MpiRequest>();
    mpi_check(MPI_Ireduce_scatter_block(send, recv, mpi_count(count_per_rank, "MPI_Ireduce_scatter_block"), wire.type,
                                        wire.op, comm_, &r->request),
              "MPI_Ireduce_scatter_block");
    return r;
  }
  // MPI_Ialltoallv rather than a pair of MPI_Isend/MPI_Irecv per peer: the
  // library's own schedule (MPICH: pairwise or throttled exchanges, not 2n
  // requests at once on a large group), one request, and the collective's
  // context, so its messages never match a batch_p2p's on the same group.
  template <class T>
  std::unique_ptr<CommRequest::Impl> iall_to_all_v_of(const T* send, T* recv, const AllToAllCounts& counts) {
    auto r = std::make_unique<MpiRequests>();
    r->arguments = mpi_all_to_all_args(counts, "MPI_Ialltoallv");  // kept alive with the request
    const std::size_t n = counts.send_counts.size();
    const int* a = r->arguments.data();
    r->requests.push_back(MPI_REQUEST_NULL);
    mpi_check(MPI_Ialltoallv(send, a, a + n, bits_of<T>(), recv, a + 2 * n, a + 3 * n, bits_of<T>(), comm_,
                             &r->requests.back()),
              "MPI_Ialltoallv");
    return r;
  }
  // In-place all-gather (this rank's block already sits in recv, as NCCL
  // allows) must be spelled MPI_IN_PLACE: MPI forbids aliased buffers.
  const void* gather_send(const real* send, const real* recv, std::size_t count_per_rank) const {
    return send == recv + static_cast<std::size_t>(rank_) * count_per_rank ? MPI_IN_PLACE : send;
  }

  MPI_Comm comm_;
  int rank_;
};

}  // namespace

void require_mpi_all_to_all_counts(const AllToAllCounts& counts) { mpi_all_to_all_args(counts, "MPI_Ialltoallv"); }

std::unique_ptr<Communicator::BackendImpl> make_mpi_backend(MPI_Comm comm, int rank) {
  return std::make_unique<MpiBackend>(comm, rank);
}

}  // namespace ndmini::detail
