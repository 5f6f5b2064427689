// SPDX-License-Identifier: BSD-3-Clause
#include "command_line.hpp"

#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdio>
#include <limits>

#include "build_info.hpp"
#include "exit_status.hpp"

namespace ndmini::driver {
namespace {

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

// What CLI11 fills in besides Options: the raw values turned into Options
// after the parse, and the subcommands, to tell which one ran.
struct Parsed {
  CLI::App *check = nullptr, *config = nullptr, *keys = nullptr, *ckpt = nullptr, *ckpt_info = nullptr, *plan = nullptr;
  CLI::Option* resume = nullptr;
  std::string resume_step;  // empty: the step named by 'latest'
  int plan_top = 10;
  bool plan_calibrate = false;
};

void add_train(CLI::App& app, Options& o, Parsed& p) {
  auto* train = app.add_subcommand("train", "Train the model a deck describes");
  train->add_option("deck", o.deck, "Input deck (TOML), e.g. inputs/tiny.toml")->required();
  // One value per --set, so a deck named after it is not taken as a value.
  train->add_option("--set", o.overrides, "Override a deck key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  train->add_option("--metrics", o.train.metrics_path, "Write one JSON object per logged step, then a summary, to FILE")
      ->option_text("FILE");
  p.resume = train
                 ->add_option(
                     "--resume", p.resume_step,
                     "Resume from checkpoint.dir: the step named by 'latest', or STEP if given (put it after the deck)")
                 ->option_text("[STEP]");
  p.resume->expected(0, 1);
  p.resume->check(
      whole_number_in(0, std::numeric_limits<int>::max(),
                      "must be a step number >= 0 (or nothing, for 'latest'; put --resume after the deck)"));
  train->add_flag("--show-mesh", o.train.show_mesh, "Print every rank's mesh coordinates and the groups of each axis");
}

void add_check(CLI::App& app, Options& o, Parsed& p) {
  p.check = app.add_subcommand("check", "Validate a deck and print what a run would use; runs nothing");
  p.check->add_option("deck", o.deck, "Input deck (TOML)")->required();
  p.check->add_option("--set", o.overrides, "Override a deck key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  p.check->add_option("--world", o.check_world, "Validate the layout for N ranks without launching them")
      ->option_text("N (default: the ranks launched)")
      ->check(whole_number_in(1, kMaxWorld, "must be a whole number between 1 and " + std::to_string(kMaxWorld)));
}

void add_config(CLI::App& app, Options& o, Parsed& p) {
  p.config = app.add_subcommand(
      "config", "Print every deck key with its value and where it came from (default, deck, --set); runs nothing");
  p.config->add_option("deck", o.deck, "Input deck (TOML)")->required();
  p.config->add_option("--set", o.overrides, "Override a deck key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  p.config->add_option("--world", o.check_world, "Resolve the -1 degrees for N ranks (default: the ranks launched)")
      ->option_text("N")
      ->check(whole_number_in(1, kMaxWorld, "must be a whole number between 1 and " + std::to_string(kMaxWorld)));
  p.keys = app.add_subcommand("keys", "List every deck key: type, default and meaning (as docs/deck.md)");
}

void add_ckpt(CLI::App& app, Options& o, Parsed& p) {
  p.ckpt = app.add_subcommand("ckpt", "Inspect a checkpoint (one process; no job needed)");
  p.ckpt->require_subcommand(1);
  p.ckpt_info = p.ckpt->add_subcommand(
      "info", "Print a checkpoint's step, tokens, the layout that wrote it, data provenance, tensors and deck");
  p.ckpt_info->add_option("path", o.ckpt_path, "A step folder, its checkpoint.h5, or a checkpoint.dir (its 'latest')")
      ->required();
  auto* verify = p.ckpt->add_subcommand(
      "verify", "Check every digest of a checkpoint (manifest, metadata, every tensor); exit 1 on any mismatch");
  verify->add_option("path", o.ckpt_path, "A step folder, its checkpoint.h5, or a checkpoint.dir (its 'latest')")
      ->required();
}

void add_plan(CLI::App& app, Options& o, Parsed& p) {
  auto* plan = p.plan = app.add_subcommand(
      "plan",
      "Predict memory per device, traffic and step time of the deck's layout on a cluster, or rank every layout of "
      "--world devices (the deck's five parallel degrees 0, or --search); docs/planner.md. One process, no job needed");
  plan->add_option("deck", o.plan.deck, "Input deck (TOML), e.g. inputs/gpt2-124m.toml");
  plan->add_option("--cluster", o.plan.cluster, "Cluster file (TOML), e.g. inputs/clusters/dgx-a100-80gb.toml")
      ->option_text("FILE");
  plan->add_option("--world", o.plan.world, "Number of devices the layout runs on")
      ->option_text("N")
      ->check(whole_number_in(1, kMaxWorld, "must be a whole number between 1 and " + std::to_string(kMaxWorld)));
  plan->add_option("--top", p.plan_top, "With a search: how many of the fastest layouts to print (default 10)")
      ->option_text("K")
      ->check(whole_number_in(1, 1000000, "must be a whole number between 1 and 1000000"));
  plan->add_flag("--json", o.plan.json, "Print one JSON document (keys in docs/planner.md) instead of the table");
  plan->add_flag("--search", o.plan.search, "Rank every valid layout, whatever degrees the deck gives");
  plan->add_option("--set", o.plan.overrides, "Override a deck key: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  plan->add_option("--precision", o.plan.precision,
                   "fp32 or bf16: the matrix products' precision to plan for (default: the deck's train.precision); "
                   "bf16 takes the bf16 peak and halves activation and parameter-gather bytes")
      ->option_text("P")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  plan->add_flag("--stored-attention-scores", o.plan.code.stored_attention_scores,
                 "Time a code whose attention stores the s x s scores, softmax and dropout (Megatron-LM before "
                 "flash attention), not ndmini's; the memory stays ndmini's");
  plan->add_flag("--pp-scatter-gather", o.plan.code.pp_scatter_gather,
                 "Time a code whose tp ranks each send 1/tp of a pipeline transfer, all-gathered over tp on arrival "
                 "(Megatron-LM's scatter/gather), not ndmini's");
  plan->add_flag("--calibrate", p.plan_calibrate,
                 "Measure this machine (GEMM rates by shape class and precision, memory bandwidth, collectives over "
                 "the launched ranks: at least 2) and print its cluster file");
  plan->add_option("--fit", o.plan_fit,
                   "Fit efficiency.compute and efficiency.network of --cluster to the metrics files of runs trained "
                   "with perf.cluster set to it, and print them (with --out, write the refitted cluster file)")
      ->option_text("METRICS.jsonl ...");
  plan->add_option("--out", o.plan_out, "With --calibrate or --fit: write the cluster file to FILE")
      ->option_text("FILE");
  plan->add_flag("--strict", o.plan_strict,
                 "With --calibrate: a failed sanity check (a loaded machine, passes that disagree, an implausible "
                 "latency, bf16 below fp32) exits 1 and writes nothing, instead of a warning");
}

// The subcommand that ran and the options CLI11 could not fill in directly.
void complete(const Parsed& p, Options& o) {
  if (*p.plan)
    o.subcommand = p.plan_calibrate ? Subcommand::kPlanCalibrate : Subcommand::kPlan;
  else if (*p.ckpt)
    o.subcommand = *p.ckpt_info ? Subcommand::kCkptInfo : Subcommand::kCkptVerify;
  else if (*p.config)
    o.subcommand = Subcommand::kConfig;
  else if (*p.keys)
    o.subcommand = Subcommand::kKeys;
  else
    o.subcommand = *p.check ? Subcommand::kCheck : Subcommand::kTrain;
  o.plan.top = static_cast<std::size_t>(p.plan_top);
  o.train.resume = p.resume->count() > 0;
  if (o.train.resume && !p.resume_step.empty()) o.train.resume_step = *whole_number(p.resume_step);  // checked by CLI11
}

}  // namespace

std::optional<int> parse_command_line(int argc, char** argv, int rank, int world, Options& o) {
  CLI::App app{"ndmini: a reference GPT-2 training mini-app for N-dimensional parallelism (MPI + Kokkos + HDF5)",
               "ndmini"};
  app.set_version_flag("--version", version_text());
  app.add_flag_callback(
      "--build-info",
      [rank] {
        if (rank == 0) std::printf("%s\n", build_info().c_str());
        throw CLI::Success();
      },
      "Print the version, git commit, compiler, Kokkos, MPI and NCCL of this build as one JSON object");
  app.require_subcommand(1);
  o.check_world = world;
  Parsed parsed;
  add_train(app, o, parsed);
  add_check(app, o, parsed);
  add_config(app, o, parsed);
  add_ckpt(app, o, parsed);
  add_plan(app, o, parsed);
  // Set last, so the subcommands' help does not repeat it.
  app.footer(
      "--kokkos-* options (the thread count, the device, tools) are passed to Kokkos; --kokkos-help lists them.\n"
      "'ndmini SUBCOMMAND --help' shows a subcommand's options; docs/deck.md (or 'ndmini keys') lists the deck's "
      "keys.");

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
    if (rank == 0 && !success) print_error(cli_error_text(app, e));
    return exit_status(success ? Ending::kDone : Ending::kBadInput);
  }
  complete(parsed, o);
  return std::nullopt;
}

}  // namespace ndmini::driver
