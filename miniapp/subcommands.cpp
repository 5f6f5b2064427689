// SPDX-License-Identifier: BSD-3-Clause
#include "subcommands.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "build_info.hpp"
#include "comm/mpi/mpi_calls.hpp"
#include "config/config.hpp"
#include "config/deck_reference.hpp"
#include "config/effective.hpp"
#include "exit_status.hpp"
#include "io/inspect.hpp"
#include "mesh/mesh.hpp"
#include "model/gpt.hpp"
#include "model/moe.hpp"
#include "plan/calibrate.hpp"
#include "plan/fit.hpp"
#include "run/budget.hpp"
#include "run/layout.hpp"
#include "train/preflight.hpp"
#include "train/report.hpp"

namespace ndmini::driver {
namespace {

// Every rank reads the deck; a rank that cannot makes all of them stop.
Config load_deck(const Options& o) {
  Config cfg;
  agree_on_errors(MPI_COMM_WORLD, [&] { cfg = load_config(o.deck, o.overrides); });
  return cfg;
}

// The ranks of this node the memory check divides the node's memory among.
int ranks_on_node(const Runtime& runtime, int check_world) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, runtime.rank(), MPI_INFO_NULL, &node);
  int ranks = 1;
  MPI_Comm_size(node, &ranks);
  // For a world other than this launch (--world N): as many of its ranks on
  // this node as it has cores, the usual one rank per core.
  if (check_world != runtime.world())
    ranks = std::max(1, std::min(check_world, static_cast<int>(std::thread::hardware_concurrency())));
  MPI_Comm_free(&node);
  return ranks;
}

// The combinations of plan's options that ask for nothing it does.
void require_plan_arguments(const Options& o) {
  const PlanRequest& r = o.plan;
  std::string missing;
  if (r.deck.empty() && o.plan_fit.empty())
    missing = "a deck (ndmini plan DECK.toml ...)";
  else if (r.cluster.empty())
    missing = "--cluster FILE (e.g. inputs/clusters/dgx-a100-80gb.toml)";
  else if (r.world == 0 && o.plan_fit.empty())
    missing = "--world N (the number of devices)";
  if (!missing.empty()) throw Error("ndmini plan needs " + missing + "; 'ndmini plan --help' lists the options");
  if (!r.deck.empty() && !o.plan_fit.empty())
    throw Error("ndmini plan --fit takes metrics files, not a deck ('" + r.deck + "')");
  if (!o.plan_out.empty() && o.plan_fit.empty())
    throw Error("ndmini plan: --out writes a cluster file, with --calibrate or --fit only");
  if (!o.plan_fit.empty() && (r.code.stored_attention_scores || r.code.pp_scatter_gather))
    throw Error(
        "ndmini plan: --stored-attention-scores and --pp-scatter-gather time another code's run; --fit fits "
        "ndmini's own runs");
}

}  // namespace

int run_train(Runtime& runtime, const Options& o) {
  bool signalled = false;  // the status is the one a stop signal gives (core/signals.hpp)
  const int status = collective_status_of(runtime.rank(), [&] {
    const Config cfg = load_deck(o);
    TrainOptions options = o.train;
    options.deck_path = o.deck;
    options.git_sha = git_sha();
    const int s = train(cfg, options, MPI_COMM_WORLD).exit_status;  // non-zero: a stop signal
    signalled = s != 0;
    return s;
  });
  runtime.finalize_kokkos();
  return hand_over_stop_status(runtime.rank(), status, signalled);
}

int run_check(const Runtime& runtime, const Options& o) {
  return collective_status_of(runtime.rank(), [&] {
    const Config cfg = load_deck(o);
    // Resolve first: a bad layout is one error, not a report that ends in one.
    const RunLayout layout = resolve_layout(cfg, o.check_world);
    // Sizes before anything else: check never allocates what the deck describes.
    const int node_ranks = ranks_on_node(runtime, o.check_world);
    agree_on_errors(MPI_COMM_WORLD, [&] { require_memory_fits(cfg, layout, node_ranks); });
    // What the first step opens, by train's own function: a check that passes
    // leaves no file error for the job to meet at its start.
    const RunInputs inputs = open_run_inputs(cfg, layout, node_ranks, false, MPI_COMM_WORLD);
    if (runtime.rank() == 0) {
      print_check(cfg, layout, node_ranks);
      std::printf("%s\n", describe_run_inputs(cfg, inputs).c_str());
      std::printf("%s", describe_mesh(layout.dims, true).c_str());
      if (const std::string filled = describe_filled_degree(cfg.parallel, layout.dims); !filled.empty())
        std::printf("layout: %s\n", filled.c_str());
    }
    return exit_status(Ending::kDone);
  });
}

