// SPDX-License-Identifier: BSD-3-Clause
// Collectives over ndmini's own comm layer, the way nccl-tests reports them:
// all-reduce (blocking, and issued non-blocking then waited), all-gather,
// reduce-scatter, broadcast, send/recv (a ring exchange through
// Communicator::batch_p2p) and all-to-all (Communicator::all_to_all_v with
// equal blocks, as nccl-tests' alltoall) on every mesh axis of more than one rank, from
// 4 B to 256 MiB, plus a memcpy (Kokkos::deep_copy) in the same run for
// scale. Every benchmark checks its result on the first and the last
// iteration; a wrong element is an error, not a slow number.
//
// The mesh comes from NDMINI_BENCH_MESH ("dp_replicate=2,tp=2"; omitted axes
// are 1, one axis may be -1 for what is left; default: dp_replicate=-1, all
// ranks on one axis). NDMINI_BENCH_MAX_BYTES caps the sizes (default 256 MiB).
// NDMINI_BENCH_TIMEOUT_S=S runs under a CollectiveWatchdog (comm.timeout_s = S).
//
//   mpiexec -n 2 bench/bench_collectives --benchmark_counters_tabular=true
//   NDMINI_BENCH_MESH=dp_shard=2,tp=2 mpiexec -n 4 bench/bench_collectives --benchmark_filter='all_reduce/'
//
// Definitions (nccl-tests' PERFORMANCE.md): S is the size of the benchmark
// name in bytes -- the buffer for all-reduce and broadcast, the full gathered
// (or scattered) buffer for all-gather and reduce-scatter, one rank's send
// buffer (n blocks of S/n, its own included) for all-to-all, one message for
// send/recv and memcpy. t is the slowest rank's time per iteration, averaged
// over iterations (Google Benchmark's Time column). algbw = S / t; busbw =
// algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter
// and all-to-all (each rank's link carries all but its own block, as
// nccl-tests counts it), x 1 for broadcast, send/recv and memcpy, n the axis size.
// t_avg/t_min/t_max are the mean per-rank times, averaged/min/max over ranks.
//
// Overlap (overlap/AXIS/SIZE/mpi_calls and .../progress_thread, 1 MiB and
// up): an all-reduce issued non-blocking, then a fixed amount of host
// compute without an MPI call (calibrated once to take NDMINI_BENCH_OVERLAP_MS,
// default 50, on an idle rank), as a block's backward does, then waited for.
// The time is the wait alone: what stays exposed; compute_ms is what the
// compute took meanwhile, so a thread that slows it shows there.
// mpi_calls leaves progress to the MPI calls; progress_thread runs the comm
// layer's progress thread (comm/progress.hpp, comm.progress_poll_us = 100).
// Set beside all_reduce of the same size: the exposed part against the whole.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "comm/communicator.hpp"
#include "comm/progress.hpp"
#include "core/error.hpp"
#include "mesh/mesh.hpp"

