// SPDX-License-Identifier: BSD-3-Clause
#include "runtime.hpp"

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <string>
#include <vector>

namespace ndmini::driver {

Runtime::Runtime(int& argc, char**& argv) {
  // MPI_THREAD_MULTIPLE lets the comm layer's progress thread (comm/progress.hpp)
  // call MPI beside the model; with less the thread is simply not started.
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  mpi_up_ = true;
  // --kokkos-help goes to rank 0 only, so the list is printed once.
  kokkos_args_ = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--kokkos-help") {
      kokkos_help_ = true;
      if (rank_ != 0) continue;
    }
    if (a.rfind("--kokkos-", 0) == 0) kokkos_args_.push_back(argv[i]);
  }
  if (kokkos_help_) start_kokkos();
}

void Runtime::start_kokkos() {
  if (kokkos_up_) return;
  std::vector<char*> args = kokkos_args_;
  int argc = static_cast<int>(args.size());
  args.push_back(nullptr);
  Kokkos::initialize(argc, args.data());
  kokkos_up_ = true;
}

void Runtime::finalize_kokkos() {
  if (kokkos_up_) Kokkos::finalize();
  kokkos_up_ = false;
}

void Runtime::finalize() {
  finalize_kokkos();
  if (mpi_up_) MPI_Finalize();
  mpi_up_ = false;
}

Runtime::~Runtime() { finalize(); }

}  // namespace ndmini::driver
