// SPDX-License-Identifier: BSD-3-Clause
#include "plan/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "core/types.hpp"
#include "plan/cost_model.hpp"
#include "train/budget.hpp"
#include "train/calibration.hpp"

namespace ndmini {
namespace {

constexpr int kRepeats = 7;  // the median of these, after one untimed warm-up

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// GB/s of a device-memory copy: each element read once and written once.
double copy_bandwidth_gbs() {
  constexpr std::size_t kFloats = std::size_t{1} << 25;  // 128 MiB per buffer: past every cache
  View1D from("ndmini::calib_copy_from", kFloats), to("ndmini::calib_copy_to", kFloats);
  Kokkos::deep_copy(from, real(1));
  std::vector<double> seconds;
  for (int rep = -1; rep < kRepeats; ++rep) {
    Kokkos::fence();
    const auto t0 = Clock::now();
    Kokkos::deep_copy(to, from);
    Kokkos::fence();
    if (rep >= 0) seconds.push_back(seconds_since(t0));
  }
  return 2.0 * kFloats * sizeof(real) / median_of(seconds) / 1e9;
}

// Milliseconds of one all-reduce of `count` floats over `comm`: the median
// of the ranks' slowest.
double all_reduce_ms(Communicator& comm, View1D buf, std::size_t count) {
  std::vector<double> ms;
  for (int rep = -1; rep < kRepeats; ++rep) {
    mpi_barrier(comm.mpi(), "the collective calibration");
    const auto t0 = Clock::now();
    comm.all_reduce(buf.data(), count);
    Kokkos::fence();
    double t = ms_since(t0);
    mpi_all_reduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm.mpi(), "the collective calibration");
    if (rep >= 0) ms.push_back(t);
  }
  return median_of(ms);
}

}  // namespace

std::string calibrate_cluster(MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  require(size >= 2,
          "ndmini plan --calibrate pings the collectives between ranks: launch at least 2 (mpiexec -n 2 ndmini plan "
          "--calibrate), one per device");
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int per_node = 1;
  MPI_Comm_size(node, &per_node);
  MPI_Comm_free(&node);
  int nodes_min = per_node, nodes_max = per_node;  // the same on every node, or the file says the least
  mpi_all_reduce(MPI_IN_PLACE, &nodes_min, 1, MPI_INT, MPI_MIN, world, "the ranks per node");
  mpi_all_reduce(MPI_IN_PLACE, &nodes_max, 1, MPI_INT, MPI_MAX, world, "the ranks per node");

  ClusterSpec spec;
  spec.devices_per_node = nodes_min;
  spec.name = std::string("this machine, measured by ndmini plan --calibrate (") + ExecSpace::name() + ", " +
              std::to_string(size) + " ranks)";
  // Every rank measures at once, as the ranks of a run compute at once; the fastest rank speaks (as for MFU).
  double rates[3] = {calibrate_gemm_flops(Precision::fp32), calibrate_gemm_flops(Precision::bf16),
                     copy_bandwidth_gbs()};
  mpi_all_reduce(MPI_IN_PLACE, rates, 3, MPI_DOUBLE, MPI_MAX, world, "the compute calibration");
  spec.peak_tflops_fp32 = rates[0] / 1e12;
  spec.peak_tflops_bf16 = rates[1] / 1e12;
  // The copy measured one rank's share while every rank copied: the node's bandwidth split among them.
  spec.memory_bandwidth_gbs = rates[2];
  spec.memory_gib = memory_per_rank(Config{}, per_node, nullptr) / (1024.0 * 1024.0 * 1024.0);

  // Collectives: latency from a one-float all-reduce, bandwidth from a
  // 64 MiB one, both inverted through collective_ms (the planner's formula).
  Communicator comm(world, "calibration", device_collectives_backend(world));
  constexpr std::size_t kLarge = std::size_t{1} << 24;
  View1D buf("ndmini::calib_all_reduce", kLarge);
  const double small_ms = all_reduce_ms(comm, buf, 1), large_ms = all_reduce_ms(comm, buf, kLarge);
  const double latency_steps = collective_ms(Collective::all_reduce, 0, size, 1, 1e3);  // in units of the latency
  const double latency_us = small_ms * 1e3 / latency_steps;
  const double bytes = static_cast<double>(kLarge) * sizeof(real);
  const double beta_ms = std::max(large_ms - small_ms, 1e-6);  // the bandwidth part of the large call
  const double bandwidth_gbs = collective_ms(Collective::all_reduce, bytes, size, 1, 0) / beta_ms;  // 1 GB/s -> x
  const bool one_node = nodes_max == size;
  spec.intra_latency_us = spec.inter_latency_us = latency_us;
  spec.intra_bandwidth_gbs = spec.inter_bandwidth_gbs = bandwidth_gbs;
  spec.compute_efficiency = spec.network_efficiency = 1.0;  // measured rates, not datasheet ones
  if (rank != 0) return "";
  return cluster_toml(
      spec,
      "# Written by `ndmini plan --calibrate` (docs/planner.md): this machine's rates, measured, not\n"
      "# datasheet figures; regenerate it on the machine it describes.\n",
      {{"device.per_node", "ranks on one node (MPI_COMM_TYPE_SHARED): one device per rank"},
       {"device.memory_gib", "MemAvailable of the node / its ranks (host memory on a host build)"},
       {"device.peak_tflops_fp32", "the start-up GEMM calibration, fp32, 1024^3 NT/TN/NN, best run, fastest rank"},
       {"device.peak_tflops_bf16", "the same in bf16 (oneDNN where built, else emulated through fp32)"},
       {"device.memory_bandwidth_gbs", "a 128 MiB copy, read + write, median of 7, every rank at once"},
       {"intra_node.bandwidth_gbs",
        "a 64 MiB all-reduce over " + std::to_string(size) + " ranks through the comm layer, as ring bus bandwidth"},
       {"intra_node.latency_us", "a one-float all-reduce over " + std::to_string(size) + " ranks, per ring step"},
       {"inter_node.bandwidth_gbs", one_node ? "one node: the intra-node figure (no link between nodes to measure)"
                                             : "measured over all ranks, which span nodes: the slower link dominates"},
       {"inter_node.latency_us", one_node ? "one node: the intra-node figure" : "measured over all ranks"},
       {"efficiency.compute", "1: the rates above are measured"},
       {"efficiency.network", "1: the rates above are measured"}});
}

}  // namespace ndmini
