// SPDX-License-Identifier: BSD-3-Clause
#include "plan/plan.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.hpp"
#include "core/regular_file.hpp"
#include "model/gpt.hpp"
#include "parallel/param_store.hpp"
#include "parallel/stage_runtime.hpp"
#include "plan/search_request.hpp"
#include "run/budget.hpp"

namespace ndmini {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<int> divisors(long long n) {
  std::vector<int> out;
  for (long long k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(static_cast<int>(k));
  return out;
}

// Interleaving's gain, (p-1)/(v m), flattens fast while its point-to-point
// traffic grows with v: the search tries up to this many virtual stages.
constexpr int kMostVirtualStages = 8;

// The schedules a pipeline of `pp` stages can run: (kind, virtual stages);
// interleaved with chunks of equal layers (v divides layers / pp).
std::vector<std::pair<ScheduleKind, int>> schedules(int pp, int layers) {
  if (pp == 1) return {{ScheduleKind::one_f_one_b, 1}};
  std::vector<std::pair<ScheduleKind, int>> out = {{ScheduleKind::gpipe, 1}, {ScheduleKind::one_f_one_b, 1}};
  for (int v = 2; v <= kMostVirtualStages && v * pp <= layers; ++v)
    if (layers % (v * pp) == 0) out.push_back({ScheduleKind::interleaved, v});
  return out;
}

// 80, 0.0001: as a person writes it.
std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / kGiB);
  return buf;
}

// Sequence parallelism splits the tp group's activations: at tp = 1 the
// flag has no effect, and the report says off.
bool sequence_parallel_in_effect(const ParallelDims& d) { return d.sequence_parallel && d.tp > 1; }

std::string layout_words(const PlanCandidate& c) {
  const ParallelDims& d = c.layout.dims;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s sp=%s recompute=%s micro_batch=%d (x%d) schedule=%s v=%d", d.str().c_str(),
                sequence_parallel_in_effect(d) ? "on" : "off", name_of(c.layout.recompute), c.cfg.train.micro_batch,
                c.layout.micro_batches, name_of(c.layout.schedule.kind()), d.virtual_stages);
  return c.cfg.model.moe() ? buf + std::string(" ep=") + std::to_string(d.ep) : std::string(buf);
}

// An MoE deck's block: its all-to-alls, compute and experts per rank (plan/moe_cost.hpp).
void moe_details(std::string& out, const PlanCandidate& c) {
  const StepPrediction& p = c.prediction;
  const MoeBlockCost& k = p.moe;
  const ParallelDims& d = c.layout.dims;
  const ModelConfig& m = c.cfg.model;
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "moe               %d MoE blocks on that stage; each, per micro-batch on a rank: forward %.3f ms, "
                "backward %.3f ms\n"
                "                  all-to-all over ep = %d (%s): %.4g bytes each, %.3f ms; 2 forward (dispatch, "
                "combine), 2 backward\n"
                "                  experts %.3f ms forward at perf.moe_imbalance = %g, router %.3f, shared expert "
                "%.3f, permutation %.3f (the dense MLP's: %.3f)\n"
                "                  experts per rank %d of %d per block (%.4g parameters), FSDP-sharded over %d ranks\n",
                p.moe_blocks, k.forward_ms, k.backward_ms, d.ep,
                d.ep <= 1      ? "self-sends"
                : k.inter_node ? "inter_node"
                               : "intra_node",
                k.a2a_bytes, k.a2a_ms, k.experts_ms, k.imbalance, k.router_ms, k.shared_ms, k.permute_ms,
                k.dense_mlp_ms, m.moe_experts / d.ep, m.moe_experts, k.expert_params_per_rank, d.expert_fsdp());
  out += buf;
}

