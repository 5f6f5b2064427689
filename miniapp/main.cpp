// SPDX-License-Identifier: BSD-3-Clause
// The ndmini executable: initialise MPI and Kokkos, parse the command line,
// run the subcommand, finalise. Everything else lives in the library.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi/mpi_calls.hpp"
#include "config/config.hpp"
#include "core/error.hpp"
#include "core/signals.hpp"
#include "io/inspect.hpp"
#include "mesh/mesh.hpp"
#include "model/gpt.hpp"
#include "ndmini_git_sha.hpp"
#include "plan/calibrate.hpp"
#include "plan/fit.hpp"
#include "plan/plan.hpp"
#include "run/budget.hpp"
#include "run/layout.hpp"
#include "train/report.hpp"
#include "train/trainer.hpp"

namespace {

// JSON string literal of s (quotes and backslashes escaped, tabs as spaces, other control characters dropped).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\t') c = ' ';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

// `ndmini --build-info`: what the binary is, as one JSON object, for the
// provenance of a scaling study (bench/scaling) or a bug report.
std::string build_info() {
  char mpi_library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0, major = 0, minor = 0;
  MPI_Get_library_version(mpi_library, &len);
  MPI_Get_version(&major, &minor);
  std::string mpi(mpi_library, static_cast<std::size_t>(len));
  mpi = mpi.substr(0, mpi.find('\n'));  // MPICH's first line names it; the rest is its configure line
  const std::string nccl = ndmini::nccl_version();
  std::string out = "{";
  out += "\"name\": \"ndmini\", \"version\": " + json_string(NDMINI_VERSION);
  out += ", \"git_sha\": " + json_string(NDMINI_GIT_SHA);
  out += ", \"build_type\": " + json_string(NDMINI_BUILD_TYPE);
  out += ", \"compiler\": " + json_string(NDMINI_COMPILER);
  out += ", \"native\": " + std::string(NDMINI_NATIVE ? "true" : "false");  // -march=native
  out += ", \"kokkos_version\": " +
         json_string(std::to_string(KOKKOS_VERSION / 10000) + "." + std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
                     std::to_string(KOKKOS_VERSION % 100));
  out += ", \"kokkos_backend\": " + json_string(ndmini::ExecSpace::name());
  out += ", \"mpi_library\": " + json_string(mpi);
  out += ", \"mpi_standard\": " + json_string(std::to_string(major) + "." + std::to_string(minor));
  out += ", \"nccl\": " + (nccl.empty() ? std::string("null") : json_string(nccl));
  return out + "}";
}

// The largest world `check --world` describes: 2^20 ranks, more than any
// machine has today.
constexpr int kMaxWorld = 1 << 20;

// The whole number `text` spells (an optional sign and digits, nothing
// around them), or nothing.
std::optional<long long> whole_number(const std::string& text) {
  long long n = 0;
  std::size_t end = 0;
  try {
    n = std::stoll(text, &end);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (end != text.size() || std::isspace(static_cast<unsigned char>(text.front()))) return std::nullopt;
  return n;
}

// A CLI11 check that the value is a whole number from lo to hi, so a wrong
// one is a command-line error; `rule` says so as people write it (CLI11's own
// range prints a 309-digit double as its bound).
CLI::Validator whole_number_in(long long lo, long long hi, const std::string& rule) {
  return CLI::Validator(
      [lo, hi, rule](const std::string& text) {
        const auto n = whole_number(text);
        return n && *n >= lo && *n <= hi ? std::string() : "'" + text + "' " + rule;
      },
      "");
}

// The subcommand the parse reached last (the app itself when none).
CLI::App* innermost(CLI::App* app) {
  for (auto subs = app->get_subcommands(); !subs.empty(); subs = app->get_subcommands()) app = subs.front();
  return app;
}

// One line for a command-line error, in the form of every other error. CLI11
// says only "A subcommand is required" for a word it does not know: name the
// word and the choices instead.
std::string cli_error_text(CLI::App& app, const CLI::ParseError& e) {
  CLI::App* at = innermost(&app);
  std::string command;  // "ndmini ckpt info": the names from the root down
  for (const CLI::App* a = at; a != nullptr; a = a->get_parent())
    command = a->get_name() + (command.empty() ? "" : " ") + command;
  const auto subs = at->get_subcommands([](CLI::App*) { return true; });
  if (at->get_require_subcommand_min() > 0 && at->get_subcommands().empty() && !subs.empty()) {
    std::string names;
    for (std::size_t i = 0; i < subs.size(); ++i)
      names += (i == 0 ? "" : i + 1 == subs.size() ? " or " : ", ") + subs[i]->get_name();
    std::string word, options;
    for (const std::string& r : at->remaining()) {
      if (r.rfind('-', 0) == 0)
        options += " " + r;
      else if (word.empty())
        word = r;
    }
    const std::string hint = "; '" + command + " --help' describes them";
    if (!word.empty()) return "unknown subcommand '" + word + "' for " + command + ": expected " + names + hint;
    return command + " needs a subcommand: " + names + hint +
           (options.empty() ? "" : " (and does not know the option(s)" + options + ")");
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    // CLI11 lists the extra arguments in reverse order; say them as typed.
    std::string extras;
    for (const std::string& r : app.remaining(true)) extras += " " + r;
    return command + " does not take:" + extras + "; '" + command + " --help' lists the options";
  }
  return std::string(e.what()) + "; '" + command + " --help' lists the options";
}

}  // namespace

int main(int argc, char** argv) {
  // From the first moment: a signal during start-up is handled at the first
  // step boundary, not left to kill a rank (which mpiexec may report as 0).
  std::optional<ndmini::StopSignals> stop_signals(std::in_place);
  // MPI_THREAD_MULTIPLE lets the comm layer's progress thread (comm/progress.hpp)
  // call MPI beside the model; with less the thread is simply not started.
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // Kokkos sees only its own --kokkos-* arguments: given --help it would
  // print its option list before ndmini's. --kokkos-help prints that list
  // (on rank 0 only) and ends the run.
  bool kokkos_help = false;
  std::vector<char*> kokkos_args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--kokkos-help") {
      kokkos_help = true;
      if (rank != 0) continue;
    }
    if (a.rfind("--kokkos-", 0) == 0) kokkos_args.push_back(argv[i]);
  }
  int kokkos_argc = static_cast<int>(kokkos_args.size());
  kokkos_args.push_back(nullptr);
  Kokkos::initialize(kokkos_argc, kokkos_args.data());
  if (kokkos_help) {
    Kokkos::finalize();
    MPI_Finalize();
    return 0;
  }

  CLI::App app{"ndmini: a reference GPT-2 training mini-app for N-dimensional parallelism (MPI + Kokkos + HDF5)",
               "ndmini"};
  app.set_version_flag("--version", std::string("ndmini ") + NDMINI_VERSION + " (" + NDMINI_GIT_SHA + ")");
  app.add_flag_callback(
      "--build-info",
      [rank] {
        if (rank == 0) std::printf("%s\n", build_info().c_str());
        throw CLI::Success();
      },
      "Print the version, git commit, compiler, Kokkos, MPI and NCCL of this build as one JSON object");
  app.require_subcommand(1);

  std::string deck, metrics;
  std::vector<std::string> overrides;
  std::string resume_step;  // empty: the step named by 'latest'
  bool show_mesh = false;
  int check_world = world;
  std::string ckpt_path;

  auto* train = app.add_subcommand("train", "Train the model a deck describes");
  train->add_option("deck", deck, "Input deck (TOML), e.g. inputs/tiny.toml")->required();
  // One value per --set, so a deck named after it is not taken as a value.
  train->add_option("--set", overrides, "Override a deck key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  train->add_option("--metrics", metrics, "Write one JSON object per logged step, then a summary, to FILE")
      ->option_text("FILE");
  auto* resume =
      train
          ->add_option(
              "--resume", resume_step,
              "Resume from checkpoint.dir: the step named by 'latest', or STEP if given (put it after the deck)")
          ->option_text("[STEP]");
  resume->expected(0, 1);
  resume->check(whole_number_in(0, std::numeric_limits<int>::max(),
                                "must be a step number >= 0 (or nothing, for 'latest'; put --resume after the deck)"));
  train->add_flag("--show-mesh", show_mesh, "Print every rank's mesh coordinates and the groups of each axis");

  auto* check = app.add_subcommand("check", "Validate a deck and print what a run would use; runs nothing");
  check->add_option("deck", deck, "Input deck (TOML)")->required();
  check->add_option("--set", overrides, "Override a deck key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  check->add_option("--world", check_world, "Validate the layout for N ranks without launching them")
      ->option_text("N (default: the ranks launched)")
      ->check(whole_number_in(1, kMaxWorld, "must be a whole number between 1 and " + std::to_string(kMaxWorld)));

  auto* ckpt = app.add_subcommand("ckpt", "Inspect a checkpoint (one process; no job needed)");
  ckpt->require_subcommand(1);
  auto* ckpt_info = ckpt->add_subcommand(
      "info", "Print a checkpoint's step, tokens, the layout that wrote it, data provenance, tensors and deck");
  ckpt_info->add_option("path", ckpt_path, "A step folder, its checkpoint.h5, or a checkpoint.dir (its 'latest')")
      ->required();
  auto* ckpt_verify = ckpt->add_subcommand(
      "verify", "Check every digest of a checkpoint (manifest, metadata, every tensor); exit 1 on any mismatch");
  ckpt_verify->add_option("path", ckpt_path, "A step folder, its checkpoint.h5, or a checkpoint.dir (its 'latest')")
      ->required();

  ndmini::PlanRequest plan_request;
  int plan_top = 10;
  auto* plan = app.add_subcommand(
      "plan",
      "Predict memory per device, traffic and step time of the deck's layout on a cluster, or rank every layout of "
      "--world devices (the deck's five parallel degrees 0, or --search); docs/planner.md. One process, no job needed");
  plan->add_option("deck", plan_request.deck, "Input deck (TOML), e.g. inputs/gpt2-124m.toml");
  plan->add_option("--cluster", plan_request.cluster, "Cluster file (TOML), e.g. inputs/clusters/dgx-a100-80gb.toml")
      ->option_text("FILE");
  plan->add_option("--world", plan_request.world, "Number of devices the layout runs on")
      ->option_text("N")
      ->check(whole_number_in(1, kMaxWorld, "must be a whole number between 1 and " + std::to_string(kMaxWorld)));
  plan->add_option("--top", plan_top, "With a search: how many of the fastest layouts to print (default 10)")
      ->option_text("K")
      ->check(whole_number_in(1, 1000000, "must be a whole number between 1 and 1000000"));
  plan->add_flag("--json", plan_request.json, "Print one JSON document (keys in docs/planner.md) instead of the table");
  plan->add_flag("--search", plan_request.search, "Rank every valid layout, whatever degrees the deck gives");
  plan->add_option("--set", plan_request.overrides, "Override a deck key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  plan->add_option("--precision", plan_request.precision,
                   "fp32 or bf16: the matrix products' precision to plan for (default: the deck's train.precision); "
                   "bf16 takes the bf16 peak and halves activation and parameter-gather bytes")
      ->option_text("P")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  plan->add_flag("--stored-attention-scores", plan_request.code.stored_attention_scores,
                 "Time a code whose attention stores the s x s scores, softmax and dropout (Megatron-LM before "
                 "flash attention), not ndmini's; the memory stays ndmini's");
  plan->add_flag("--pp-scatter-gather", plan_request.code.pp_scatter_gather,
                 "Time a code whose tp ranks each send 1/tp of a pipeline transfer, all-gathered over tp on arrival "
                 "(Megatron-LM's scatter/gather), not ndmini's");
  bool plan_calibrate = false;
  std::string plan_out;
  plan->add_flag("--calibrate", plan_calibrate,
                 "Measure this machine (GEMM rates by shape class and precision, memory bandwidth, collectives over "
                 "the launched ranks: at least 2) and print its cluster file");
  std::vector<std::string> plan_fit;
  plan->add_option("--fit", plan_fit,
                   "Fit efficiency.compute and efficiency.network of --cluster to the metrics files of runs trained "
                   "with perf.cluster set to it, and print them (with --out, write the refitted cluster file)")
      ->option_text("METRICS.jsonl ...");
  plan->add_option("--out", plan_out, "With --calibrate or --fit: write the cluster file to FILE")->option_text("FILE");

  // Set last, so the subcommands' help does not repeat it.
  app.footer(
      "--kokkos-* options (the thread count, the device, tools) are passed to Kokkos; --kokkos-help lists them.\n"
      "'ndmini SUBCOMMAND --help' shows a subcommand's options; docs/deck.md lists the deck's keys.");

  // Kokkos has read its --kokkos-* arguments.
  std::vector<const char*> args;
  for (int i = 0; i < argc; ++i)
    if (i == 0 || std::string(argv[i]).rfind("--kokkos-", 0) != 0) args.push_back(argv[i]);
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    // --help, --version and --build-info end the parse with exit code 0.
    const bool success = e.get_exit_code() == 0;
    if (rank == 0 && success) app.exit(e);
    if (rank == 0 && !success) std::fprintf(stderr, "ndmini: error: %s\n", cli_error_text(app, e).c_str());
    const int code = success ? 0 : 2;
    Kokkos::finalize();
    MPI_Finalize();
    return code;
  }

  if (*plan && plan_calibrate) {
    // Every rank measures; rank 0 writes the file (whole, or not at all).
    int status = 0;
    try {
      if (!plan_fit.empty()) throw ndmini::Error("ndmini plan: --calibrate and --fit are two different tasks; run one");
      const std::string text = ndmini::calibrate_cluster(MPI_COMM_WORLD);
      if (rank == 0 && plan_out.empty()) std::printf("%s", text.c_str());
      if (rank == 0 && !plan_out.empty()) ndmini::write_cluster_file(plan_out, text);
    } catch (const ndmini::Error& e) {
      if (rank == 0) std::fprintf(stderr, "ndmini: error: %s\n", e.what());
      status = 2;
    }
    MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    Kokkos::finalize();
    MPI_Finalize();
    return status;
  }
  if (*plan) {
    // One process does the work (no MPI needed); the others only learn the
    // outcome. Every problem is bad input: exit 2, as for a command-line error.
    int status = 0;
    if (rank == 0) {
      try {
        plan_request.top = static_cast<std::size_t>(plan_top);
        std::string missing;
        if (plan_request.deck.empty() && plan_fit.empty())
          missing = "a deck (ndmini plan DECK.toml ...)";
        else if (plan_request.cluster.empty())
          missing = "--cluster FILE (e.g. inputs/clusters/dgx-a100-80gb.toml)";
        else if (plan_request.world == 0 && plan_fit.empty())
          missing = "--world N (the number of devices)";
        if (!missing.empty())
          throw ndmini::Error("ndmini plan needs " + missing + "; 'ndmini plan --help' lists the options");
        if (!plan_request.deck.empty() && !plan_fit.empty())
          throw ndmini::Error("ndmini plan --fit takes metrics files, not a deck ('" + plan_request.deck + "')");
        if (!plan_out.empty() && plan_fit.empty())
          throw ndmini::Error("ndmini plan: --out writes a cluster file, with --calibrate or --fit only");
        if (!plan_fit.empty() && (plan_request.code.stored_attention_scores || plan_request.code.pp_scatter_gather))
          throw ndmini::Error(
              "ndmini plan: --stored-attention-scores and --pp-scatter-gather time another code's run; --fit fits "
              "ndmini's own runs");
        if (!plan_fit.empty())
          std::printf("%s", ndmini::run_fit({plan_fit, plan_request.cluster, plan_out}).c_str());
        else
          std::printf("%s", ndmini::run_plan(plan_request).c_str());
      } catch (const ndmini::Error& e) {
        std::fprintf(stderr, "ndmini: error: %s\n", e.what());
        status = 2;
      }
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
    Kokkos::finalize();
    MPI_Finalize();
    return status;
  }

  // `check` and `ckpt` have no step boundary to stop at: a signal ends them
  // at once, as by default.
  if (!*train) {
    stop_signals.reset();
    if (const int sig = ndmini::stop_signal_received(); sig != 0) std::raise(sig);
  }

  int status = 0;
  bool signalled = false;  // status is the one a stop signal gives (core/signals.hpp)
  if (*ckpt) {
    // One process does the work; the others only learn the outcome.
    if (rank == 0) {
      try {
        const std::string dir = ndmini::io::resolve_checkpoint(ckpt_path);
        if (*ckpt_info) {
          std::printf("%s", ndmini::io::describe_checkpoint(dir).c_str());
        } else {
          const auto report = ndmini::io::verify_checkpoint(dir);
          for (const auto& p : report.problems)
            std::fprintf(stderr, "ndmini: verify: %s: %s\n", dir.c_str(), p.c_str());
          if (report.problems.empty())
            std::printf("%s: OK (manifest, metadata and %llu tensor digests over %llu bytes)\n", dir.c_str(),
                        static_cast<unsigned long long>(report.tensors), static_cast<unsigned long long>(report.bytes));
          status = report.problems.empty() ? 0 : 1;
        }
      } catch (const ndmini::Error& e) {
        std::fprintf(stderr, "ndmini: error: %s\n", e.what());
        status = 1;
      }
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
    Kokkos::finalize();
    MPI_Finalize();
    return status;
  }
  try {
    // Every rank reads the deck; a rank that cannot makes all of them stop.
    ndmini::Config cfg;
    ndmini::agree_on_errors(MPI_COMM_WORLD, [&] { cfg = ndmini::load_config(deck, overrides); });
    if (*check) {
      // Resolve first: a bad layout is one error, not a report that ends in one.
      const ndmini::RunLayout layout = ndmini::resolve_layout(cfg, check_world);
      // Sizes before anything else: check never allocates what the deck describes.
      MPI_Comm node = MPI_COMM_NULL;
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
      int ranks_on_node = 1;
      MPI_Comm_size(node, &ranks_on_node);
      // For a world other than this launch (--world N): as many of its ranks on
      // this node as it has cores, the usual one rank per core.
      if (check_world != world)
        ranks_on_node = std::max(1, std::min(check_world, static_cast<int>(std::thread::hardware_concurrency())));
      MPI_Comm_free(&node);
      ndmini::agree_on_errors(MPI_COMM_WORLD, [&] { ndmini::require_memory_fits(cfg, layout, ranks_on_node); });
      if (rank == 0) {
        ndmini::print_check(cfg, layout, ranks_on_node);
        std::printf("%s", ndmini::describe_mesh(layout.dims, true).c_str());
      }
    } else {
      ndmini::TrainOptions opts;
      opts.metrics_path = metrics;
      opts.show_mesh = show_mesh;
      opts.resume = resume->count() > 0;
      if (opts.resume && !resume_step.empty()) opts.resume_step = *whole_number(resume_step);  // checked by CLI11
      status = ndmini::train(cfg, opts, MPI_COMM_WORLD).exit_status;  // non-zero: a stop signal
      signalled = status != 0;
    }
  } catch (const ndmini::Error& e) {
    // Errors from the deck and the collective phases are raised on every
    // rank alike; rank 0 speaks for all, every rank exits non-zero.
    if (rank == 0) std::fprintf(stderr, "ndmini: error: %s\n", e.what());
    status = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ndmini: internal error on rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  Kokkos::finalize();
  // A signal after the run's last agreement still counts, on this rank.
  const bool late = status == 0 && ndmini::stop_signal_received() != 0;
  if (late) status = ndmini::signal_exit_status(ndmini::stop_signal_received());
  // MPICH's mpiexec drops the ranks' exit statuses once it has forwarded a
  // signal to them, but keeps MPI_Abort's: hand the status over that way
  // (once per job; everything is saved and closed by now). It exits at the
  // abort, dropping output still in transit: give it a moment to pass on
  // the stop line first.
  if ((signalled && rank == 0) || late) {
    std::fflush(nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  MPI_Finalize();
  return status;
}
