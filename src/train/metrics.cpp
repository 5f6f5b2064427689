// SPDX-License-Identifier: BSD-3-Clause
#include "train/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.hpp"
#include "core/regular_file.hpp"

namespace ndmini {

namespace {

// "42.1 s", "12m05s", "3h07m": short, and it grows with the run.
std::string duration(double seconds) {
  char buf[32];
  const long long s = static_cast<long long>(seconds + 0.5);
  if (seconds < 100)
    std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return buf;
}

}  // namespace

std::string progress_line(const StepRecord& r) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %6lld/%lld | loss %.6f | lr %.3e | grad norm %.4f | %9.1f ms | %9.0f tok/s | MFU %5.1f%% | "
                "comm %.1f ms | mem %.1f MiB | elapsed %s | ETA %s",
                static_cast<long long>(r.step), static_cast<long long>(r.steps), r.window_loss, r.lr, r.grad_norm,
                r.step_ms, r.tokens_per_s, 100 * r.mfu, r.exposed_comm_ms, r.mem_bytes / 1048576.0,
                duration(r.elapsed_s).c_str(), duration(r.eta_s).c_str());
  std::string line = buf;
  // On every line of an MoE run, after the fields every run has.
  if (r.moe) {
    std::snprintf(buf, sizeof buf, " | moe tokens/expert min %lld mean %.1f max %lld imbalance %.2f",
                  static_cast<long long>(r.moe->min), r.moe->mean, static_cast<long long>(r.moe->max),
                  r.moe->imbalance);
    line += buf;
    if (r.moe->aux_loss) {
      std::snprintf(buf, sizeof buf, " aux %.6f", *r.moe->aux_loss);
      line += buf;
    }
    if (r.moe->bias_min) {
      std::snprintf(buf, sizeof buf, " bias %.4g..%.4g", *r.moe->bias_min, *r.moe->bias_max);
      line += buf;
    }
    // The expert group's all-to-alls (ep > 1): rank 0's bytes, the slowest rank's exposed time.
    for (const auto& [name, s] : r.comm)
      if (name == "ep" && s.calls > 0) {
        std::snprintf(buf, sizeof buf, " a2a %.2f MiB exposed %.1f ms", s.bytes / 1048576.0, s.exposed_ms);
        line += buf;
      }
  }
  // Last, so the fields before it keep their places on every line.
  if (r.val_loss) {
    std::snprintf(buf, sizeof buf, " | val_loss %.6f", *r.val_loss);
    line += buf;
  }
  return line;
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  require(fd_ >= 0, "--metrics " + path + ": cannot open the file for writing (" + std::strerror(errno) + ")");
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

// One write per record, unbuffered: a record is in the file (or its error
// known) when the call returns, also if the run dies right after.
void MetricsWriter::write_line(const std::string& line) {
  if (fd_ < 0 || !error_.empty()) return;
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = "--metrics " + path_ + ": writing the metrics failed (" +
               std::string(n < 0 ? std::strerror(errno) : "nothing written") +
               "); free space there or point --metrics at another file";
      return;
    }
    done += static_cast<std::size_t>(n);
  }
}

void MetricsWriter::step(const StepRecord& r) {
  if (fd_ < 0) return;
  // Times are the slowest rank's; calls and bytes are rank 0's.
  nlohmann::json comm = nlohmann::json::object();
  for (const auto& [name, s] : r.comm)
    comm[name] = {{"calls", s.calls},
                  {"bytes", s.bytes},
                  {"ms", s.ms},
                  {"exposed_ms", s.exposed_ms},
                  {"exposed_min_ms", s.exposed_min_ms}};
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"step_ms", r.step_ms},
                      {"tokens_per_s", r.tokens_per_s},
                      {"mfu", r.mfu},
                      {"comm", comm},
                      {"bubble_ms", r.bubble_ms},
                      {"bubble_ms_per_stage", r.bubble_ms_per_stage},
                      {"io_ms", r.io_ms},
                      {"mem_bytes", r.mem_bytes},
                      {"time", r.unix_time},
                      {"elapsed_s", r.elapsed_s},
                      {"tokens", r.tokens}};
  if (r.moe)
    j["moe"] = {{"tokens_per_expert_min", r.moe->min},
                {"tokens_per_expert_mean", r.moe->mean},
                {"tokens_per_expert_max", r.moe->max},
                {"imbalance", r.moe->imbalance}};
  if (r.moe && r.moe->aux_loss) j["moe"]["aux_loss"] = *r.moe->aux_loss;
  if (r.moe && r.moe->bias_min) {
    j["moe"]["selection_bias_min"] = *r.moe->bias_min;
    j["moe"]["selection_bias_max"] = *r.moe->bias_max;
  }
  if (r.val_loss) {
    j["val_loss"] = *r.val_loss;
    j["eval_ms"] = r.eval_ms;
  }
  write_line(j.dump() + "\n");
}

void MetricsWriter::header(const std::string& json_object) { write_line(json_object + "\n"); }

void MetricsWriter::summary(const std::string& json_object) { write_line(json_object + "\n"); }

std::int64_t peak_rss_bytes() {
  std::string status;
  try {
    status = read_small_file("/proc/self/status", kProcFileMaxBytes, {"'/proc/self/status'", "memory is not reported"});
  } catch (const Error&) {
    return 0;
  }
  const auto at = status.find("VmHWM:");
  long long kb = 0;
  if (at == std::string::npos || std::sscanf(status.c_str() + at, "VmHWM: %lld kB", &kb) != 1) return 0;
  return kb * 1024;
}

}  // namespace ndmini