void details(std::string& out, const PlanCandidate& c, const ClusterSpec& cluster) {
  const StepPrediction& p = c.prediction;
  const PlanMemory& mem = p.memory;
  char buf[512];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    out += buf;
  };
  out += "layout            " + layout_words(c) + "\n";
  line("memory per device %s GiB of %s GiB (%s): parameters %s, gradients %s, optimizer state %s,\n",
       gib(static_cast<double>(mem.total())).c_str(), gib(cluster.memory_bytes()).c_str(),
       p.fits ? "fits" : "DOES NOT FIT", gib(static_cast<double>(mem.params)).c_str(),
       gib(static_cast<double>(mem.grads)).c_str(), gib(static_cast<double>(mem.optimizer)).c_str());
  line(
      "                  activations %s (records of %lld micro-batch%s in flight), communication buffers %s, "
      "workspace %s\n",
      gib(static_cast<double>(mem.activations)).c_str(), static_cast<long long>(mem.in_flight),
      mem.in_flight == 1 ? "" : "es", gib(static_cast<double>(mem.comm_buffers)).c_str(),
      gib(static_cast<double>(mem.workspace)).c_str());
  line("FLOPs per step    %.4g model, %.4g with recomputation\n", p.model_flops, p.hardware_flops);
  line(
      "time per step     %.3f ms = compute %.3f + recompute %.3f + memory-bound kernels %.3f + kernel launches %.3f + "
      "exposed comm %.3f + bubble %.3f + optimizer %.3f (pipeline stage %d)\n",
      p.step_ms, p.compute_ms, p.recompute_ms, p.kernels_ms, p.launch_ms, p.exposed_comm_ms, p.bubble_ms,
      p.optimizer_ms, p.stage);
  line("kernel launches   %.0f per step on a device of that stage, %s\n", p.launches,
       cluster.launch_overhead_us > 0
           ? ("at device.launch_overhead_us = " + number_text(cluster.launch_overhead_us) + " each").c_str()
           : "not timed (the cluster file has no device.launch_overhead_us)");
  line("throughput        %.4g tokens/s, MFU %.3f\n", p.tokens_per_s, p.mfu);
  if (c.cfg.model.moe()) moe_details(out, c);
  out += "communication     group          ranks  link        calls        bytes/step       ms  exposed ms\n";
  for (const GroupTraffic& g : p.comm) {
    if (g.calls == 0) continue;
    line("                  %-13s %6d  %-10s %6lld %16.0f %8.3f %11.3f\n", g.name.c_str(), g.size,
         g.size <= 1    ? "-"
         : g.inter_node ? "inter_node"
                        : "intra_node",
         static_cast<long long>(g.calls), g.bytes, g.ms, g.exposed_ms);
  }
}

