// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// MPI and Kokkos for the life of the process. The constructor initialises
// both; the destructor finalises whichever is still up, Kokkos first.
namespace ndmini::driver {

class Runtime {
 public:
  // MPI_Init_thread, then Kokkos::initialize with the --kokkos-* arguments
  // only (given --help, Kokkos would print its option list before ndmini's).
  Runtime(int& argc, char**& argv);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // --kokkos-help was given: Kokkos printed its options (on rank 0) and the run ends.
  bool kokkos_help() const { return kokkos_help_; }
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
};

}  // namespace ndmini::driver
