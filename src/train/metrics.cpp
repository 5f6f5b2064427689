// SPDX-License-Identifier: BSD-3-Clause
#include "train/metrics.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.hpp"

namespace ndmini {

std::string progress_line(const StepRecord& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %6lld | loss %.6f | lr %.3e | grad norm %.4f | %9.1f ms | %9.0f tok/s | MFU %5.1f%% | "
                "comm %.1f ms | mem %.1f MiB",
                static_cast<long long>(r.step), r.loss, r.lr, r.grad_norm, r.step_ms, r.tokens_per_s, 100 * r.mfu,
                r.exposed_comm_ms, r.mem_bytes / 1048576.0);
  return buf;
}

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::trunc);
  require(out_.good(), "--metrics " + path + ": cannot open the file for writing");
}

void MetricsWriter::step(const StepRecord& r) {
  if (!out_.is_open()) return;
  // Times are the slowest rank's; calls and bytes are rank 0's.
  nlohmann::json comm = nlohmann::json::object();
  for (const auto& [name, s] : r.comm)
    comm[name] = {{"calls", s.calls}, {"bytes", s.bytes}, {"ms", s.ms}, {"exposed_ms", s.exposed_ms}};
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"step_ms", r.step_ms},
                      {"tokens_per_s", r.tokens_per_s},
                      {"mfu", r.mfu},
                      {"comm", comm},
                      {"bubble_ms", r.bubble_ms},
                      {"mem_bytes", r.mem_bytes}};
  out_ << j.dump() << '\n';
  out_.flush();
}

void MetricsWriter::summary(const std::string& json_object) {
  if (!out_.is_open()) return;
  out_ << json_object << '\n';
  out_.flush();
}

std::int64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

}  // namespace ndmini
