// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a run opens before its first step, besides the mesh and the model: the
// cluster file of its prediction (perf.cluster), the checkpoint folder (held
// by this job, writable, room for one save of the model), and the data files
// (header, size against model.seq_len, tokens inside the vocabulary).
// `Trainer::setup` and `ndmini check` call the same open_run_inputs, so the
// pre-flight fails where, and with the message, the run would.
#include <mpi.h>

#include <memory>
#include <optional>
#include <string>

#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "run/layout.hpp"
#include "train/data.hpp"
#include "train/prediction.hpp"

namespace ndmini {

struct RunInputs {
  std::optional<RunPrediction> prediction;          // nothing without perf.cluster
  std::unique_ptr<io::CheckpointDirLock> dir_lock;  // null when the run neither saves nor resumes
  DataSources sources;
  bool saves = false;  // checkpoint.every > 0 or checkpoint.at_start
};

// Collective over comm: every rank throws the first rank's Error. `resume`:
// the run reads checkpoint.dir (--resume). Creates checkpoint.dir when the
// run saves, as the first save would.
RunInputs open_run_inputs(const Config& cfg, const RunLayout& layout, int ranks_per_node, bool resume, MPI_Comm comm);

// check's line for what was opened: "inputs OK: data ..., checkpoint.dir ..., perf.cluster ...".
std::string describe_run_inputs(const Config& cfg, const RunInputs& inputs);

}  // namespace ndmini