nlohmann::ordered_json candidate_json(const PlanCandidate& c) {
  const StepPrediction& p = c.prediction;
  const ParallelDims& d = c.layout.dims;
  nlohmann::ordered_json j;
  j["layout"] = {{"pp", d.pp},
                 {"dp_replicate", d.dp_replicate},
                 {"dp_shard", d.dp_shard},
                 {"cp", d.cp},
                 {"tp", d.tp},
                 {"sequence_parallel", sequence_parallel_in_effect(d)},
                 {"recompute", name_of(c.layout.recompute)},
                 {"micro_batch", c.cfg.train.micro_batch},
                 {"micro_batches", c.layout.micro_batches},
                 {"schedule", name_of(c.layout.schedule.kind())},
                 {"virtual_stages", d.virtual_stages}};
  j["memory_bytes"] = {{"params", p.memory.params},
                       {"grads", p.memory.grads},
                       {"optimizer", p.memory.optimizer},
                       {"activations", p.memory.activations},
                       {"comm_buffers", p.memory.comm_buffers},
                       {"workspace", p.memory.workspace},
                       {"total", p.memory.total()}};
  if (c.cfg.model.moe()) {
    const MoeBlockCost& k = p.moe;
    j["layout"]["ep"] = d.ep;
    j["moe"] = {{"blocks", p.moe_blocks},
                {"forward_ms", k.forward_ms},
                {"backward_ms", k.backward_ms},
                {"all_to_all_ms", k.a2a_ms},
                {"all_to_all_bytes", k.a2a_bytes},
                {"all_to_all_inter_node", k.inter_node},
                {"experts_ms", k.experts_ms},
                {"router_ms", k.router_ms},
                {"shared_ms", k.shared_ms},
                {"permute_ms", k.permute_ms},
                {"dense_mlp_ms", k.dense_mlp_ms},
                {"imbalance", k.imbalance},
                {"experts_per_rank", c.cfg.model.moe_experts / d.ep},
                {"expert_fsdp", d.expert_fsdp()}};
  }
  j["micro_batches_in_flight"] = p.memory.in_flight;  // a count: activations holds this many micro-batches' records
  j["fits"] = p.fits;
  // One block's records of one micro-batch, tensor by tensor, from the size
  // function the activation records are allocated by.
  const BlockSizes block = GptModel::block_sizes_of(c.cfg.model, c.cfg.train.micro_batch, d.tp, d.sequence_parallel,
                                                    d.cp, c.cfg.train.precision);
  nlohmann::ordered_json kept = nlohmann::ordered_json::object();
  for (const BlockSizes::Kept& k : block.kept_tensors(c.layout.recompute == Recompute::block)) kept[k.name] = k.bytes;
  j["block_activations"] = {{"bytes", block.activation_bytes(c.layout.recompute == Recompute::block)},
                            {"tensors", kept}};
  j["flops_per_step"] = {{"model", p.model_flops}, {"hardware", p.hardware_flops}};
  nlohmann::ordered_json comm = nlohmann::ordered_json::array();
  for (const GroupTraffic& g : p.comm)
    comm.push_back({{"group", g.name},
                    {"size", g.size},
                    {"inter_node", g.inter_node},
                    {"calls", g.calls},
                    {"bytes", g.bytes},
                    {"ms", g.ms},
                    {"exposed_ms", g.exposed_ms}});
  j["comm"] = comm;
  j["time_ms"] = {{"compute", p.compute_ms},           {"recompute", p.recompute_ms},
                  {"kernels", p.kernels_ms},           {"launch", p.launch_ms},
                  {"exposed_comm", p.exposed_comm_ms}, {"bubble", p.bubble_ms},
                  {"optimizer", p.optimizer_ms},       {"step", p.step_ms}};
  j["kernel_launches"] = p.launches;
  j["stage"] = p.stage;
  j["tokens_per_s"] = p.tokens_per_s;
  j["mfu"] = p.mfu;
  return j;
}

// A bound below the memory estimate of a layout, cheap (one stage's
// schedule, no replay): the first stage's model state and its micro-batch
// records in flight, each at the smallest record of its chunks.
double memory_lower_bound(const Config& cfg, const RunLayout& l) {
  const ParallelDims& d = l.dims;
  const std::vector<Chunk> chunks = l.plan.chunks_of(0);
  const ParamLayout layout = gpt_param_layout(cfg.model, chunks, d.tp, 0, d.fsdp(), {d.ep, 0, d.expert_fsdp()});
  const BlockSizes block = GptModel::block_sizes_of(cfg.model, cfg.train.micro_batch, d.tp, d.sequence_parallel, d.cp);
  double smallest = -1;
  for (const Chunk& c : chunks) {
    const double bytes = static_cast<double>(StageRuntime::record_bytes(c, block, l.recompute));
    if (smallest < 0 || bytes < smallest) smallest = bytes;
  }
  return 4.0 * static_cast<double>(ParamStore::shard_elements(layout)) * sizeof(real) +
         l.schedule.max_in_flight(0) * smallest;
}

}  // namespace

bool degrees_unset(const ParallelConfig& p) {
  return p.pp == 0 && p.dp_replicate == 0 && p.dp_shard == 0 && p.cp == 0 && p.tp == 0;
}

