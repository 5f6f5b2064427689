// SPDX-License-Identifier: BSD-3-Clause
#include "core/error.hpp"

namespace ndmini {

void require(bool cond, const std::string& message) {
  if (!cond) throw Error(message);
}

void agree(MPI_Comm comm, const std::string& local_error) { agree_max(comm, local_error, 0); }

int agree_max(MPI_Comm comm, const std::string& local_error, int local_value) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // One MIN reduction: the lowest failing rank, and the largest value negated.
  int mine[2] = {local_error.empty() ? size : rank, -local_value};
  int agreed[2] = {size, 0};
  MPI_Allreduce(mine, agreed, 2, MPI_INT, MPI_MIN, comm);
  const int first = agreed[0];
  if (first == size) return -agreed[1];
  std::string message = local_error;
  unsigned long long n = message.size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, first, comm);
  message.resize(n);
  if (n > 0) MPI_Bcast(message.data(), static_cast<int>(n), MPI_CHAR, first, comm);
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
