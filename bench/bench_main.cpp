// SPDX-License-Identifier: BSD-3-Clause
// The one main() of every bench_* program: MPI, then Kokkos, then Google
// Benchmark. All ranks run every benchmark (the timer's MPI_Allreduce needs
// them all); only rank 0 prints or writes --benchmark_out.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "bench_common.hpp"

namespace {

// Swallows every report: the display reporter of ranks other than 0.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
  void Finalize() override {}
};

}  // namespace

int main(int argc, char** argv) {
  int thread_level = MPI_THREAD_SINGLE;  // MULTIPLE where available, for the comm layer's progress thread
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 0;
  Kokkos::initialize(argc, argv);
  {
    // Ranks other than 0 drop --benchmark_out*: otherwise each would open
    // (and truncate) the same file that rank 0 is writing.
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i)
      if (rank == 0 || std::strncmp(argv[i], "--benchmark_out", 15) != 0) args.push_back(argv[i]);
    int nargs = static_cast<int>(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&nargs, args.data());
    bool ready = true;
    try {
      for (auto& setup : ndmini::bench::late_hooks().setup) setup();
    } catch (const std::exception& e) {
      // Set-up is collective and fails alike on every rank (a bad environment variable).
      if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());
      ready = false;
    }
    if (!ready || benchmark::ReportUnrecognizedArguments(nargs, args.data())) {
      status = 1;
    } else if (rank == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      NullReporter silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
    for (auto& teardown : ndmini::bench::late_hooks().teardown) teardown();
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