namespace {

using namespace ndmini;

constexpr std::size_t kMinBytes = 4;
constexpr std::size_t kDefaultMaxBytes = std::size_t{256} << 20;
constexpr double kGB = 1e9;  // bandwidths in GB/s, as nccl-tests prints them

enum class Op { all_reduce, all_reduce_nb, all_gather, reduce_scatter, broadcast, sendrecv, all_to_all, memcpy };

const char* op_name(Op op) {
  switch (op) {
    case Op::all_reduce:
      return "all_reduce";
    case Op::all_reduce_nb:
      return "all_reduce_nb";
    case Op::all_gather:
      return "all_gather";
    case Op::reduce_scatter:
      return "reduce_scatter";
    case Op::broadcast:
      return "broadcast";
    case Op::sendrecv:
      return "sendrecv";
    case Op::all_to_all:
      return "all_to_all_v";
    case Op::memcpy:
      return "memcpy";
  }
  return "?";
}

// nccl-tests' bus-bandwidth factors.
double bus_factor(Op op, int n) {
  switch (op) {
    case Op::all_reduce:
    case Op::all_reduce_nb:
      return 2.0 * (n - 1) / n;
    case Op::all_gather:
    case Op::reduce_scatter:
    case Op::all_to_all:
      return static_cast<double>(n - 1) / n;
    default:
      return 1.0;
  }
}

// Exact in float and different per rank and element: sums over thousands of
// ranks stay exact, so results are compared with ==.
KOKKOS_INLINE_FUNCTION real value(int rank, std::size_t i) { return static_cast<real>(rank + 1 + (i % 13)); }

void fill(const View1D& v, int rank, std::size_t offset = 0) {
  Kokkos::parallel_for(
      "ndmini::bench_fill", Kokkos::RangePolicy<ExecSpace>(0, v.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { v(i) = value(rank, offset + i); });
}

// The mesh and one Communicator per axis, alive for the whole run.
struct Fixture {
  std::unique_ptr<CollectiveWatchdog> watchdog;
  std::unique_ptr<Mesh> mesh;
  std::vector<std::unique_ptr<Communicator>> axes;
  int world_rank = 0;
};
Fixture& fixture() {
  static Fixture f;
  return f;
}

ParallelDims mesh_from_env(int world) {
  std::array<int, kNumAxes> degrees{1, 1, 1, 1, 1};
  degrees[static_cast<int>(Axis::dp_replicate)] = -1;
  if (const char* env = std::getenv("NDMINI_BENCH_MESH"); env != nullptr && *env != '\0') {
    degrees[static_cast<int>(Axis::dp_replicate)] = 1;
    std::string spec(env);
    for (char& c : spec)
      if (c == ',') c = ' ';
    std::istringstream in(spec);
    std::string item;
    while (in >> item) {
      const auto eq = item.find('=');
      require(eq != std::string::npos, "NDMINI_BENCH_MESH: '" + item + "' is not axis=degree (e.g. tp=2)");
      int* degree = nullptr;
      for (Axis a : kAxes)
        if (item.compare(0, eq, axis_name(a)) == 0) degree = &degrees[static_cast<int>(a)];
      require(degree != nullptr,
              "NDMINI_BENCH_MESH: unknown axis in '" + item + "' (pp, dp_replicate, dp_shard, cp, tp)");
      char* end = nullptr;
      const long v = std::strtol(item.c_str() + eq + 1, &end, 10);
      require(end != item.c_str() + eq + 1 && *end == '\0' && (v == -1 || v >= 1),
              "NDMINI_BENCH_MESH: '" + item + "': the degree must be an integer >= 1, or -1 for what is left");
      *degree = static_cast<int>(v);
    }
  }
  long long product = 1;
  int wild = -1;
  for (int i = 0; i < kNumAxes; ++i) {
    if (degrees[i] != -1) {
      product *= degrees[i];
      continue;
    }
    require(wild < 0, "NDMINI_BENCH_MESH: at most one degree may be -1");
    wild = i;
  }
  if (wild >= 0) {
    require(world % product == 0,
            "NDMINI_BENCH_MESH: the degrees do not divide the " + std::to_string(world) + " ranks launched");
    degrees[wild] = static_cast<int>(world / product);
    product = world;
  }
  const ParallelDims shape = ParallelDims::from_degrees(degrees);
  require(product == world, "NDMINI_BENCH_MESH = '" + shape.str() + "' holds " + std::to_string(product) +
                                " ranks, but " + std::to_string(world) + " were launched");
  return shape;
}

std::size_t max_bytes() {
  const char* env = std::getenv("NDMINI_BENCH_MAX_BYTES");
  if (env == nullptr || *env == '\0') return kDefaultMaxBytes;
  const long long v = std::atoll(env);
  require(v >= static_cast<long long>(kMinBytes), "NDMINI_BENCH_MAX_BYTES must be at least 4");
  return static_cast<std::size_t>(v);
}

// Buffers of one benchmark and the check of its result.
struct Case {
  Op op;
  Communicator* comm;  // null for memcpy
  std::size_t bytes;
  int n = 1, rank = 0;
  View1D a, b, pristine;
  AllToAllCounts blocks;  // all-to-all: n equal blocks each way

  Case(Op op_, Communicator* c, std::size_t bytes_) : op(op_), comm(c), bytes(bytes_) {
    if (comm != nullptr) {
      n = comm->size();
      rank = comm->rank();
    }
    const std::size_t count = bytes / sizeof(real);
    switch (op) {
      case Op::all_reduce:
      case Op::all_reduce_nb:
        a = View1D("ndmini::bench_buf", count);
        pristine = View1D("ndmini::bench_pristine", count);
        fill(pristine, rank);
        break;
      case Op::all_gather:
        a = View1D("ndmini::bench_send", count / n);
        b = View1D("ndmini::bench_recv", count);
        fill(a, rank);
        break;
      case Op::reduce_scatter:
        a = View1D("ndmini::bench_send", count);
        b = View1D("ndmini::bench_recv", count / n);
        fill(a, rank);
        break;
      case Op::broadcast:
        a = View1D("ndmini::bench_buf", count);
        fill(a, rank);
        break;
      case Op::sendrecv:
      case Op::all_to_all:
      case Op::memcpy:
        a = View1D("ndmini::bench_send", count);
        b = View1D("ndmini::bench_recv", count);
        fill(a, rank);
        break;
    }
    if (op == Op::all_to_all)
      blocks = AllToAllCounts::packed(std::vector<std::size_t>(n, count / n), std::vector<std::size_t>(n, count / n));
  }

  // Untimed preparation of one iteration: in-place all-reduce needs its input back.
  void prepare() {
    if (op == Op::all_reduce || op == Op::all_reduce_nb) Kokkos::deep_copy(a, pristine);
  }

  void run() {
    const std::size_t count = bytes / sizeof(real);
    switch (op) {
      case Op::all_reduce:
        comm->all_reduce(a.data(), count);
        break;
      case Op::all_reduce_nb:
        comm->iall_reduce(a.data(), count).wait();
        break;
      case Op::all_gather:
        comm->all_gather(a.data(), b.data(), count / n);
        break;
      case Op::reduce_scatter:
        comm->reduce_scatter(a.data(), b.data(), count / n);
        break;
      case Op::broadcast:
        comm->broadcast(a.data(), count, 0);
        break;
      case Op::sendrecv: {
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        comm->batch_p2p({{P2POp::Kind::send, a.data(), count, next, 0}, {P2POp::Kind::recv, b.data(), count, prev, 0}})
            .wait();
        break;
      }
      case Op::all_to_all:
        comm->all_to_all_v(a.data(), b.data(), blocks);
        break;
      case Op::memcpy:
        Kokkos::deep_copy(b, a);
        break;
    }
  }

  // Elements of this rank's result that differ from the expected values.
  std::int64_t wrong() const {
    const std::size_t count = bytes / sizeof(real);
    const View1D& out = (op == Op::all_reduce || op == Op::all_reduce_nb || op == Op::broadcast) ? a : b;
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < h.extent(0); ++i) {
      real want = 0;
      switch (op) {
        case Op::all_reduce:
        case Op::all_reduce_nb:
          for (int r = 0; r < n; ++r) want += value(r, i);
          break;
        case Op::all_gather: {
          const std::size_t per = count / n;
          want = value(static_cast<int>(i / per), i % per);
          break;
        }
        case Op::reduce_scatter:
          for (int r = 0; r < n; ++r) want += value(r, static_cast<std::size_t>(rank) * (count / n) + i);
          break;
        case Op::broadcast:
          want = value(0, i);
          break;
        case Op::sendrecv:
          want = value((rank + n - 1) % n, i);
          break;
        case Op::all_to_all: {
          const std::size_t per = count / n;  // block i / per came from that rank's block `rank`
          want = value(static_cast<int>(i / per), static_cast<std::size_t>(rank) * per + i % per);
          break;
        }
        case Op::memcpy:
          want = value(rank, i);
          break;
      }
      bad += h(i) != want;
    }
    return bad;
  }
};

// The slowest rank's time as the iteration's: every rank reports the same,
// so Google Benchmark picks the same iteration count everywhere (lockstep).
void set_slowest_rank_time(benchmark::State& state, double seconds) {
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  state.SetIterationTime(seconds);
}

void run_case(benchmark::State& state, Op op, Communicator* comm, std::size_t bytes) {
  Case c(op, comm, bytes);
  std::int64_t wrong = 0;
  c.prepare();
  c.run();  // warm-up, untimed, checked
  Kokkos::fence();
  wrong += c.wrong();
  double own_seconds = 0;
  std::int64_t iterations = 0;
  for (auto _ : state) {
    c.prepare();
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    c.run();
    Kokkos::fence();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    own_seconds += seconds;
    ++iterations;
    set_slowest_rank_time(state, seconds);
  }
  wrong += c.wrong();
  // Mean time per iteration of each rank, then average/min/max over ranks.
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const double mean = iterations > 0 ? own_seconds / static_cast<double>(iterations) : 0;
  double sum = mean, lo = mean, hi = mean;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);

