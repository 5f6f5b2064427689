// SPDX-License-Identifier: BSD-3-Clause
// A job that hangs on purpose, for the hang-detection test (hang.sh): steps
// of one all-reduce on 'dp' (pairs of ranks) and one scalar all-reduce on
// 'world', under a CollectiveWatchdog; at step --skip-step, rank --skip-rank
// skips its 'dp' all-reduce (Communicator::skip_next_for_fault_injection).
// Its partner then waits in 'dp' while it waits in 'world': the watchdog
// must name it and end the job. Reaching the end is a failure (exit 2).
// With --a2a the 'dp' collective is a variable all-to-all whose bytes differ
// between the ranks of a pair: the verdict must still be the skip, not those.
//   mpiexec -n 4 comm_hang_driver --timeout 3 --skip-rank 2 --skip-step 3 --steps 6 [--a2a]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace {

constexpr std::size_t kCount = 1024;  // floats per 'dp' all-reduce (4096 B)

double arg(int argc, char** argv, const char* name, double fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  return fallback;
}

bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

// Elements rank s of a pair sends rank d with --a2a: every rank a different amount.
std::size_t a2a_count(int s, int d) { return static_cast<std::size_t>((s + 1) * 3 + d); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const double timeout_s = arg(argc, argv, "--timeout", 3);
  const int skip_rank = static_cast<int>(arg(argc, argv, "--skip-rank", -1));
  const int skip_step = static_cast<int>(arg(argc, argv, "--skip-step", 3));
  const int steps = static_cast<int>(arg(argc, argv, "--steps", 6));
  MPI_Comm pairs = MPI_COMM_NULL, world = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pairs);
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  {
    ndmini::CollectiveWatchdog watchdog(MPI_COMM_WORLD, timeout_s);
    ndmini::Communicator dp(pairs, "dp"), all(world, "world");
    std::vector<float> grads(kCount, 1.0f), routed(kCount);
    std::vector<std::size_t> send_counts, recv_counts;
    for (int r = 0; r < dp.size(); ++r) {
      send_counts.push_back(a2a_count(dp.rank(), r));
      recv_counts.push_back(a2a_count(r, dp.rank()));
    }
    const auto layout = ndmini::AllToAllCounts::packed(send_counts, recv_counts);
    const bool a2a = flag(argc, argv, "--a2a");
    for (int step = 0; step < steps; ++step) {
      if (rank == skip_rank && step == skip_step) dp.skip_next_for_fault_injection();
      if (a2a)
        dp.all_to_all_v(grads.data(), routed.data(), layout);
      else
        dp.all_reduce(grads.data(), kCount);
      all.all_reduce_scalar(1.0);
    }
    if (rank == 0) std::printf("hang_driver: all %d steps completed\n", steps);
  }
  MPI_Comm_free(&pairs);
  MPI_Comm_free(&world);
  MPI_Finalize();
  return skip_rank >= 0 ? 2 : 0;  // with a skip, finishing means the hang went unnoticed
}
