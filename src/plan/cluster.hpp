// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// A cluster file (TOML): what ndmini plan needs to know of the machine a
// layout would run on. docs/planner.md lists the keys; inputs/clusters/
// holds examples. Every key is required but the efficiencies, so a
// prediction never rests on a silent default for the machine itself.
//
//   name = "DGX A100 80GB"
//   [device]     per_node = 8   memory_gib = 80   memory_bandwidth_gbs = 2039
//                peak_tflops_fp32 = 19.5   peak_tflops_bf16 = 312
//   [intra_node] bandwidth_gbs = 300   latency_us = 3     # one direction, per device
//   [inter_node] bandwidth_gbs = 25    latency_us = 8
//   [efficiency] compute = 0.6   network = 0.8           # optional, see kDefault*Efficiency
//                attention = 0.4 overlap = 0.9          # optional: as compute, 1
//   [device] kernel_bandwidth_gbs = 900                 # optional: memory_bandwidth_gbs
//   [device] launch_overhead_us = 4                     # optional: launches not timed (a warning)
//   [intra_node] all_gather_gbs = 280 ...               # optional, per collective kind: bandwidth_gbs
//   [efficiency] gemm_small_fp32 = 0.5 ...               # optional, per shape class and precision: compute
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"

namespace ndmini {

// The fraction of the dense peak the model's matrix products reach, and
// of a link's bandwidth a collective reaches (nccl-tests' bus bandwidth
// against the datasheet's), when the cluster file does not say.
inline constexpr double kDefaultComputeEfficiency = 0.6;
inline constexpr double kDefaultNetworkEfficiency = 0.8;

// The matrix products' shape classes, by a product's smallest dimension
// (its rows, or a width under tensor parallelism): a product with a short
// side fills fewer of the kernel's tiles (a core's register blocks, a GPU's
// thread blocks) and runs slower per FLOP (docs/planner.md, "Shape classes").
enum class GemmClass { small, medium, large };
inline constexpr int kGemmClasses = 3;
inline constexpr double kMediumGemmFrom = 128, kLargeGemmFrom = 384;  // smallest dimensions
constexpr GemmClass gemm_class(double smallest_dimension) {
  return smallest_dimension < kMediumGemmFrom  ? GemmClass::small
         : smallest_dimension < kLargeGemmFrom ? GemmClass::medium
                                               : GemmClass::large;
}
// Its key in a cluster file: "efficiency.gemm_small_fp32", ...
std::string gemm_key_path(GemmClass c, Precision precision);

struct ClusterSpec {
  std::string name;
  std::string origin;  // the file it was read from
  int devices_per_node = 0;
  double memory_gib = 0;  // per device
  double peak_tflops_fp32 = 0, peak_tflops_bf16 = 0;
  double memory_bandwidth_gbs = 0;
  // The links, per device and per direction: GB/s (1e9 bytes per second)
  // and microseconds per message, inside a node and between nodes.
  double intra_bandwidth_gbs = 0, intra_latency_us = 0;
  double inter_bandwidth_gbs = 0, inter_latency_us = 0;
  // Optional, measured by ndmini plan --calibrate: the bus bandwidth an
  // all-gather, a reduce-scatter and a ring exchange of messages (send to
  // the next rank, receive from the one before) reach on each link, where
  // they differ from the all-reduce's above (0: absent, bandwidth_gbs
  // stands in, as on NCCL, whose rings move every kind at one rate).
  double intra_all_gather_gbs = 0, intra_reduce_scatter_gbs = 0, intra_p2p_gbs = 0;
  double inter_all_gather_gbs = 0, inter_reduce_scatter_gbs = 0, inter_p2p_gbs = 0;
  double compute_efficiency = kDefaultComputeEfficiency;
  double network_efficiency = kDefaultNetworkEfficiency;
  // Optional, measured by ndmini plan --calibrate: the fraction of the peak
  // the attention kernels reach (absent: compute_efficiency); the bandwidth
  // the memory-bound kernels reach, in the cost model's count of their
  // bytes (absent: memory_bandwidth_gbs); and of a collective that can hide
  // behind compute, the part that does (absent: 1, as on a device whose
  // copy engines move data while it computes).
  double attention_efficiency = 0;
  double kernel_bandwidth_gbs = 0;
  double overlap_efficiency = 1;
  // Optional, measured by ndmini plan --calibrate: the time a kernel launch
  // costs the device beyond its work (0: absent; the planner then leaves
  // launches out of the step and warns where they would matter).
  double launch_overhead_us = 0;
  // Optional, measured by ndmini plan --calibrate: the fraction of the
  // precision's peak the products of each shape class reach (0: absent,
  // compute_efficiency stands in).
  double gemm_small_fp32 = 0, gemm_medium_fp32 = 0, gemm_large_fp32 = 0;
  double gemm_small_bf16 = 0, gemm_medium_bf16 = 0, gemm_large_bf16 = 0;

  // Dense peak in FLOP/s of one device for matrix products in `precision`.
  double peak_flops(Precision precision) const;
  // The fraction of that peak the products of class `c` reach: its key, or compute_efficiency.
  double gemm_efficiency(GemmClass c, Precision precision) const;
  // Its key's value (0: absent), for the calibration and the fit to set.
  double& gemm_key(GemmClass c, Precision precision);
  double gemm_key(GemmClass c, Precision precision) const;
  double memory_bytes() const;
};

// Reads and checks a cluster file; throws Error naming the key and the
// file for a missing, mistyped, unknown or impossible value.
ClusterSpec parse_cluster(const std::string& text, const std::string& origin);
ClusterSpec load_cluster(const std::string& path);

// The cluster file of `spec` as TOML text, each value preceded by its
// comment from `notes` (keyed "device.per_node", ...; absent: no comment).
std::string cluster_toml(const ClusterSpec& spec, const std::string& header,
                         const std::vector<std::pair<std::string, std::string>>& notes = {});

// Writes `text` to `path` whole or not at all (a temporary name, then a
// rename); throws Error naming the file.
void write_cluster_file(const std::string& path, const std::string& text);

}  // namespace ndmini
