// SPDX-License-Identifier: BSD-3-Clause
#include "train/preflight.hpp"

#include "comm/mpi/mpi_calls.hpp"
#include "run/budget.hpp"

namespace ndmini {

RunInputs open_run_inputs(const Config& cfg, const RunLayout& layout, int ranks_per_node, bool resume, MPI_Comm comm) {
  RunInputs in;
  agree_on_errors(comm, [&] { in.prediction = predict_run(cfg, layout, ranks_per_node); });
  in.saves = cfg.checkpoint.every > 0 || cfg.checkpoint.at_start;
  // One writer per folder, proven usable now, not at the first save.
  if (in.saves || resume)
    in.dir_lock = std::make_unique<io::CheckpointDirLock>(comm, cfg.checkpoint.dir,
                                                          in.saves ? io::DirAccess::write : io::DirAccess::read,
                                                          in.saves ? checkpoint_bytes(cfg.model) : 0);
  // Reading the data is rank-local: agree on the outcome, so one rank's
  // missing file stops every rank with its message instead of a hang.
  agree_on_errors(comm, [&] { in.sources = make_data_sources(cfg); });
  return in;
}

std::string describe_run_inputs(const Config& cfg, const RunInputs& in) {
  std::string text = "inputs OK: data " + in.sources.train->describe();
  if (in.sources.validation) text += ", validation " + in.sources.validation->describe();
  if (in.saves)
    text += "; checkpoint.dir = '" + cfg.checkpoint.dir + "' writable with room for one save (" +
            bytes_text(static_cast<double>(checkpoint_bytes(cfg.model))) + ")";
  else
    text += "; no checkpoint saved (checkpoint.every = 0)";
  if (in.prediction) text += "; perf.cluster = '" + cfg.perf.cluster + "' read";
  return text;
}

}  // namespace ndmini