  state.counters["n"] = c.n;
  state.counters["t_avg_us"] = 1e6 * sum / world;
  state.counters["t_min_us"] = 1e6 * lo;
  state.counters["t_max_us"] = 1e6 * hi;
  // algbw over the manual (slowest-rank) time: S per iteration / summed time.
  state.counters["algbw_GBps"] =
      benchmark::Counter(static_cast<double>(bytes) / kGB, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw_GBps"] = benchmark::Counter(static_cast<double>(bytes) * bus_factor(op, c.n) / kGB,
                                                    benchmark::Counter::kIsIterationInvariantRate);
  state.counters["wrong"] = static_cast<double>(wrong);
  if (wrong > 0) state.SkipWithError((std::to_string(wrong) + " wrong elements (summed over ranks)").c_str());
}

double overlap_compute_ms() {
  const char* env = std::getenv("NDMINI_BENCH_OVERLAP_MS");
  return env != nullptr && *env != '\0' ? std::atof(env) : 50.0;
}

// `rounds` rounds of host work that make no MPI call.
void compute_without_mpi(std::int64_t rounds) {
  volatile double sink = 0;
  for (std::int64_t r = 0; r < rounds; ++r)
    for (int i = 0; i < 1000; ++i) sink = sink + 1e-9 * i;
}