PlanSearch search_layouts(const Config& base, int world, const ClusterSpec& cluster, Precision precision,
                          std::size_t top, const Implementation& code) {
  PlanSearch out;
  out.least_bytes = -1;
  // One layout's choices, and the bound no prediction of it falls below.
  struct Choice {
    int pp, dpr, dps, cp, tp, ep, micro_batch, v;
    bool sp;
    Recompute recompute;
    ScheduleKind kind;
    double bound_ms;
  };
  Config cfg = base;
  cfg.toml.clear();  // not needed here, and copied with every candidate otherwise
  auto apply = [&cfg](const Choice& c) {
    ParallelConfig& p = cfg.parallel;
    p.pp = c.pp;
    p.dp_replicate = c.dpr;
    p.dp_shard = c.dps;
    p.cp = c.cp;
    p.tp = c.tp;
    p.ep = c.ep;
    p.sequence_parallel = c.sp;
    p.schedule = c.kind;
    p.virtual_stages = c.v;
    cfg.train.micro_batch = c.micro_batch;
    cfg.train.recompute = c.recompute;
  };
  // Every layout that resolves, with its bound (cheap: no replay, no memory).
  std::vector<Choice> choices;
  for (int pp : divisors(world))
    for (int dpr : divisors(world / pp))
      for (int dps : divisors(world / pp / dpr))
        for (int cp : divisors(world / pp / dpr / dps)) {
          const int tp = world / pp / dpr / dps / cp;
          const long long dp = static_cast<long long>(dpr) * dps;
          if (base.train.global_batch % dp != 0) {
            ++out.considered;
            continue;
          }
          // Expert parallelism: every ep dividing dp_shard x cp x tp and the experts (1 for a dense model).
          std::vector<int> eps;
          for (int ep : divisors(static_cast<long long>(dps) * cp * tp))
            if (ep == 1 || (base.model.moe() && base.model.moe_experts % ep == 0)) eps.push_back(ep);
          for (int ep : eps)
            for (int micro_batch : divisors(base.train.global_batch / dp))
              for (bool sp : {false, true}) {
                if (sp && tp == 1) continue;
                for (Recompute recompute : {Recompute::none, Recompute::block})
                  for (const auto& [kind, v] : schedules(pp, base.model.layers)) {
                    ++out.considered;
                    Choice c{pp, dpr, dps, cp, tp, ep, micro_batch, v, sp, recompute, kind, 0};
                    apply(c);
                    try {
                      c.bound_ms = step_ms_lower_bound(cfg, resolve_layout(cfg, world), cluster, precision);
                    } catch (const Error&) {
                      continue;  // does not divide the world or the model
                    }
                    choices.push_back(c);
                  }
              }
        }
  out.valid = static_cast<long long>(choices.size());
  // In the order of their bounds: once `top` layouts that fit are faster
  // than the next bound, no layout left can enter the top.
  std::stable_sort(choices.begin(), choices.end(),
                   [](const Choice& a, const Choice& b) { return a.bound_ms < b.bound_ms; });
  std::vector<double> best;  // step times of the fitting layouts, ascending
  for (const Choice& c : choices) {
    if (best.size() >= top && c.bound_ms > best[top - 1]) break;
    ++out.evaluated;
    apply(c);
    RunLayout layout = resolve_layout(cfg, world);
    // Too large already by the bound: the estimate, which is larger, is not needed.
    const double bound = memory_lower_bound(dense_base(cfg), layout);
    const double bytes =
        bound > cluster.memory_bytes() ? bound : static_cast<double>(estimate_memory(dense_base(cfg), layout).total());
    if (out.least_bytes < 0 || bytes < out.least_bytes) out.least_bytes = bytes;
    if (bytes > cluster.memory_bytes()) continue;
    StepPrediction prediction = predict_step(cfg, layout, cluster, precision, code);
    if (!prediction.fits) continue;  // an MoE model's experts, beyond the dense estimate
    best.insert(std::upper_bound(best.begin(), best.end(), prediction.step_ms), prediction.step_ms);
    Config kept = cfg;
    kept.toml = base.toml;
    out.fitting.push_back({std::move(kept), std::move(layout), std::move(prediction)});
  }
  // Equal times: the layout that needs less memory first (more room to grow the batch or the model).
  std::stable_sort(out.fitting.begin(), out.fitting.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.prediction.step_ms != b.prediction.step_ms) return a.prediction.step_ms < b.prediction.step_ms;
    return a.prediction.memory.total() < b.prediction.memory.total();
  });
  return out;
}

