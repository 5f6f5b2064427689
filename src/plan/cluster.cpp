// SPDX-License-Identifier: BSD-3-Clause
#include "plan/cluster.hpp"

#include <toml++/toml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/regular_file.hpp"

namespace ndmini {
namespace {

// One key of a cluster file: where it lives, whether it must be there, the
// rule its value keeps, and where it goes.
struct ClusterKey {
  const char* path;
  bool required;
  double lo, hi;  // the value must lie in (lo, hi], or [lo, hi] for a latency (0: too small to matter) or the overlap
  const char* rule;
  double ClusterSpec::*member;     // null: device.per_node, a whole number
  bool omitted_when_zero = false;  // optional, 0 in the spec meaning absent: not written then
};

constexpr const char* kGemmRule = "a fraction of the precision's peak, above 0 and at most 1";
constexpr const char* kBusRule = "GB/s of bus bandwidth per device, above 0";

// The member of a shape class's key, by precision and class.
double ClusterSpec::*gemm_member(GemmClass c, Precision precision) {
  static double ClusterSpec::*const members[2][kGemmClasses] = {
      {&ClusterSpec::gemm_small_fp32, &ClusterSpec::gemm_medium_fp32, &ClusterSpec::gemm_large_fp32},
      {&ClusterSpec::gemm_small_bf16, &ClusterSpec::gemm_medium_bf16, &ClusterSpec::gemm_large_bf16}};
  return members[precision == Precision::bf16 ? 1 : 0][static_cast<int>(c)];
}

const std::vector<ClusterKey>& cluster_keys() {
  static const std::vector<ClusterKey> keys = {
      {"device.per_node", true, 0, 1e6, "a whole number of devices, at least 1", nullptr},
      {"device.memory_gib", true, 0, 1e6, "GiB per device, above 0", &ClusterSpec::memory_gib},
      {"device.peak_tflops_fp32", true, 0, 1e6, "dense TFLOP/s, above 0", &ClusterSpec::peak_tflops_fp32},
      {"device.peak_tflops_bf16", true, 0, 1e6, "dense TFLOP/s, above 0", &ClusterSpec::peak_tflops_bf16},
      {"device.memory_bandwidth_gbs", true, 0, 1e6, "GB/s, above 0", &ClusterSpec::memory_bandwidth_gbs},
      {"device.kernel_bandwidth_gbs", false, 0, 1e6, "GB/s, above 0", &ClusterSpec::kernel_bandwidth_gbs},
      {"device.launch_overhead_us", false, 0, 1e6, "microseconds per kernel launch, 0 or more",
       &ClusterSpec::launch_overhead_us, true},
      {"intra_node.bandwidth_gbs", true, 0, 1e6, "GB/s per device and direction, above 0",
       &ClusterSpec::intra_bandwidth_gbs},
      {"intra_node.latency_us", true, 0, 1e6, "microseconds, 0 or more", &ClusterSpec::intra_latency_us},
      {"intra_node.all_gather_gbs", false, 0, 1e6, kBusRule, &ClusterSpec::intra_all_gather_gbs, true},
      {"intra_node.reduce_scatter_gbs", false, 0, 1e6, kBusRule, &ClusterSpec::intra_reduce_scatter_gbs, true},
      {"intra_node.p2p_gbs", false, 0, 1e6, kBusRule, &ClusterSpec::intra_p2p_gbs, true},
      {"inter_node.bandwidth_gbs", true, 0, 1e6, "GB/s per device and direction, above 0",
       &ClusterSpec::inter_bandwidth_gbs},
      {"inter_node.latency_us", true, 0, 1e6, "microseconds, 0 or more", &ClusterSpec::inter_latency_us},
      {"inter_node.all_gather_gbs", false, 0, 1e6, kBusRule, &ClusterSpec::inter_all_gather_gbs, true},
      {"inter_node.reduce_scatter_gbs", false, 0, 1e6, kBusRule, &ClusterSpec::inter_reduce_scatter_gbs, true},
      {"inter_node.p2p_gbs", false, 0, 1e6, kBusRule, &ClusterSpec::inter_p2p_gbs, true},
      {"efficiency.compute", false, 0, 1, "a fraction of the peak, above 0 and at most 1",
       &ClusterSpec::compute_efficiency},
      {"efficiency.network", false, 0, 1, "a fraction of the bandwidth, above 0 and at most 1",
       &ClusterSpec::network_efficiency},
      {"efficiency.attention", false, 0, 1, "a fraction of the peak, above 0 and at most 1",
       &ClusterSpec::attention_efficiency},
      {"efficiency.overlap", false, 0, 1, "a fraction, 0 to 1", &ClusterSpec::overlap_efficiency},
      {"efficiency.gemm_small_fp32", false, 0, 1, kGemmRule, &ClusterSpec::gemm_small_fp32, true},
      {"efficiency.gemm_medium_fp32", false, 0, 1, kGemmRule, &ClusterSpec::gemm_medium_fp32, true},
      {"efficiency.gemm_large_fp32", false, 0, 1, kGemmRule, &ClusterSpec::gemm_large_fp32, true},
      {"efficiency.gemm_small_bf16", false, 0, 1, kGemmRule, &ClusterSpec::gemm_small_bf16, true},
      {"efficiency.gemm_medium_bf16", false, 0, 1, kGemmRule, &ClusterSpec::gemm_medium_bf16, true},
      {"efficiency.gemm_large_bf16", false, 0, 1, kGemmRule, &ClusterSpec::gemm_large_bf16, true},
  };
  return keys;
}

[[noreturn]] void refuse(const std::string& origin, const std::string& message) {
  throw Error("cluster file '" + origin + "': " + message + " (docs/planner.md lists the keys)");
}

// Every key of `table` must be one of ours (a typo is not a default).
void check_known(const toml::table& table, const std::string& origin) {
  for (const auto& [section, node] : table) {
    const std::string s(section.str());
    if (s == "name") {
      if (!node.is_string()) refuse(origin, "name must be a string");
      continue;
    }
    const toml::table* inner = node.as_table();
    bool known_section = false;
    for (const ClusterKey& k : cluster_keys())
      if (std::string(k.path).rfind(s + ".", 0) == 0) known_section = true;
    if (inner == nullptr || !known_section)
      refuse(origin, "unknown key '" + s + "': expected name, [device], [intra_node], [inter_node] or [efficiency]");
    for (const auto& [name, value] : *inner) {
      const std::string dotted = s + "." + std::string(name.str());
      bool known = false;
      for (const ClusterKey& k : cluster_keys()) known = known || dotted == k.path;
      if (!known) refuse(origin, "unknown key '" + dotted + "'");
    }
  }
}

}  // namespace

std::string gemm_key_path(GemmClass c, Precision precision) {
  const char* name = c == GemmClass::small ? "small" : c == GemmClass::medium ? "medium" : "large";
  return std::string("efficiency.gemm_") + name + (precision == Precision::bf16 ? "_bf16" : "_fp32");
}

double& ClusterSpec::gemm_key(GemmClass c, Precision precision) { return this->*gemm_member(c, precision); }
double ClusterSpec::gemm_key(GemmClass c, Precision precision) const { return this->*gemm_member(c, precision); }

double ClusterSpec::gemm_efficiency(GemmClass c, Precision precision) const {
  const double key = gemm_key(c, precision);
  return key > 0 ? key : compute_efficiency;
}

double ClusterSpec::peak_flops(Precision precision) const {
  return 1e12 * (precision == Precision::bf16 ? peak_tflops_bf16 : peak_tflops_fp32);
}

double ClusterSpec::memory_bytes() const { return memory_gib * 1024.0 * 1024.0 * 1024.0; }

ClusterSpec parse_cluster(const std::string& text, const std::string& origin) {
  toml::table table;
  try {
    table = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "line " << e.source().begin.line << ": not valid TOML: " << e.description();
    refuse(origin, os.str());
  }
  check_known(table, origin);
  ClusterSpec spec;
  spec.origin = origin;
  spec.name = table["name"].value_or(std::string(origin));
  double per_node = 0;
  for (const ClusterKey& k : cluster_keys()) {
    const toml::node* node = table.at_path(k.path).node();
    if (node == nullptr) {
      if (k.required) refuse(origin, "missing key " + std::string(k.path) + " (" + k.rule + ")");
      continue;
    }
    const std::optional<double> value = node->value<double>();  // integers read as doubles too
    if (!value || node->is_boolean()) refuse(origin, std::string(k.path) + " must be a number (" + k.rule + ")");
    std::ostringstream shown;
    shown << *value;
    if (!std::isfinite(*value) || *value < k.lo ||
        (*value == k.lo && std::string(k.path).find("latency") == std::string::npos &&
         std::string(k.path) != "device.launch_overhead_us" && std::string(k.path) != "efficiency.overlap") ||
        *value > k.hi)
      refuse(origin, std::string(k.path) + " = " + shown.str() + " is impossible: must be " + k.rule);
    if (k.member == nullptr) {
      if (*value != std::floor(*value)) refuse(origin, "device.per_node = " + shown.str() + " must be " + k.rule);
      per_node = *value;
    } else {
      spec.*k.member = *value;
    }
  }
  spec.devices_per_node = static_cast<int>(per_node);
  // Absent optional keys take the figures they refine.
  if (spec.attention_efficiency == 0) spec.attention_efficiency = spec.compute_efficiency;
  if (spec.kernel_bandwidth_gbs == 0) spec.kernel_bandwidth_gbs = spec.memory_bandwidth_gbs;
  return spec;
}

ClusterSpec load_cluster(const std::string& path) {
  const FileUse use{"cluster file '" + path + "'", "name a .toml file (e.g. inputs/clusters/dgx-a100-80gb.toml)"};
  return parse_cluster(read_small_file(path, kDeckMaxBytes, use), path);
}

std::string cluster_toml(const ClusterSpec& spec, const std::string& header,
                         const std::vector<std::pair<std::string, std::string>>& notes) {
  std::ostringstream os;
  os.precision(6);
  os << header << "name = \"" << spec.name << "\"\n";
  std::string section;
  for (const ClusterKey& k : cluster_keys()) {
    const std::string path = k.path, s = path.substr(0, path.find('.'));
    const double v = k.member == nullptr ? spec.devices_per_node : spec.*k.member;
    if (k.omitted_when_zero && v == 0) continue;
    if (s != section) os << "\n[" << (section = s) << "]\n";
    for (const auto& [key, note] : notes)
      if (key == path) os << "# " << note << "\n";
    os << path.substr(path.find('.') + 1) << " = " << v << (v == std::floor(v) && path != "device.per_node" ? ".0" : "")
       << "\n";
  }
  return os.str();
}

void write_cluster_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) throw Error("--out '" + path + "': cannot write '" + tmp + "': " + std::strerror(errno));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error("--out '" + path + "': cannot write it: " + why);
  }
}

}  // namespace ndmini
