// SPDX-License-Identifier: BSD-3-Clause
#include "train/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "comm/mpi/mpi_calls.hpp"
#include "core/signals.hpp"
#include "io/checkpoint.hpp"
#include "kernels/gemm_library.hpp"
#include "mesh/mesh.hpp"
#include "model/gpt.hpp"
#include "model/moe.hpp"
#include "run/budget.hpp"
#include "run/memory_estimate.hpp"
#include "train/metrics.hpp"

namespace ndmini {
namespace {

constexpr double kMiB = 1048576.0;

// The medians over the timed steps of one figure.
template <class F>
double median_of(const std::vector<StepStats>& steps, F&& f) {
  std::vector<double> v;
  for (const StepStats& s : steps) v.push_back(f(s));
  return median(v);
}

}  // namespace

std::optional<MoeLoad> reduce_moe_load(const ModelConfig& m, const TrainConfig& t, std::vector<std::int64_t>& routed,
                                       double z_loss_sum, double seq_aux_sum, double tokens, double sequences,
                                       MPI_Comm world) {
  if (!m.moe()) return std::nullopt;
  // Every rank routes distinct token rows (its residual rows), and each block
  // lives on one pipeline stage: the sum over the world is every token's.
  mpi_all_reduce(MPI_IN_PLACE, routed.data(), static_cast<int>(routed.size()), MPI_INT64_T, MPI_SUM, world,
                 "the tokens routed to each expert");
  MoeLoad load;
  std::int64_t total = 0, counted = 0;
  load.min = std::numeric_limits<std::int64_t>::max();
  const std::size_t E = m.moe_experts;
  for (int l = 0; l < m.layers; ++l) {
    if (!m.moe_block(l)) continue;
    for (std::size_t e = 0; e < E; ++e) {
      const std::int64_t n = routed[l * E + e];
      load.min = std::min(load.min, n);
      load.max = std::max(load.max, n);
      total += n;
      ++counted;
    }
  }
  // Every block routes the same tokens: the mean is each block's, and max / mean the worst block's imbalance.
  load.mean = static_cast<double>(total) / static_cast<double>(std::max<std::int64_t>(counted, 1));
  load.imbalance = load.mean > 0 ? static_cast<double>(load.max) / load.mean : 0;
  if (t.moe_z_loss != 0 || t.moe_seq_aux != 0) {
    double sums[2] = {z_loss_sum, seq_aux_sum};
    mpi_all_reduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, world, "the MoE auxiliary losses");
    load.aux_loss = t.moe_z_loss * sums[0] / tokens + t.moe_seq_aux * sums[1] / sequences;
  }
  return load;
}

StepStats reduce_step(ParallelContext& ctx, double step_ms, double bubble_ms, double recompute_ms) {
  const auto groups = ctx.reported();
  const int pp = ctx.dims().pp;
  // One reduction for every time: [step, recompute, (ms, exposed) per group, bubble per stage].
  std::vector<double> times(2 + 2 * groups.size() + pp, 0.0);
  times[0] = step_ms;
  times[1] = recompute_ms;
  for (std::size_t k = 0; k < groups.size(); ++k)
    if (groups[k].comm != nullptr) {
      times[2 + 2 * k] = groups[k].comm->stats().ms;
      times[3 + 2 * k] = groups[k].comm->stats().exposed_ms;
    }
  times[2 + 2 * groups.size() + ctx.coord(Axis::pp)] = bubble_ms;
  // The least-blocked rank's exposed time per group (ranks outside it: +inf).
  std::vector<double> least(groups.size(), std::numeric_limits<double>::infinity());
  for (std::size_t k = 0; k < groups.size(); ++k)
    if (groups[k].comm != nullptr) least[k] = groups[k].comm->stats().exposed_ms;
  mpi_all_reduce(MPI_IN_PLACE, times.data(), static_cast<int>(times.size()), MPI_DOUBLE, MPI_MAX, ctx.mesh().cart(),
                 "the step's times (slowest rank)");
  mpi_all_reduce(MPI_IN_PLACE, least.data(), static_cast<int>(least.size()), MPI_DOUBLE, MPI_MIN, ctx.mesh().cart(),
                 "the step's times (least-blocked rank)");
  StepStats s;
  s.step_ms = times[0];
  s.recompute_ms = times[1];
  for (std::size_t k = 0; k < groups.size(); ++k) {
    CommStats c = groups[k].comm != nullptr ? groups[k].comm->stats() : CommStats{};
    c.ms = times[2 + 2 * k];
    c.exposed_ms = times[3 + 2 * k];
    c.exposed_min_ms = std::isfinite(least[k]) ? least[k] : 0.0;
    s.comm.emplace_back(groups[k].name, c);
    if (groups[k].comm != nullptr) groups[k].comm->reset_stats();
  }
  s.bubble_ms.assign(times.end() - pp, times.end());
  return s;
}