namespace {

// The header's second line: what was planned.
std::string batch_words(const PlanContext& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "global batch %d sequences of %d tokens, micro-batch %s, %s compute\n", c.global_batch,
                c.seq_len, c.searched ? "searched" : std::to_string(c.micro_batch).c_str(), name_of(c.precision));
  return buf;
}

// Where launches are not timed and would take over a tenth of the step at
// a typical launch cost, the prediction is a lower bound: say so.
void launch_note(PlanContext& context, const PlanCandidate& best) {
  const StepPrediction& p = best.prediction;
  if (context.cluster.launch_overhead_us > 0) return;
  const double typical_ms = p.launches * kTypicalLaunchOverheadUs * 1e-3;
  if (typical_ms <= 0.1 * p.step_ms) return;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "the model leaves kernel launches out (cluster file '%s' has no device.launch_overhead_us): the "
                "%s layout launches %.0f kernels per step, %.3g ms at a typical %g us each against its predicted "
                "%.3g ms, so per-device work is below where the model holds and its times are lower bounds; "
                "ndmini plan --calibrate measures the key",
                context.cluster.origin.c_str(), context.searched ? "fastest" : "deck's", p.launches, typical_ms,
                kTypicalLaunchOverheadUs, p.step_ms);
  context.notes.push_back(buf);
}

}  // namespace

std::string plan_text(const PlanContext& ctx, const PlanSearch& search) {
  const ClusterSpec& cluster = ctx.cluster;
  const Implementation& code = ctx.code;
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "ndmini plan: %s on %d device%s of %s (%s; %d per node), %s\n", ctx.deck.c_str(),
                ctx.world, ctx.world == 1 ? "" : "s", cluster.name.c_str(), cluster.origin.c_str(),
                cluster.devices_per_node, name_of(ctx.precision));
  out += buf;
  out += batch_words(ctx);
  for (const std::string& note : ctx.notes) out += "note: " + note + "\n";
  if (code.stored_attention_scores || code.pp_scatter_gather)
    out += std::string("times of a code that is not ndmini:") +
           (code.stored_attention_scores ? " attention stores its s x s scores;" : "") +
           (code.pp_scatter_gather ? " pipeline transfers scattered and gathered over tp;" : "") +
           " memory is ndmini's\n";
  if (!ctx.searched) {
    details(out, search.fitting.front(), cluster);
    return out;
  }
  const std::size_t top = ctx.top;
  std::snprintf(buf, sizeof buf,
                "%lld layouts considered, %lld divide the world and the model; %lld examined (the others "
                "cannot be among the fastest), %zu of them fit in %s GiB per device; the fastest %zu (equal times: "
                "less memory first):\n",
                search.considered, search.valid, search.evaluated, search.fitting.size(),
                gib(cluster.memory_bytes()).c_str(), std::min(top, search.fitting.size()));
  out += buf;
  // compute: the products, recomputation, memory-bound kernels, launches and the optimizer;
  // with comm (exposed) and bubble the three add up to the step.
  out +=
      "rank  pp dp_r dp_s  cp  tp sp recompute  mb    m schedule          v   mem GiB    step ms  compute  "
      "comm  bubble     tokens/s    MFU\n";
  for (std::size_t k = 0; k < top && k < search.fitting.size(); ++k) {
    const PlanCandidate& c = search.fitting[k];
    const ParallelDims& d = c.layout.dims;
    const StepPrediction& p = c.prediction;
    const double compute = p.compute_ms + p.recompute_ms + p.kernels_ms + p.launch_ms + p.optimizer_ms;
    std::snprintf(buf, sizeof buf,
                  "%4zu %3d %4d %4d %3d %3d %-2s %-9s %4d %4d %-16s %2d %9s %10.3f %8.3f %5.3f %7.3f %12.4g %6.3f\n",
                  k + 1, d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp, sequence_parallel_in_effect(d) ? "on" : "-",
                  name_of(c.layout.recompute), c.cfg.train.micro_batch, c.layout.micro_batches,
                  name_of(c.layout.schedule.kind()), d.virtual_stages,
                  gib(static_cast<double>(p.memory.total())).c_str(), p.step_ms, compute, p.exposed_comm_ms,
                  p.bubble_ms, p.tokens_per_s, p.mfu);
    out += buf;
    if (c.cfg.model.moe()) out.insert(out.size() - 1, " ep=" + std::to_string(d.ep));
  }
  out += "\nthe fastest in detail:\n";
  details(out, search.fitting.front(), cluster);
  return out;
}

