// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Internal to comm/: how collectives reach buffers in device memory.
//
// The MPI backend hands MemSpace pointers to MPI. Where MemSpace is a GPU's
// memory that works only with a CUDA-aware MPI; otherwise every transfer is
// staged through (pinned) host memory: copied out before the MPI call,
// copied back once it completes. The choice is made once per process:
//   NDMINI_MPI_CUDA_AWARE=1  MPI reads device memory itself (direct)
//   NDMINI_MPI_CUDA_AWARE=0  stage through host memory (on a host build too,
//                            which lets the staging path be tested anywhere)
//   unset                    ask the MPI (MPIX_Query_cuda_support in MPICH
//                            4 and Open MPI; MPICH_GPU_SUPPORT_ENABLED=1 on
//                            Cray MPICH); stage unless it says yes
// World rank 0 prints one line saying which path device buffers take.
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "comm/backend.hpp"

namespace ndmini::detail {

// The MPI backend as it should run in this build: `mpi` itself, or wrapped
// so device buffers go through host memory. `comm`'s size and rank are read.
std::unique_ptr<Communicator::BackendImpl> with_device_path(std::unique_ptr<Communicator::BackendImpl> mpi,
                                                            MPI_Comm comm, const std::string& name);

// The line printed for the choice (also for tests and the banner).
std::string mpi_device_path_description();

// Buffers staged through host memory so far in this process (for tests).
std::size_t staged_buffers();

}  // namespace ndmini::detail