namespace {

// "1f1b schedule, 4 micro-batches | stage 0: layers 0-2 (+embedding) | ..."
std::string describe_pipeline(const RunLayout& l) {
  return std::string(name_of(l.schedule.kind())) + " schedule, " + std::to_string(l.micro_batches) +
         " micro-batches | " + l.plan.describe();
}

// "4 chunks of 16 tokens per sequence; cp rank i holds chunks i and 3-i"
std::string describe_context(const Config& cfg, const RunLayout& l) {
  const int cp = l.dims.cp;
  return std::to_string(2 * cp) + " chunks of " + std::to_string(cfg.model.seq_len / (2 * cp)) +
         " tokens per sequence; cp rank i holds chunks i and " + std::to_string(2 * cp - 1) + "-i";
}

// Activations one micro-batch keeps in one chunk with recomputation, and without.
std::string describe_recompute(const Config& cfg, const RunLayout& l) {
  RunLayout full = l;
  full.recompute = Recompute::none;
  const double with = estimate_memory(cfg, l).activation_bytes_per_micro_batch / kMiB;
  const double without = estimate_memory(cfg, full).activation_bytes_per_micro_batch / kMiB;
  char buf[160];
  std::snprintf(buf, sizeof buf, "block: %.1f MiB of activations per micro-batch and chunk instead of %.1f MiB", with,
                without);
  return buf;
}

// One line per setting that does nothing here: worth knowing, not an error.
void print_notes(const Config& cfg, const RunLayout& layout) {
  for (const std::string& note : settings_without_effect(cfg, layout)) std::printf("note: %s\n", note.c_str());
}

}  // namespace

void print_check(const Config& cfg, const RunLayout& layout, int ranks_on_node) {
  const auto& m = cfg.model;
  std::printf("# resolved deck\n%s\n\n", cfg.toml.c_str());
  std::printf("architecture      %s\n", architecture_text(m).c_str());
  // N leaves out the lookup tables: wpe, and wte when lm_head is the head's product.
  const char* lookups = m.learned_positions() ? (m.tie_embeddings ? "all but wpe" : "all but the lookups wpe and wte")
                                              : (m.tie_embeddings ? "all" : "all but wte, a lookup");
  if (m.moe()) {  // the MoE blocks, their parameters (total, active) and FLOPs, the experts per rank
    std::printf("%s", describe_moe(m, layout.dims).c_str());
  } else {
    std::printf("parameters        %lld (%lld in MFU's N: %s)\n", static_cast<long long>(gpt_param_count(m)),
                static_cast<long long>(gpt_flops_param_count(m)), lookups);
    std::printf("FLOPs per token   %.4g (6N + 12 L C T)\n", gpt_flops_per_token(m));
  }
  std::printf("accumulation      %d micro-batches of %d per data-parallel rank (%d of them) per step\n",
              layout.micro_batches, cfg.train.micro_batch, layout.dims.data_parallel());
  if (layout.dims.pp > 1) {
    std::printf("pipeline          %s\n", describe_pipeline(layout).c_str());
    std::printf("                  ideal bubble %.1f%% of the step\n", 100 * layout.schedule.ideal_bubble());
  }
  if (layout.dims.cp > 1) std::printf("context           %s\n", describe_context(cfg, layout).c_str());
  if (layout.recompute == Recompute::block)
    std::printf("recompute         %s\n", describe_recompute(cfg, layout).c_str());
  // Per rank of each stage: the sizes the model allocates.
  const auto stages = estimate_memory_per_stage(cfg, layout);
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const MemoryEstimate& e = stages[s];
    std::printf(
        "memory estimate   %s%.1f MiB per rank: %.1f MiB model state (params, grads, AdamW) + %lld x %.1f MiB "
        "activations in flight (micro-batch %d) + %.1f MiB scratch\n",
        stages.size() > 1 ? ("stage " + std::to_string(s) + ": ").c_str() : "", e.total() / kMiB, e.state_bytes / kMiB,
        static_cast<long long>(e.in_flight), e.activation_bytes_per_micro_batch / kMiB, cfg.train.micro_batch,
        e.scratch_bytes / kMiB);
  }
  std::string how;
  const double limit = memory_per_rank(cfg, ranks_on_node, &how);
  const double data = data_bytes(cfg);
  if (data > 0) std::printf("data in memory    %s per rank (%s)\n", bytes_text(data).c_str(), cfg.data.path.c_str());
  std::printf("memory limit      %s per rank (%s)\n", limit > 0 ? bytes_text(limit).c_str() : "unknown", how.c_str());
  print_notes(cfg, layout);
  std::printf("%s", kernels::gemm_machine_lines().c_str());
  if (const auto prediction = predict_run(cfg, layout, ranks_on_node))
    std::printf("%s\n", prediction_line(cfg, *prediction).c_str());
  std::printf("deck OK\n");
}

