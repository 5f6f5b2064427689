// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Shared pieces of the bench_* programs: the model shapes of the two decks,
// a fence-to-fence timer that agrees across ranks, and rate counters.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "core/types.hpp"
#include "kernels/kernels.hpp"

namespace ndmini::bench {

// One micro-batch of inputs/small.toml and inputs/gpt2-124m.toml: B = 4
// sequences of T = 256 tokens, so every activation matrix has 1024 rows.
constexpr int kBatch = 4;
constexpr int kSeqLen = 256;
constexpr int kRows = kBatch * kSeqLen;

struct Deck {
  const char* name;
  int layers, channels, heads, vocab;
};
// Kept in step with inputs/*.toml by hand: the benchmarks must not depend on
// the working directory to find the decks.
inline constexpr Deck kDecks[] = {
    {"small", 6, 384, 6, 256},
    {"gpt2-124m", 12, 768, 12, 50304},
};

// Runs body() once as one benchmark iteration. Fences on both sides so only
// the kernels' own work is timed (asynchronous backends return early), and
// takes the slowest rank's time: every rank then reports the same time and
// Google Benchmark picks the same iteration count everywhere, which keeps
// the ranks in lockstep.
template <class Body>
void time_iteration(benchmark::State& state, Body&& body) {
  Kokkos::fence();
  const auto t0 = std::chrono::steady_clock::now();
  body();
  Kokkos::fence();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  state.SetIterationTime(seconds);
}

// Rates over the manual (max-over-ranks) time: per-iteration work times
// iterations, divided by the summed iteration times. Printed as e.g.
// "flops=120G/s" and "bytes=15G/s" (powers of 1000).
inline void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["flops"] = benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}
inline void set_bytes(benchmark::State& state, double bytes_per_iteration) {
  state.counters["bytes"] = benchmark::Counter(bytes_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}

// Small N(0, std) values: realistic magnitudes, no denormals or overflow.
inline void randomize(Slice1D x, std::uint64_t key, real stddev = real(0.02)) {
  kernels::init_normal(x, key, 0, stddev);
}
template <class View>
Slice1D flat(const View& v) {
  return Slice1D(v.data(), v.span());
}

// Benchmarks that depend on the launched ranks (the mesh of bench_collectives)
// register once MPI and Kokkos are up: a program adds a set-up function that
// calls benchmark::RegisterBenchmark, and a tear-down that frees what must go
// before Kokkos and MPI are finalized. bench_main runs them in that order.
struct LateHooks {
  std::vector<std::function<void()>> setup, teardown;
};
inline LateHooks& late_hooks() {
  static LateHooks hooks;
  return hooks;
}
struct LateRegistration {
  LateRegistration(std::function<void()> setup, std::function<void()> teardown) {
    late_hooks().setup.push_back(std::move(setup));
    late_hooks().teardown.push_back(std::move(teardown));
  }
};

}  // namespace ndmini::bench
