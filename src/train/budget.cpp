// SPDX-License-Identifier: BSD-3-Clause
#include "train/budget.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "core/types.hpp"
#include "model/gpt.hpp"

namespace ndmini {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kFloat = sizeof(real);
// Parameters, gradients, exp_avg, exp_avg_sq.
constexpr double kStateCopies = 4;
// Units FSDP holds gathered at once (the one computing, the one prefetched),
// each with its parameters and gradients.
constexpr double kGatheredUnits = 2, kGatheredCopies = 2;
constexpr double kTokenHeaderBytes = 1024;

template <class T>
std::string key(const char* name, T value) {
  std::ostringstream os;
  os << name << " = " << value;
  return os.str();
}

// MemAvailable of this node in bytes, 0 when unknown.
double mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string name;
  double kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit)
    if (name == "MemAvailable:") return kib * 1024.0;
  return 0;
}

}  // namespace

double MemoryEstimate::sum(const std::string& kind) const {
  double s = 0;
  for (const Part& p : parts)
    if (p.kind == kind) s += p.bytes;
  return s;
}

double MemoryEstimate::total() const {
  double s = 0;
  for (const Part& p : parts) s += p.bytes;
  return s;
}

const MemoryEstimate::Part& MemoryEstimate::largest() const {
  return *std::max_element(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.bytes < b.bytes; });
}

std::string bytes_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  double v = bytes;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[64];
  if (v >= 1024)
    std::snprintf(buf, sizeof buf, "%.2g bytes", bytes);
  else
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

MemoryEstimate estimate_memory(const Config& cfg, const MeshShape& shape) {
  // The terms of gpt_state_bytes and gpt_activation_bytes (model/gpt.cpp),
  // split by the keys they grow with and by the layout, in double: a deck
  // with a billion layers gives a number to refuse, not an overflow.
  const auto& m = cfg.model;
  const double L = m.layers, C = m.channels, H = m.heads, V = m.vocab, T = m.seq_len;
  const double B = cfg.train.micro_batch, N = B * T;
  const double tp = shape.degree_of(Axis::tp);
  const double fsdp = static_cast<double>(shape.degree_of(Axis::dp_shard)) * shape.degree_of(Axis::cp);
  // Per tp rank: the split weights (c_attn, c_proj, c_fc, mlp c_proj; wte) and
  // the replicated ones (LayerNorms, row-parallel biases; wpe, ln_f).
  const double layer = (12 * C * C + 7 * C) / tp + 6 * C;
  const double vocab = V * C / tp, positions = T * C + 2 * C;
  const double gathered = fsdp > 1 ? kGatheredUnits * kGatheredCopies * kFloat : 0;
  const std::string lc = key("model.layers", m.layers) + " x " + key("model.channels", m.channels);
  MemoryEstimate e;
  e.parts.push_back({lc, "model state", kStateCopies * kFloat * L * layer / fsdp + gathered * layer});
  e.parts.push_back({key("model.vocab", m.vocab) + " x " + key("model.channels", m.channels), "model state",
                     kStateCopies * kFloat * vocab / fsdp + gathered * (vocab + positions)});
  e.parts.push_back({key("model.seq_len", m.seq_len) + " x " + key("model.channels", m.channels), "model state",
                     kStateCopies * kFloat * positions / fsdp});
  const std::string bt = key("train.micro_batch", cfg.train.micro_batch) + " x " + key("model.seq_len", m.seq_len);
  e.parts.push_back({bt + " x " + lc, "activations", kFloat * L * (16 * N * C + 4 * N) / tp});
  e.parts.push_back({key("model.seq_len", m.seq_len) + " squared x " + key("train.micro_batch", cfg.train.micro_batch) +
                         " x " + key("model.heads", m.heads) + " x " + key("model.layers", m.layers),
                     "activations", kFloat * L * B * H * T * T / tp});
  e.parts.push_back({bt + " x " + key("model.vocab", m.vocab), "activations", kFloat * N * V / tp});
  e.parts.push_back(
      {bt + " x " + key("model.channels", m.channels), "activations", kFloat * (20 * N * C + 3 * N + T * T) / tp});
  // A file source is read whole, then held as tokens.
  double data = 0;
  if (cfg.data.source != "synthetic") {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(cfg.data.path, ec);
    if (!ec) {
      const double tokens = cfg.data.source == "text"
                                ? static_cast<double>(bytes)
                                : std::max(0.0, (static_cast<double>(bytes) - kTokenHeaderBytes) / 2);
      data = static_cast<double>(bytes) + tokens * sizeof(token_t);
    }
  }
  e.parts.push_back({"data.path = \"" + cfg.data.path + "\"", "data", data});
  return e;
}

double memory_per_rank(const Config& cfg, int ranks_on_node, std::string* how) {
  if (cfg.perf.memory_per_rank_gib > 0) {
    if (how) *how = key("perf.memory_per_rank_gib", cfg.perf.memory_per_rank_gib);
    return cfg.perf.memory_per_rank_gib * kGiB;
  }
  const double available = mem_available();
  if (how)
    *how = "MemAvailable " + bytes_text(available) + " on this node / " + std::to_string(ranks_on_node) +
           (ranks_on_node == 1 ? " rank" : " ranks");
  return available / std::max(1, ranks_on_node);
}

void require_memory_fits(const Config& cfg, const MeshShape& shape, int ranks_on_node) {
  const MemoryEstimate e = estimate_memory(cfg, shape);
  std::string how;
  const double limit = memory_per_rank(cfg, ranks_on_node, &how);
  if (limit <= 0 || e.total() <= limit) return;
  const auto& big = e.largest();
  std::string fix;
  if (big.kind == "data")
    fix = "the file is held in memory whole: use a smaller file, or more nodes for the same ranks";
  else if (big.kind == "activations")
    fix =
        "lower one of them (train.micro_batch costs nothing but throughput), or split the activations with parallel.tp";
  else
    fix = "lower one of them, or shard the model state over more ranks (parallel.dp_shard, parallel.tp)";
  throw Error("the run needs about " + bytes_text(e.total()) + " per rank (model state " + bytes_text(e.state()) +
              ", activations " + bytes_text(e.activations()) + ", data " + bytes_text(e.data()) + "), more than the " +
              bytes_text(limit) + " one rank may use (" + how + "); the largest part, " + big.kind + " of " +
              bytes_text(big.bytes) + ", grows with " + big.keys + ": " + fix +
              " (perf.memory_per_rank_gib sets the limit)");
}

std::uint64_t checkpoint_bytes(const ModelConfig& m) {
  // Three float32 tensors per parameter: the model and both AdamW moments.
  return static_cast<std::uint64_t>(3 * kFloat) * static_cast<std::uint64_t>(gpt_param_count(m));
}

}  // namespace ndmini