void print_banner(const Config& cfg, const RunLayout& layout, const ParallelContext& ctx, const std::string& data,
                  const std::string& validation, const PeakFlops& peak, bool show_mesh,
                  const std::optional<RunPrediction>& prediction) {
  const auto& t = cfg.train;
  std::printf("ndmini %s | Kokkos %d.%d.%d %s | mesh %s | ranks/node %d | params %lld | %.3g FLOP/token\n",
              NDMINI_VERSION, KOKKOS_VERSION / 10000, KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100,
              ExecSpace::name(), layout.dims.str().c_str(), ctx.mesh().ranks_per_node(),
              static_cast<long long>(model_counts(cfg.model).total), model_counts(cfg.model).flops_per_token);
  std::printf("model: %s\n", architecture_text(cfg.model).c_str());
  if (const std::string filled = describe_filled_degree(cfg.parallel, layout.dims);
      !filled.empty() && layout.dims.size() > 1)
    std::printf("layout: %s\n", filled.c_str());
  std::printf("data: %s | steps %d | global batch %d x %d tokens | %d data-parallel ranks x %d micro-batches of %d\n",
              data.c_str(), t.steps, t.global_batch, cfg.model.seq_len, layout.dims.data_parallel(),
              layout.micro_batches, t.micro_batch);
  if (!validation.empty()) std::printf("validation: %s\n", validation.c_str());
  if (layout.dims.pp > 1) std::printf("pipeline: %s\n", describe_pipeline(layout).c_str());
  if (layout.dims.cp > 1) std::printf("context: %s\n", describe_context(cfg, layout).c_str());
  if (layout.recompute == Recompute::block) std::printf("recompute: %s\n", describe_recompute(cfg, layout).c_str());
  if (t.precision == Precision::bf16)
    std::printf(
        "precision: bf16 mixed: fp32 masters, gradients and AdamW; bf16 operands of every matrix product, "
        "bf16 activations kept for the backward, bf16 FSDP gathers\n");
  std::printf("peak: %.1f GFLOP/s per rank, %s\n", peak.flops_per_rank / 1e9, peak.source.c_str());
  std::printf("%s", kernels::gemm_machine_lines().c_str());
  if (prediction) std::printf("%s\n", prediction_line(cfg, *prediction).c_str());
  if (show_mesh) std::printf("%s", describe_mesh(layout.dims, true).c_str());
  print_notes(cfg, layout);
  std::fflush(stdout);
}

