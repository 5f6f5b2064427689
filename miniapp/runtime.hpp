// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// MPI and Kokkos for the life of the process. The constructor initialises
// MPI, start_kokkos() Kokkos once the command line asks for work (--version
// and --help need no device: a GPU build answers them on a node without
// one); the destructor finalises whichever is still up, Kokkos first.
#include <vector>

namespace ndmini::driver {

class Runtime {
 public:
  // MPI_Init_thread; Kokkos::initialize too when --kokkos-help asks Kokkos
  // for its option list.
  Runtime(int& argc, char**& argv);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // --kokkos-help was given: Kokkos printed its options (on rank 0) and the run ends.
  bool kokkos_help() const { return kokkos_help_; }
  // Kokkos::initialize with the --kokkos-* arguments only (given --help,
  // Kokkos would print its option list before ndmini's). Once.
  void start_kokkos();
  // Ends Kokkos before the process ends, for what must come after it (a stop
  // signal's status handed over through MPI_Abort).
  void finalize_kokkos();
  // Ends Kokkos, then MPI (what the destructor does), for a caller that
  // exits without destroying this.
  void finalize();

 private:
  int rank_ = 0, world_ = 1;
  bool kokkos_help_ = false;
  bool kokkos_up_ = false;
  bool mpi_up_ = false;
  std::vector<char*> kokkos_args_;  // argv[0] and the --kokkos-* arguments this rank passes on
};

}  // namespace ndmini::driver
