// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Internal to comm/: the MPI backend of the Communicator (host buffers, or
// device buffers a CUDA-aware MPI reads directly; comm/device_path.hpp stages
// them through host memory otherwise), and the MPI request it returns.
#include <mpi.h>

#include <memory>
#include <mutex>

#include "comm/backend.hpp"
#include "comm/progress.hpp"

namespace ndmini::detail {

// Throws Error naming `call` and MPI's text when rc is not MPI_SUCCESS.
void mpi_check(int rc, const char* call);

MPI_Op mpi_op(ReduceOp op);

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
  void wait_backend() override;
  bool test_backend() override;
};

// Throws Error unless every count and displacement of `counts` fits
// MPI_Ialltoallv's int (the staged path asks before it copies anything).
void require_mpi_all_to_all_counts(const AllToAllCounts& counts);

// The MPI backend on `comm`, where this process is `rank`.
std::unique_ptr<Communicator::BackendImpl> make_mpi_backend(MPI_Comm comm, int rank);

}  // namespace ndmini::detail