namespace {

// The step split as PERFORMANCE and the summary give it: medians over the
// timed steps of each reported group's exposed time, and the rest, compute.
struct MeasuredParts {
  struct Group {
    std::string name;
    double exposed_ms = 0, least_blocked_ms = 0, in_flight_ms = 0;
  };
  std::vector<Group> groups;
  double compute_ms = 0;
};

MeasuredParts measured_parts(const TrainResult& r) {
  MeasuredParts m;
  double exposed = 0;
  const std::size_t reported = r.timed.empty() ? 0 : r.timed.front().comm.size();
  for (std::size_t k = 0; k < reported; ++k) {
    MeasuredParts::Group g;
    g.name = r.timed.front().comm[k].first;
    g.exposed_ms = median_of(r.timed, [&](const StepStats& st) { return st.comm[k].second.exposed_ms; });
    g.least_blocked_ms = median_of(r.timed, [&](const StepStats& st) { return st.comm[k].second.exposed_min_ms; });
    g.in_flight_ms = median_of(r.timed, [&](const StepStats& st) { return st.comm[k].second.ms; });
    exposed += g.exposed_ms;
    m.groups.push_back(g);
  }
  m.compute_ms = r.median_step_ms - exposed;
  return m;
}

// " | predicted 3.1 ms" after a measured time, where the run has a prediction.
std::string beside(const std::optional<RunPrediction>& prediction, double predicted_ms) {
  if (!prediction) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, " | predicted %.3g ms", predicted_ms);
  return buf;
}

}  // namespace

namespace {

// An MoE run's expert load over its steps (every step: routing is no
// timing, the first step counts too): the imbalance's median and range, the
// fewest and most tokens an expert received in a step.
struct MoeRunLoad {
  double imbalance_median = 0, imbalance_min = 0, imbalance_max = 0;
  std::int64_t fewest = 0, most = 0;
};
MoeRunLoad moe_run_load(const std::vector<MoeLoad>& loads) {
  MoeRunLoad m;
  std::vector<double> imbalance;
  for (const MoeLoad& l : loads) imbalance.push_back(l.imbalance);
  m.imbalance_median = median(imbalance);
  m.imbalance_min = *std::min_element(imbalance.begin(), imbalance.end());
  m.imbalance_max = *std::max_element(imbalance.begin(), imbalance.end());
  m.fewest = std::min_element(loads.begin(), loads.end(), [](auto& a, auto& b) { return a.min < b.min; })->min;
  m.most = std::max_element(loads.begin(), loads.end(), [](auto& a, auto& b) { return a.max < b.max; })->max;
  return m;
}

}  // namespace

