// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ndmini's command line, parsed with CLI11. It defines the subcommands and
// their options, and says a command-line mistake in one line.
#include <optional>
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "train/trainer.hpp"

namespace ndmini::driver {

enum class Subcommand { kTrain, kCheck, kConfig, kKeys, kCkptInfo, kCkptVerify, kPlan, kPlanCalibrate };

// What the command line asks for. Each subcommand reads its own fields.
struct Options {
  Subcommand subcommand = Subcommand::kTrain;
  std::string deck;                    // train, check, config
  std::vector<std::string> overrides;  // train, check, config: --set
  TrainOptions train;
  int check_world = 1;  // check --world; default: the ranks launched
  std::string ckpt_path;
  PlanRequest plan;
  std::vector<std::string> plan_fit;  // plan --fit METRICS.jsonl ...
  std::string plan_out;               // plan --out FILE
  bool plan_strict = false;           // plan --calibrate --strict: a failed sanity check fails the run
};

// Parses argv (its --kokkos-* arguments are Kokkos' and skipped) into
// `options`. Returns an exit status where the parse ends the run: after
// --help, --version and --build-info (printed on rank 0), or a mistake
// (one line on rank 0's stderr).
std::optional<int> parse_command_line(int argc, char** argv, int rank, int world, Options& options);

}  // namespace ndmini::driver