std::string plan_json(const PlanContext& ctx, const PlanSearch& search) {
  const ClusterSpec& cluster = ctx.cluster;
  nlohmann::ordered_json j;
  j["deck"] = ctx.deck;
  j["cluster"] = {{"file", cluster.origin},
                  {"name", cluster.name},
                  {"devices_per_node", cluster.devices_per_node},
                  {"memory_gib", cluster.memory_gib}};
  j["world"] = ctx.world;
  j["precision"] = name_of(ctx.precision);
  j["global_batch"] = ctx.global_batch;
  j["micro_batch"] = ctx.micro_batch;  // the deck's; each layout has its own
  j["seq_len"] = ctx.seq_len;
  j["notes"] = ctx.notes;
  j["implementation"] = {{"stored_attention_scores", ctx.code.stored_attention_scores},
                         {"pp_scatter_gather", ctx.code.pp_scatter_gather}};
  j["search"] = ctx.searched;
  j["considered"] = search.considered;
  j["valid"] = search.valid;
  j["evaluated"] = search.evaluated;
  j["fitting"] = search.fitting.size();
  nlohmann::ordered_json layouts = nlohmann::ordered_json::array();
  for (std::size_t k = 0; k < ctx.top && k < search.fitting.size(); ++k)
    layouts.push_back(candidate_json(search.fitting[k]));
  j["layouts"] = layouts;
  return j.dump(2) + "\n";
}