// Rounds of compute_without_mpi that take overlap_compute_ms() here, now,
// with nothing else in flight; the largest over the ranks, so all do the same.
std::int64_t overlap_rounds() {
  static std::int64_t rounds = 0;
  if (rounds > 0) return rounds;
  constexpr std::int64_t kProbe = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  compute_without_mpi(kProbe);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  rounds = std::max<std::int64_t>(1, static_cast<std::int64_t>(kProbe * overlap_compute_ms() / std::max(ms, 1e-3)));
  MPI_Allreduce(MPI_IN_PLACE, &rounds, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return rounds;
}

// See "Overlap" at the top: the exposed wait of an all-reduce issued before compute.
void run_overlap(benchmark::State& state, Communicator* comm, std::size_t bytes, bool progress_thread) {
  constexpr double kPollUs = 100;  // CommConfig's default comm.progress_poll_us
  const MpiProgressThread progress(MPI_COMM_WORLD, progress_thread ? kPollUs : 0);
  if (progress_thread && !progress.running()) {
    state.SkipWithError("no progress thread: this MPI library does not provide MPI_THREAD_MULTIPLE");
    return;
  }
  Case c(Op::all_reduce_nb, comm, bytes);
  const std::int64_t rounds = overlap_rounds();
  std::int64_t wrong = 0;
  double own_seconds = 0, compute_seconds = 0;
  std::int64_t iterations = 0;
  for (auto _ : state) {
    c.prepare();
    Kokkos::fence();
    MPI_Barrier(comm->mpi());  // every rank issues together: what stays is the transfer, not lateness
    CommRequest request = comm->iall_reduce(c.a.data(), bytes / sizeof(real));
    const auto tc = std::chrono::steady_clock::now();
    compute_without_mpi(rounds);
    const auto t0 = std::chrono::steady_clock::now();
    compute_seconds += std::chrono::duration<double>(t0 - tc).count();
    request.wait();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    own_seconds += seconds;
    ++iterations;
    set_slowest_rank_time(state, seconds);
  }
  wrong += c.wrong();
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  double mean[2] = {iterations > 0 ? own_seconds / static_cast<double>(iterations) : 0,
                    iterations > 0 ? compute_seconds / static_cast<double>(iterations) : 0};
  MPI_Allreduce(MPI_IN_PLACE, mean, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  state.counters["n"] = c.n;
  state.counters["compute_ms"] = 1e3 * mean[1];      // the slowest rank's mean compute time
  state.counters["exposed_max_us"] = 1e6 * mean[0];  // the slowest rank's mean wait
  state.counters["wrong"] = static_cast<double>(wrong);
  if (wrong > 0) state.SkipWithError((std::to_string(wrong) + " wrong elements (summed over ranks)").c_str());
}

void register_all() {
  Fixture& f = fixture();
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &f.world_rank);
  const ParallelDims shape = mesh_from_env(world);
  // NDMINI_BENCH_TIMEOUT_S: measure under hang detection (comm.timeout_s),
  // where blocking calls are issued non-blocking and waited for.
  if (const char* env = std::getenv("NDMINI_BENCH_TIMEOUT_S"); env != nullptr && *env != '\0')
    f.watchdog = std::make_unique<CollectiveWatchdog>(MPI_COMM_WORLD, std::atof(env));
  f.mesh = std::make_unique<Mesh>(shape, MPI_COMM_WORLD);
  // The backend training picks: NCCL where it can run on device buffers, else MPI.
  const auto backend = device_collectives_backend(MPI_COMM_WORLD);
  for (Axis a : kAxes)
    if (shape.degree_of(a) > 1 || (world == 1 && a == Axis::dp_replicate))
      f.axes.push_back(std::make_unique<Communicator>(f.mesh->axis(a), axis_name(a), backend));

  const std::size_t top = max_bytes();
  for (Op op : {Op::all_reduce, Op::all_reduce_nb, Op::all_gather, Op::reduce_scatter, Op::broadcast, Op::sendrecv,
                Op::all_to_all}) {
    for (auto& comm : f.axes) {
      for (std::size_t bytes = kMinBytes; bytes <= top; bytes *= 2) {
        const std::size_t count = bytes / sizeof(real);
        if ((op == Op::all_gather || op == Op::reduce_scatter || op == Op::all_to_all) && count % comm->size() != 0)
          continue;
        const std::string name = std::string(op_name(op)) + "/" + comm->name() + "/" + std::to_string(bytes);
        Communicator* c = comm.get();
        benchmark::RegisterBenchmark(name.c_str(), [op, c, bytes](benchmark::State& s) { run_case(s, op, c, bytes); })
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  constexpr std::size_t kOverlapMinBytes = std::size_t{1} << 20;
  constexpr int kOverlapIterations = 10;
  for (auto& comm : f.axes) {
    if (comm->backend() != Communicator::Backend::mpi) continue;  // the thread progresses MPI only
    for (std::size_t bytes = kOverlapMinBytes; bytes <= top; bytes *= 2) {
      for (bool thread : {false, true}) {
        const std::string name =
            "overlap/" + comm->name() + "/" + std::to_string(bytes) + (thread ? "/progress_thread" : "/mpi_calls");
        Communicator* c = comm.get();
        benchmark::RegisterBenchmark(name.c_str(),
                                     [c, bytes, thread](benchmark::State& s) { run_overlap(s, c, bytes, thread); })
            // A fixed count: Google Benchmark would otherwise run until the
            // waits (near 0 when hidden) add up to its minimum time.
            ->Iterations(kOverlapIterations)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  for (std::size_t bytes = kMinBytes; bytes <= top; bytes *= 2) {
    const std::string name = "memcpy/" + std::to_string(bytes);
    benchmark::RegisterBenchmark(name.c_str(),
                                 [bytes](benchmark::State& s) { run_case(s, Op::memcpy, nullptr, bytes); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  if (f.world_rank == 0) {
    std::printf("bench_collectives: mesh %s, %s backend, sizes %zu B to %zu B, comm.timeout_s %g\n",
                shape.str().c_str(), backend == Communicator::Backend::nccl ? "NCCL" : "MPI", kMinBytes, top,
                f.watchdog ? f.watchdog->timeout_s() : 0.0);
    std::fflush(stdout);
  }
}

// Communicators and the mesh free MPI communicators: before MPI_Finalize.
void free_all() {
  fixture().axes.clear();
  fixture().mesh.reset();
  fixture().watchdog.reset();
}

const bench::LateRegistration registration(register_all, free_all);

}  // namespace