int run_config(const Runtime& runtime, const Options& o) {
  return collective_status_of(runtime.rank(), [&] {
    const Config cfg = load_deck(o);
    // The degrees as train would fill them for this world (a bad product is train's error).
    const RunLayout layout = resolve_layout(cfg, o.check_world);
    Config resolved = cfg;
    resolved.parallel.pp = layout.dims.pp;
    resolved.parallel.dp_replicate = layout.dims.dp_replicate;
    resolved.parallel.dp_shard = layout.dims.dp_shard;
    resolved.parallel.cp = layout.dims.cp;
    resolved.parallel.tp = layout.dims.tp;
    if (runtime.rank() == 0) {
      std::printf("# ndmini config %s: every key, its value and where it came from (default, deck, --set);\n",
                  o.deck.c_str());
      std::printf("# the -1 degrees resolved for %d rank(s). A deck: ndmini train reads it back to these values.\n",
                  o.check_world);
      std::printf("%s", effective_toml_with_origins(cfg, resolved).c_str());
    }
    return exit_status(Ending::kDone);
  });
}

int run_keys(const Runtime& runtime) {
  return status_of(
      [&] {
        if (runtime.rank() == 0) std::printf("%s", deck_keys_text().c_str());
        return exit_status(Ending::kDone);
      },
      runtime.rank() == 0, Ending::kError);
}

int run_ckpt(const Runtime& runtime, const Options& o) {
  int status = exit_status(Ending::kDone);
  if (runtime.rank() == 0) {
    status = status_of(
        [&] {
          const std::string dir = io::resolve_checkpoint(o.ckpt_path);
          if (o.subcommand == Subcommand::kCkptInfo) {
            std::printf("%s", io::describe_checkpoint(dir).c_str());
            return exit_status(Ending::kDone);
          }
          const auto report = io::verify_checkpoint(dir);
          for (const auto& p : report.problems)
            std::fprintf(stderr, "ndmini: verify: %s: %s\n", dir.c_str(), p.c_str());
          if (report.problems.empty())
            std::printf("%s: OK (manifest, metadata and %llu tensor digests over %llu bytes)\n", dir.c_str(),
                        static_cast<unsigned long long>(report.tensors), static_cast<unsigned long long>(report.bytes));
          return exit_status(report.problems.empty() ? Ending::kDone : Ending::kError);
        },
        true, Ending::kError);
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

int run_plan(const Runtime& runtime, const Options& o) {
  // No MPI needed. Every problem is bad input: exit 2, as for a command-line error.
  int status = exit_status(Ending::kDone);
  if (runtime.rank() == 0) {
    status = status_of(
        [&] {
          require_plan_arguments(o);
          if (!o.plan_fit.empty())
            std::printf("%s", run_fit({o.plan_fit, o.plan.cluster, o.plan_out}).c_str());
          else
            std::printf("%s", ndmini::run_plan(o.plan).c_str());
          return exit_status(Ending::kDone);
        },
        true, Ending::kBadInput);
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

int run_plan_calibrate(const Runtime& runtime, const Options& o) {
  const bool writes = runtime.rank() == 0;  // the file is written whole, or not at all, by one rank
  int status = status_of(
      [&] {
        if (!o.plan_fit.empty()) throw Error("ndmini plan: --calibrate and --fit are two different tasks; run one");
        const CalibrationLimits limits = calibration_limits_from_environment();
        // A loaded machine under --strict: refuse before a minute of measuring (rank 0 reads, all stop).
        int loaded = 0;
        if (o.plan_strict && writes) {
          const std::string why = load_warning(limits, static_cast<int>(std::thread::hardware_concurrency()));
          if (!why.empty()) print_error("plan --calibrate --strict: " + why + "; nothing measured, nothing written");
          loaded = why.empty() ? 0 : 1;
        }
        MPI_Bcast(&loaded, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (loaded) return exit_status(Ending::kError);
        const Calibration c = calibrate_cluster(MPI_COMM_WORLD, limits, [](const std::string& line) {
          std::fprintf(stderr, "%s\n", line.c_str());
          std::fflush(stderr);
        });
        if (!writes) return exit_status(Ending::kDone);
        for (const std::string& w : c.warnings) std::fprintf(stderr, "ndmini: warning: %s\n", w.c_str());
        if (o.plan_strict && !c.warnings.empty()) {
          print_error("plan --calibrate --strict: " + std::to_string(c.warnings.size()) +
                      " sanity check(s) failed (the warnings above); nothing written");
          return exit_status(Ending::kError);
        }
        if (o.plan_out.empty()) std::printf("%s", c.text.c_str());
        if (!o.plan_out.empty()) {
          write_cluster_file(o.plan_out, c.text);
          std::printf("wrote %s\n", o.plan_out.c_str());
        }
        return exit_status(Ending::kDone);
      },
      writes, Ending::kBadInput);
  MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return status;
}

}  // namespace ndmini::driver