void print_performance(const RunLayout& layout, const ParallelContext& ctx, const TrainResult& r,
                       const std::optional<RunPrediction>& prediction) {
  const int world = layout.dims.size();
  const MeasuredParts measured = measured_parts(r);
  std::printf("PERFORMANCE\n");
  std::printf("  ranks              %d (%d per node)\n", world, ctx.mesh().ranks_per_node());
  std::printf("  mesh               %s\n", layout.dims.str().c_str());
  std::printf("  steps timed        %zu (medians; first step excluded as warm-up; times are the slowest rank's)\n",
              r.timed.size());
  std::printf("  time/step          %.1f ms%s\n", r.median_step_ms,
              beside(prediction, prediction ? prediction->step.step_ms : 0).c_str());
  const auto groups = ctx.reported();
  for (std::size_t k = 0; k < measured.groups.size(); ++k) {
    // A group of one rank moves nothing: its line would only say 0.0 ms.
    if (k < groups.size() && groups[k].size == 1) continue;
    const MeasuredParts::Group& g = measured.groups[k];
    std::printf(
        "    exposed comm     %7.1f ms  %-13s (least-blocked rank %.1f ms; %.1f ms in flight, summed over its "
        "requests)%s\n",
        g.exposed_ms, g.name.c_str(), g.least_blocked_ms, g.in_flight_ms,
        beside(prediction, prediction ? prediction->exposed_ms(g.name) : 0).c_str());
  }
  std::printf("    compute          %.1f ms%s\n", measured.compute_ms,
              beside(prediction, prediction ? prediction->compute_ms() : 0).c_str());
  if (layout.recompute == Recompute::block)
    std::printf("      recompute      %.1f ms of it: block forwards run again in the backward (slowest rank)%s\n",
                median_of(r.timed, [](const StepStats& st) { return st.recompute_ms; }),
                beside(prediction, prediction ? prediction->step.recompute_ms : 0).c_str());
  if (layout.dims.pp == 1) {
    std::printf("    bubble           0.0 ms (no pipeline)\n");
  } else {
    // Waiting for a neighbour stage: part of pp's exposed time above.
    std::printf("    bubble           per stage (within pp's exposed time; ideal %.1f%% of the step)%s\n",
                100 * r.ideal_bubble, beside(prediction, prediction ? prediction->step.bubble_ms : 0).c_str());
    for (int stage = 0; stage < layout.dims.pp; ++stage) {
      const double b = r.median_bubble_ms(stage);
      std::printf("      stage %-3d      %7.1f ms  %5.1f%% of the step, %.1f MiB activations in flight at most\n",
                  stage, b, r.median_step_ms > 0 ? 100 * b / r.median_step_ms : 0.0,
                  r.peak_activation_bytes[stage] / kMiB);
    }
  }
  std::printf("    I/O              %.1f ms in total (checkpoints)", r.io_ms);
  if (r.async_saves > 0) {
    const double hidden = std::max(0.0, r.async_written_ms - r.async_waited_ms);
    std::printf(
        "; %d async save(s) written in %.1f ms in the background, %.1f ms (%.0f%%) of it hidden behind training",
        r.async_saves, r.async_written_ms, hidden, r.async_written_ms > 0 ? 100 * hidden / r.async_written_ms : 100.0);
  }
  std::printf("\n");
  if (!r.moe_loads.empty()) {
    const MoeRunLoad m = moe_run_load(r.moe_loads);
    const MoeLoad& last = r.moe_loads.back();
    std::printf(
        "  moe                imbalance %.2f (%.2f-%.2f over %zu steps), tokens per expert %lld to %lld in a step",
        m.imbalance_median, m.imbalance_min, m.imbalance_max, r.moe_loads.size(), static_cast<long long>(m.fewest),
        static_cast<long long>(m.most));
    if (layout.dims.ep > 1)  // the expert group's traffic, rank 0's (its exposed time is the ep line above)
      std::printf(", all-to-all %.2f MiB per step", median_of(r.timed, [](const StepStats& st) {
                                                      for (const auto& [name, s] : st.comm)
                                                        if (name == "ep") return static_cast<double>(s.bytes);
                                                      return 0.0;
                                                    }) / kMiB);
    if (last.aux_loss) std::printf(", aux %.6f at the last", *last.aux_loss);
    if (last.bias_min) std::printf(", selection bias %.4g..%.4g at the last", *last.bias_min, *last.bias_max);
    std::printf("\n");
  }
  if (!r.val_losses.empty())
    std::printf("  validation         loss %.6f at step %lld (the last; %.1f ms evaluating in all, not in time/step)\n",
                r.val_losses.back().second, static_cast<long long>(r.val_losses.back().first), r.eval_ms);
  if (prediction)
    std::printf("  tokens/s           %.0f | predicted %.0f on %s\n", r.tokens_per_s, prediction->step.tokens_per_s,
                prediction->cluster.name.c_str());
  else
    std::printf("  tokens/s           %.0f\n", r.tokens_per_s);
  std::printf("  tokens/s/rank      %.0f\n", r.tokens_per_s / world);
  std::printf("  MFU                %.1f%% of %.1f GFLOP/s per rank (%s)\n", 100 * r.mfu, r.peak.flops_per_rank / 1e9,
              r.peak.source.c_str());
  // A measured peak covers every product the calibration timed; a given one may not.
  if (r.mfu > 1)
    std::printf(
        "                     above 100%%: the run multiplied faster than this peak%s\n",
        r.peak.run_flops.empty() ? "; perf.peak_gflops = 0 measures it" : " (a busy machine during the calibration)");
  std::printf(
      "  memory/rank        %.1f MiB model state, %.1f MiB activations in flight at most, "
      "%s%.1f MiB estimated in all, %.1f MiB peak RSS (rank 0)\n",
      r.state_bytes / kMiB, *std::max_element(r.peak_activation_bytes.begin(), r.peak_activation_bytes.end()) / kMiB,
      r.staged_bytes > 0 ? (std::to_string(static_cast<long long>(r.staged_bytes / kMiB + 0.5)) +
                            " MiB host copy for async checkpoints, ")
                               .c_str()
                         : "",
      r.mem_bytes / kMiB, peak_rss_bytes() / kMiB);
  std::fflush(stdout);
}

