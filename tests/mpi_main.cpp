// SPDX-License-Identifier: BSD-3-Clause
// One main for every test program: MPI, then Kokkos, then GoogleTest.
// Only rank 0 prints GoogleTest's report, so MPI tests read like serial ones.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  int thread_level = MPI_THREAD_SINGLE;  // MULTIPLE where available, as in ndmini's main
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level);
  Kokkos::initialize(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  // A test that fails on any rank fails the program on every rank.
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  Kokkos::finalize();
  MPI_Finalize();
  return worst;
}
