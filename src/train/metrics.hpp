// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a run reports (docs/output.md): the progress line on stdout and its
// machine-readable twin, one JSON object per logged step in --metrics FILE.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "train/result.hpp"

namespace ndmini {

struct StepRecord {
  std::int64_t step = 0;
  std::int64_t steps = 0;  // train.steps: the line reads "step N/M"
  // The mean loss of the steps since the last logged one, this one included
  // (the line shows it; the record keeps the step's own `loss`).
  double window_loss = 0;
  double elapsed_s = 0;     // wall time since this run's first step began
  double eta_s = 0;         // elapsed per step so far, times the steps left
  double unix_time = 0;     // wall-clock time at the end of the step (seconds since the epoch)
  std::int64_t tokens = 0;  // tokens consumed, steps 0..step (a resumed run counts the earlier ones too)
  double loss = 0, lr = 0, grad_norm = 0, step_ms = 0, tokens_per_s = 0, mfu = 0;
  double exposed_comm_ms = 0;
  // The pipeline bubble: per stage, the time it waited for its neighbours
  // (a part of pp's exposed time), and the most of any stage.
  std::vector<double> bubble_ms_per_stage;
  double bubble_ms = 0;
  double io_ms = 0;  // checkpoint I/O within this step (not in step_ms)
  // The validation loss, on the steps it is computed (train.eval_every), and
  // the milliseconds it took on rank 0 (before the step, not in step_ms).
  std::optional<double> val_loss;
  double eval_ms = 0;
  std::int64_t mem_bytes = 0;
  std::vector<std::pair<std::string, CommStats>> comm;  // per communicator (axis or reduction group)
  std::optional<MoeLoad> moe;                           // an MoE model's expert load
};

std::string progress_line(const StepRecord& r);

// Writes on the rank that opened it; a failed write (a full disk, /dev/full)
// is kept as error() rather than thrown, because only that rank knows: the
// caller agrees on it over the job (core/error.hpp `agree`) so that every
// rank stops together.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);  // empty path: writes nothing
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // The first record, `"record": "header"`: what ran, where and when.
  void header(const std::string& json_object);
  void step(const StepRecord& r);
  // The final summary object: key figures of the whole run, as JSON text.
  void summary(const std::string& json_object);
  // The first write error ("" while every record reached the file).
  const std::string& error() const { return error_; }

 private:
  void write_line(const std::string& line);
  std::string path_;
  int fd_ = -1;
  std::string error_;
};

// Peak resident set size of this process in bytes (VmHWM).
std::int64_t peak_rss_bytes();

}  // namespace ndmini