std::string run_plan(const PlanRequest& r) {
  using std::to_string;
  ClusterSpec cluster = load_cluster(r.cluster);
  const FileUse use{"deck '" + r.deck + "'", "name a .toml file (e.g. inputs/tiny.toml)"};
  const std::string text = read_small_file(r.deck, kDeckMaxBytes, use);
  const bool searched = r.search || deck_asks_for_search(text, r.overrides);
  // --precision is train.precision for the whole plan: the peak, the memory
  // (the trainer's own sizes per precision), the bf16 activation and gather
  // bytes, and the deck's checks (comm.reduce_dtype = "bf16" needs it).
  std::vector<std::string> overrides = r.overrides;
  if (!r.precision.empty()) {
    require(r.precision == "fp32" || r.precision == "bf16", "--precision " + r.precision + ": must be fp32 or bf16");
    overrides.push_back("train.precision=" + r.precision);
  }
  Config cfg = parse_config(text, r.deck, searched ? with_degrees_set(overrides) : overrides);
  const Precision precision = cfg.train.precision;

  PlanContext ctx;
  ctx.deck = r.deck;
  ctx.world = r.world;
  ctx.precision = precision;
  ctx.global_batch = cfg.train.global_batch;
  ctx.micro_batch = cfg.train.micro_batch;
  ctx.seq_len = cfg.model.seq_len;
  ctx.searched = searched;
  ctx.top = searched ? r.top : 1;
  ctx.code = r.code;
  // The deck's memory limit is the trainer's: plan within it.
  const double limit_gib = cfg.perf.memory_per_rank_gib;
  const bool deck_limits_memory = limit_gib > 0 && limit_gib < cluster.memory_gib;
  if (deck_limits_memory) {
    ctx.notes.push_back("perf.memory_per_rank_gib = " + number_text(limit_gib) +
                        " of the deck limits memory per device below the cluster file's device.memory_gib = " +
                        number_text(cluster.memory_gib) + ": planned within " + number_text(limit_gib) + " GiB");
    cluster.memory_gib = limit_gib;
  } else if (limit_gib > 0) {
    ctx.notes.push_back("perf.memory_per_rank_gib = " + number_text(limit_gib) +
                        " of the deck is above the cluster file's device.memory_gib = " +
                        number_text(cluster.memory_gib) + ": planned within the device's");
  }
  // Each data-parallel rank takes whole sequences: the batch bounds dp.
  if (searched && cfg.train.global_batch < r.world)
    ctx.notes.push_back("train.global_batch = " + to_string(cfg.train.global_batch) +
                        " caps the data-parallel degree at " + to_string(cfg.train.global_batch) + " of the " +
                        to_string(r.world) +
                        " devices: the rest must come from tp, cp or pp (--set train.global_batch=N plans a larger "
                        "batch)");
  // A GPU's fp32 runs without tensor cores: say what the deck's precision costs here.
  constexpr double kTensorCoreRatio = 4;
  if (precision == Precision::fp32 && cluster.peak_tflops_bf16 >= kTensorCoreRatio * cluster.peak_tflops_fp32)
    ctx.notes.push_back(
        std::string(r.precision.empty() ? "the deck's train.precision = \"fp32\"" : "--precision fp32") +
        " is planned as fp32 on this cluster's devices (" + number_text(cluster.peak_tflops_fp32) +
        " TFLOP/s fp32 against " + number_text(cluster.peak_tflops_bf16) +
        " bf16): --precision bf16 plans bf16 compute (train.precision = \"bf16\")");

  PlanSearch search;
  if (searched) {
    search = search_layouts(cfg, r.world, cluster, precision, r.top, r.code);
    const ModelConfig& m = cfg.model;
    require(search.valid > 0,
            "--world " + to_string(r.world) + ": no layout of " + to_string(r.world) + " devices divides the deck '" +
                r.deck + "' (train.global_batch = " + to_string(cfg.train.global_batch) +
                " over the data-parallel ranks, model.heads = " + to_string(m.heads) +
                " and model.vocab = " + to_string(m.vocab) + " over tp, model.seq_len = " + to_string(m.seq_len) +
                " over 2 cp, model.layers = " + to_string(m.layers) +
                " over the pipeline stages); choose a world size that divides them");
    require(!search.fitting.empty(),  // then every valid layout was evaluated
            "--world " + to_string(r.world) + ": none of the " + to_string(search.valid) +
                " layouts that divide the deck fits " +
                (deck_limits_memory ? "the deck's perf.memory_per_rank_gib" : "device.memory_gib") + " = " +
                number_text(cluster.memory_gib) + " of cluster file '" + cluster.origin +
                "': the smallest needs at least " + bytes_text(search.least_bytes) +
                " per device; use more devices, a smaller train.global_batch or a smaller model");
  } else {
    // The deck's own degrees must make the world: plan's advice, not train's ("launch N ranks").
    const ParallelConfig& p = cfg.parallel;
    const long long product = 1LL * p.pp * p.dp_replicate * p.dp_shard * p.cp * p.tp;
    require(p.pp < 1 || p.dp_replicate < 1 || p.dp_shard < 1 || p.cp < 1 || p.tp < 1 || product == r.world,
            "--world " + to_string(r.world) + ": the deck's degrees (parallel.pp=" + to_string(p.pp) +
                " x dp_replicate=" + to_string(p.dp_replicate) + " x dp_shard=" + to_string(p.dp_shard) +
                " x cp=" + to_string(p.cp) + " x tp=" + to_string(p.tp) + ") make " + to_string(product) + " device" +
                (product == 1 ? "" : "s") + "; set them with --set parallel.<axis>=N to make " + to_string(r.world) +
                ", or add --search to rank every layout of " + to_string(r.world) + " devices");
    RunLayout layout = resolve_layout(cfg, r.world);
    StepPrediction prediction = predict_step(cfg, layout, cluster, precision, r.code);
    search.considered = search.valid = 1;
    search.fitting.push_back({cfg, std::move(layout), std::move(prediction)});
  }
  ctx.cluster = cluster;
  launch_note(ctx, search.fitting.front());
  return r.json ? plan_json(ctx, search) : plan_text(ctx, search);
}

}  // namespace ndmini
