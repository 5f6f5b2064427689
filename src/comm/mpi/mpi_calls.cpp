// SPDX-License-Identifier: BSD-3-Clause
#include "comm/mpi/mpi_calls.hpp"

#include <thread>
#include <vector>

#include "comm/ledger.hpp"
#include "core/error.hpp"

namespace ndmini {
namespace {

// A raw communicator's place in the ledger, cached on the communicator
// itself (an MPI attribute), so it is registered once and forgotten with it.
struct RawComm {
  int id = -1;
  std::uint64_t seq = 0;
};

int delete_raw_comm(MPI_Comm, int, void* value, void*) {
  delete static_cast<RawComm*>(value);
  return MPI_SUCCESS;
}

RawComm& raw_comm(MPI_Comm comm) {
  static int keyval = MPI_KEYVAL_INVALID;
  if (keyval == MPI_KEYVAL_INVALID) MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_raw_comm, &keyval, nullptr);
  void* value = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, keyval, &value, &found);
  if (found) return *static_cast<RawComm*>(value);
  // Named as a reader of the diagnosis knows it: the world, the mesh's
  // Cartesian communicator (the world's ranks, a communicator of its own).
  int same = MPI_UNEQUAL, topology = MPI_UNDEFINED;
  MPI_Comm_compare(comm, MPI_COMM_WORLD, &same);
  MPI_Topo_test(comm, &topology);
  const char* name = topology == MPI_CART ? "mesh" : (same == MPI_IDENT || same == MPI_CONGRUENT) ? "world" : "mpi";
  auto* raw = new RawComm{detail::register_comm(comm, name)};
  MPI_Comm_set_attr(comm, keyval, raw);
  return *raw;
}

// Enters the call in the ledger, then issues it: blocking without a
// deadline, else non-blocking (`issue` fills the request) and waited for.
template <class Call, class Issue>
void watched(MPI_Comm comm, detail::CollOp op, std::int64_t bytes, const char* what, Call&& call, Issue&& issue) {
  RawComm& raw = raw_comm(comm);
  const std::uint64_t index = detail::ledger_record(raw.id, raw.seq++, op, bytes, true, what);
  if (detail::watch_timeout_s() > 0) {
    MPI_Request request = MPI_REQUEST_NULL;
    issue(&request);
    const detail::WaitScope scope(index);
    const bool nap = detail::waits_share_cores();  // more threads than cores: sleep between tests (ledger.hpp)
    if (scope.polls() || nap) {
      int done = 0;
      while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        scope.poll([] {});
        if (nap) std::this_thread::sleep_for(detail::kSharedCoreNap);
      }
    } else {
      MPI_Wait(&request, MPI_STATUS_IGNORE);  // the watchdog's monitor thread keeps the deadline
    }
  } else {
    call();
  }
  detail::ledger_complete(index);
}

int type_size(MPI_Datatype type) {
  int size = 0;
  MPI_Type_size(type, &size);
  return size;
}

}  // namespace

void mpi_all_reduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                    const char* what) {
  watched(
      comm, detail::CollOp::all_reduce, static_cast<std::int64_t>(count) * type_size(type), what,
      [&] { MPI_Allreduce(send, recv, count, type, op, comm); },
      [&](MPI_Request* r) { MPI_Iallreduce(send, recv, count, type, op, comm, r); });
}

void mpi_broadcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm, const char* what) {
  watched(
      comm, detail::CollOp::broadcast, static_cast<std::int64_t>(count) * type_size(type), what,
      [&] { MPI_Bcast(buf, count, type, root, comm); },
      [&](MPI_Request* r) { MPI_Ibcast(buf, count, type, root, comm, r); });
}

void mpi_barrier(MPI_Comm comm, const char* what) {
  watched(
      comm, detail::CollOp::barrier, 0, what, [&] { MPI_Barrier(comm); },
      [&](MPI_Request* r) { MPI_Ibarrier(comm, r); });
}

void mpi_blocking(MPI_Comm comm, const char* what, const std::function<void()>& call) {
  RawComm& raw = raw_comm(comm);
  const std::uint64_t index = detail::ledger_record(raw.id, raw.seq++, detail::CollOp::setup, 0, true, what);
  {
    const detail::WaitScope scope(index);
    call();
  }
  detail::ledger_complete(index);
}

namespace {
int delete_node_map(MPI_Comm, int, void* value, void*) {
  delete static_cast<std::vector<int>*>(value);
  return MPI_SUCCESS;
}
}  // namespace

const std::vector<int>& node_of_ranks(MPI_Comm comm) {
  static int keyval = MPI_KEYVAL_INVALID;
  if (keyval == MPI_KEYVAL_INVALID) MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_node_map, &keyval, nullptr);
  void* value = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, keyval, &value, &found);
  if (found) return *static_cast<std::vector<int>*>(value);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int lowest = rank;
  if (node != MPI_COMM_NULL) {
    MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_free(&node);
  }
  auto* nodes = new std::vector<int>(static_cast<std::size_t>(size));
  MPI_Allgather(&lowest, 1, MPI_INT, nodes->data(), 1, MPI_INT, comm);
  MPI_Comm_set_attr(comm, keyval, nodes);
  return *nodes;
}

void agree(MPI_Comm comm, const std::string& local_error) { agree_max(comm, local_error, 0); }

int agree_max(MPI_Comm comm, const std::string& local_error, int local_value) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // One MIN reduction: the lowest failing rank, and the largest value negated.
  int mine[2] = {local_error.empty() ? size : rank, -local_value};
  int agreed[2] = {size, 0};
  mpi_all_reduce(mine, agreed, 2, MPI_INT, MPI_MIN, comm, "agreement on errors");
  const int first = agreed[0];
  if (first == size) return -agreed[1];
  std::string message = local_error;
  unsigned long long n = message.size();
  mpi_broadcast(&n, 1, MPI_UNSIGNED_LONG_LONG, first, comm, "the error message's length");
  message.resize(n);
  if (n > 0) mpi_broadcast(message.data(), static_cast<int>(n), MPI_CHAR, first, comm, "the error message");
  throw Error(message);
}

void agree_on_errors(MPI_Comm comm, const std::function<void()>& body) {
  std::string error;
  try {
    body();
  } catch (const std::exception& e) {
    error = *e.what() ? e.what() : "unknown error";
  } catch (...) {
    error = "unknown error";
  }
  agree(comm, error);
}

}  // namespace ndmini
