// SPDX-License-Identifier: BSD-3-Clause
#include "run/budget.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.hpp"
#include "core/regular_file.hpp"
#include "core/types.hpp"
#include "model/gpt.hpp"
#include "model/moe.hpp"
#include "run/memory_estimate.hpp"

namespace ndmini {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kFloat = sizeof(real);
constexpr double kTokenHeaderBytes = 1024;

template <class T>
std::string key(const char* name, T value) {
  std::ostringstream os;
  os << name << " = " << value;
  return os.str();
}

// MemAvailable of this node in bytes, 0 when unknown.
double mem_available() {
  std::istringstream in;
  try {
    // About 1.5 KiB; a limit keeps a strange kernel from costing memory.
    in.str(read_small_file("/proc/meminfo", kProcFileMaxBytes, {"'/proc/meminfo'", "the memory is unknown"}));
  } catch (const Error&) {
    return 0;
  }
  std::string name;
  double kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit)
    if (name == "MemAvailable:") return kib * 1024.0;
  return 0;
}

}  // namespace

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

double data_bytes(const Config& cfg) {
  if (cfg.data.source == "synthetic") return 0;
  // A file source is held as tokens (read in 1 MiB pieces, train/data.cpp);
  // so is data.val_path when it is read.
  auto file_bytes = [&](const std::string& path) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    if (ec) return 0.0;
    const double tokens = cfg.data.source == "text"
                              ? static_cast<double>(bytes)
                              : std::max(0.0, (static_cast<double>(bytes) - kTokenHeaderBytes) / 2);
    return tokens * sizeof(token_t);
  };
  const bool val_file = cfg.train.eval_every > 0 && !cfg.data.val_path.empty();
  return file_bytes(cfg.data.path) + (val_file ? file_bytes(cfg.data.val_path) : 0.0);
}

std::vector<MemoryPart> memory_parts(const Config& cfg, const RunLayout& layout) {
  const auto& m = cfg.model;
  const MemoryEstimate e = estimate_memory(cfg, layout);
  const std::string lc = key("model.layers", m.layers) + " x " + key("model.channels", m.channels);
  const std::string vc = key("model.vocab", m.vocab) + " x " + key("model.channels", m.channels);
  const std::string bt = key("train.micro_batch", cfg.train.micro_batch) + " x " + key("model.seq_len", m.seq_len);
  // The state grows with whichever of the blocks and the embedding is larger.
  const double C = m.channels;
  const bool blocks_dominate =
      m.layers * static_cast<double>(gpt_block_matrix_param_count(m)) >= static_cast<double>(m.vocab) * C;
  return {{"model state", blocks_dominate ? lc : vc, static_cast<double>(e.state_bytes)},
          {"activations",
           bt + " x " + lc + " (" + std::to_string(e.in_flight) + " micro-batch" + (e.in_flight == 1 ? "" : "es") +
               " in flight)",
           static_cast<double>(e.in_flight) * static_cast<double>(e.activation_bytes_per_micro_batch)},
          {"scratch", bt + " x " + key("model.vocab", m.vocab), static_cast<double>(e.scratch_bytes)},
          {"data", "data.path = \"" + cfg.data.path + "\"", data_bytes(cfg)}};
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

void require_memory_fits(const Config& cfg, const RunLayout& layout, int ranks_on_node) {
  const std::vector<MemoryPart> parts = memory_parts(cfg, layout);
  double total = 0;
  for (const MemoryPart& p : parts) total += p.bytes;
  std::string how;
  const double limit = memory_per_rank(cfg, ranks_on_node, &how);
  if (limit <= 0 || total <= limit) return;
  const MemoryPart& big =
      *std::max_element(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  std::string fix;
  if (big.kind == "data")
    fix = "the file is held in memory whole: use a smaller file, or more nodes for the same ranks";
  else if (big.kind == "model state")
    fix = "lower one of them, or shard the model state over more ranks (parallel.dp_shard, parallel.tp, parallel.pp)";
  else
    fix =
        "lower one of them (train.micro_batch costs nothing but throughput), or split the activations with "
        "parallel.tp, parallel.cp or train.recompute = \"block\"";
  std::string list;
  for (const MemoryPart& p : parts) list += (list.empty() ? "" : ", ") + p.kind + " " + bytes_text(p.bytes);
  throw Error("the run needs about " + bytes_text(total) + " per rank (" + list + "), more than the " +
              bytes_text(limit) + " one rank may use (" + how + "); the largest part, " + big.kind + " of " +
              bytes_text(big.bytes) + ", grows with " + big.keys + ": " + fix +
              " (perf.memory_per_rank_gib sets the limit)");
}

std::uint64_t checkpoint_bytes(const ModelConfig& m) {
  // Three float32 tensors per parameter: the model and both AdamW moments.
  return static_cast<std::uint64_t>(3 * kFloat) * static_cast<std::uint64_t>(model_counts(m).total);
}

}  // namespace ndmini