std::string summary_json(const RunLayout& layout, const ParallelContext& ctx, const TrainResult& r,
                         const std::optional<RunPrediction>& prediction) {
  const int world = layout.dims.size();
  std::vector<double> bubble;
  for (int stage = 0; stage < layout.dims.pp; ++stage) bubble.push_back(r.median_bubble_ms(stage));
  const auto final_loss = r.final_loss();
  const bool validated = !r.val_losses.empty();
  const MeasuredParts measured = measured_parts(r);
  nlohmann::json exposed = nlohmann::json::object();
  for (const MeasuredParts::Group& g : measured.groups) exposed[g.name] = g.exposed_ms;
  nlohmann::json j = {{"summary", true},
                      {"steps", r.steps_run()},
                      {"ranks", world},
                      {"ranks_per_node", ctx.mesh().ranks_per_node()},
                      {"mesh", layout.dims.str()},
                      {"schedule", name_of(layout.schedule.kind())},
                      {"micro_batches", layout.micro_batches},
                      {"median_step_ms", r.median_step_ms},
                      {"compute_ms", measured.compute_ms},
                      {"exposed_comm_ms", exposed},
                      {"tokens_per_s", r.tokens_per_s},
                      {"tokens_per_s_per_rank", r.tokens_per_s / world},
                      {"mfu", r.mfu},
                      {"peak_flops", r.peak.flops_per_rank},
                      {"peak_source", r.peak.source},
                      {"io_ms", r.io_ms},
                      {"async_saves", r.async_saves},
                      {"async_written_ms", r.async_written_ms},
                      {"async_waited_ms", r.async_waited_ms},
                      {"staged_bytes", r.staged_bytes},
                      {"bubble_ms_per_stage", bubble},
                      {"recompute_ms", median_of(r.timed, [](const StepStats& st) { return st.recompute_ms; })},
                      {"ideal_bubble", r.ideal_bubble},
                      {"state_bytes", r.state_bytes},
                      {"peak_activation_bytes_per_stage", r.peak_activation_bytes},
                      {"mem_bytes", r.mem_bytes},
                      {"peak_rss_bytes", static_cast<std::int64_t>(peak_rss_bytes())},
                      {"final_loss", final_loss ? nlohmann::json(*final_loss) : nlohmann::json()},
                      {"final_val_loss", validated ? nlohmann::json(r.val_losses.back().second) : nlohmann::json()},
                      {"final_val_step", validated ? nlohmann::json(r.val_losses.back().first) : nlohmann::json()},
                      {"eval_ms", r.eval_ms},
                      {"predicted", prediction ? prediction_json(*prediction) : nlohmann::json()}};
  if (!r.moe_loads.empty()) {
    const MoeRunLoad m = moe_run_load(r.moe_loads);
    j["moe"] = {{"imbalance_median", m.imbalance_median},
                {"imbalance_min", m.imbalance_min},
                {"imbalance_max", m.imbalance_max},
                {"tokens_per_expert_min", m.fewest},
                {"tokens_per_expert_max", m.most}};
  }
  return j.dump();
}

std::string stop_line(const Config& cfg, int signal_number, std::int64_t steps_done, std::int64_t saved_step,
                      bool interrupted) {
  const std::string head = std::string("ndmini: ") + signal_name(signal_number) + " received";
  const std::string of = std::to_string(steps_done) + " of " + std::to_string(cfg.train.steps) + " steps done";
  const std::string status = "; exit status " + std::to_string(signal_exit_status(signal_number));
  if (!interrupted) return head + " after the last step: the run is complete (" + of + ")" + status;
  std::string saved;
  if (saved_step >= 0)
    saved = "saved checkpoint " + cfg.checkpoint.dir + "/" + io::checkpoint_dirname(saved_step) +
            " (continue with --resume)";
  else if (!cfg.checkpoint.on_signal)
    saved = "no checkpoint saved (checkpoint.on_signal = false)";
  else
    saved = "no checkpoint saved (the run saves none: checkpoint.every = 0)";
  return head + ": stopped after step " + std::to_string(steps_done - 1) + " (" + of + "); " + saved + status;
}

}  // namespace ndmini
