// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The NCCL backend of the Communicator, compiled only with NDMINI_HAVE_NCCL.
//
// Requirements: buffers must be device-resident (cudaMalloc, or Views in a
// CUDA Kokkos build's MemSpace).
//
// Streams: collectives run on a communication stream of their own (highest
// priority). Each one first waits, on the device, for an event recorded on
// the compute stream (Kokkos::Cuda's in a CUDA Kokkos build; the legacy
// default stream otherwise) at issue: it starts once the kernels that wrote
// its inputs are done, with no host fence, and compute enqueued after the
// issue overlaps it. Completion is an event on the communication stream;
// wait() blocks the host until it has fired, so anything enqueued after
// wait() sees the result. As with MPI, a buffer in flight is neither read
// nor written by the caller until wait().
//
// Device: the current CUDA device when the Communicator is built (Kokkos sets
// it in a CUDA build; otherwise the caller does, one GPU per rank per node).
// Lifetime: destroy the Communicator before Kokkos::finalize (it may use
// Kokkos's stream) and before MPI_Finalize.
//
// Watchdog: every wait polls the completion event and ncclCommGetAsyncError;
// an asynchronous NCCL error aborts the NCCL communicator (ncclCommAbort) and
// throws Error. The deadline is comm.timeout_s while a CollectiveWatchdog is
// alive: past it the communicator is aborted and the comm layer's diagnosis
// ends the job (communicator.hpp). Without a CollectiveWatchdog (tests,
// benchmarks) the deadline is NDMINI_NCCL_TIMEOUT_S seconds (default 600; 0
// waits forever), past which the communicator is aborted and Error thrown.
// Either way a dead peer or mismatched collective order fails the job
// instead of hanging it; the communicator is unusable afterwards.
#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace ndmini::detail {

// Collective over `comm`: rank 0 makes the ncclUniqueId and broadcasts it
// over `comm`, then every rank joins with ncclCommInitRank. Throws Error when
// no CUDA device is visible or NCCL fails.
std::unique_ptr<Communicator::BackendImpl> make_nccl_backend(MPI_Comm comm, const std::string& name);

// Collective over `world`: empty when every rank has a CUDA device of its
// own (NCCL refuses two ranks on one GPU), else why not (the same text on
// every rank).
std::string nccl_device_problem(MPI_Comm world);

// ncclGetVersion as "major.minor.patch" (no GPU needed).
std::string nccl_library_version();

}  // namespace ndmini::detail
