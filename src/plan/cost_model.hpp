// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The cost model of one layout (docs/planner.md has the equations). It gives
// memory per device by category, FLOPs, bytes per communicator and the
// predicted time of each part of an optimizer step on a cluster
// (plan/cluster.hpp).
//
// Sizes are not modelled here: memory comes from the estimate the trainer
// refuses decks with (run/layout.hpp, built from each buffer owner's size
// function), the bytes of each communicator from the shapes the layers, FSDP
// (its own replay) and the pipeline send, as the comm layer counts them
// (comm/communicator.hpp). Only times are a model.
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "plan/cluster.hpp"
#include "plan/moe_cost.hpp"
#include "run/layout.hpp"
#include "run/memory_estimate.hpp"

namespace ndmini {

// Memory-bound kernels (LayerNorm, GELU, softmax, residual adds, the loss)
// move each activation byte about this many times per micro-batch: written
// in the forward, read and its gradient written in the backward.
inline constexpr double kActivationPasses = 3;

// Kernel launches of one micro-batch's forward and backward, counted with a
// Kokkos Tools kernel counter on tiny.toml (docs/planner.md, "Launch
// overhead"): per block, 103 Kokkos kernels and its 12 matrix products; the
// embedding and the head together about 10; recomputation runs a block's
// forward, a third of its launches, again.
inline constexpr double kLaunchesPerBlock = 115;
inline constexpr double kLaunchesOfEmbeddingAndHead = 10;
inline constexpr double kLaunchesPerRecomputedBlock = kLaunchesPerBlock / 3;
// A typical cost of one launch on a GPU (CUDA's launch and its share of the
// synchronisation), for the warning where the cluster file does not say.
inline constexpr double kTypicalLaunchOverheadUs = 5;

// Where the code whose run is predicted differs from ndmini in ways the
// step time depends on. The defaults are ndmini's own; `ndmini plan
// --stored-attention-scores --pp-scatter-gather` describes the Megatron-LM
// of the published runs bench/planner_vs_published.py predicts. They change
// the time only: memory stays ndmini's own estimate.
struct Implementation {
  // Attention runs as separate kernels (the products, a fused
  // scale-mask-softmax, dropout) that each read or write the s x s score
  // tensors in memory; it keeps the softmax, its dropout mask and the
  // dropout's output (Korthikanti et al. 2022, Table 2: 5 a s^2 b / tp bytes
  // per layer and micro-batch in 16-bit training). predict_step counts the
  // traffic kernel by kernel. ndmini's flash-style attention keeps no s x s
  // tensor.
  bool stored_attention_scores = false;
  // Without sequence parallelism, each tp rank sends 1/tp of a pipeline
  // transfer and the receiving stage all-gathers it over tp (Megatron-LM's
  // scatter/gather); ndmini's tp ranks each send the whole activation.
  bool pp_scatter_gather = false;
};

// Bytes per device of one pipeline stage, by category; total() is the
// estimate that `train` and `check` refuse a deck by (the busiest stage's).
struct PlanMemory {
  std::int64_t params = 0, grads = 0, optimizer = 0;  // this rank's shards (AdamW: two moments)
  std::int64_t activations = 0;                       // records of the micro-batches in flight
  std::int64_t in_flight = 0;                         // how many micro-batch records (summed over chunks)
  std::int64_t comm_buffers = 0;                      // FSDP's gathered units and gradients, pipeline sends
  std::int64_t workspace = 0;                         // the layers' and the head's buffers, feeds, recompute
  std::int64_t total() const { return params + grads + optimizer + activations + comm_buffers + workspace; }
};
PlanMemory plan_memory(const MemoryEstimate& e);
// The deck whose memory estimate the planner starts from: `cfg` with each
// MoE block's MLP dense (a trained MoE deck's estimate holds every expert in
// its block's unit); the planner prices the MoE part itself (moe_cost.hpp:
// the experts sharded over the expert fsdp group).
Config dense_base(const Config& cfg);

// One communicator's traffic in one optimizer step on one rank, as the comm
// layer counts it (calls, and bytes: the full buffer for all-reduce, the
// gathered size for all-gather and reduce-scatter, sends plus receives for
// point-to-point), and its predicted time.
struct GroupTraffic {
  std::string name;  // as the trainer reports it: dp_replicate, fsdp, tp, cp, pp, tied_wte, batch, norm
  int size = 1;
  bool inter_node = false;  // its group spans nodes of the cluster
  std::int64_t calls = 0;
  double bytes = 0;
  double ms = 0;          // predicted time of all its collectives
  double exposed_ms = 0;  // of which not hidden behind compute
};

// The traffic of a rank of pipeline stage `stage` (its first rank: tp,
// cp and FSDP rank 0) per step, one entry per reported group in the
// trainer's order. Exact: the comm layer's counts of a training step.
std::vector<GroupTraffic> traffic_per_step(const Config& cfg, const RunLayout& layout, int stage);

struct StepPrediction {
  int stage = 0;              // the slowest pipeline stage: the figures below are its
  PlanMemory memory;          // the busiest stage's
  double model_flops = 0;     // per step, whole job: FLOPs per token x tokens (what MFU counts)
  double hardware_flops = 0;  // also the forwards recomputation runs again
  std::vector<GroupTraffic> comm;
  // Milliseconds per step.
  // Matrix products: each Linear layer's FLOPs / (peak x its shape class's
  // efficiency), attention's / (peak x efficiency.attention), the rest's /
  // (peak x efficiency.compute); recompute excluded.
  double compute_ms = 0;
  double recompute_ms = 0;  // the forwards recompute = block runs again
  double kernels_ms = 0;    // memory-bound kernels: kActivationPasses x activation bytes / kernel bandwidth
  double bubble_ms = 0;     // the pipeline's idle time: a micro-batch through every other stage, / v
  double optimizer_ms = 0;  // AdamW and the gradient norm: bytes / memory bandwidth
  // Kernel launches of the slowest stage per step, and their cost beyond
  // the work (device.launch_overhead_us; 0 when the file has no such key).
  double launches = 0;
  double launch_ms = 0;
  double exposed_comm_ms = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs per second over the devices' dense peak
  bool fits = false;
  // Mixture-of-Experts: the MoE blocks of the slowest stage and the cost of
  // one (plan/moe_cost.hpp); its all-to-alls are the "ep" group of comm.
  int moe_blocks = 0;
  MoeBlockCost moe;
};

// `precision`: the matrix products' (peak, activation and gather bytes
// follow it once bf16 training exists; fp32 today).
StepPrediction predict_step(const Config& cfg, const RunLayout& layout, const ClusterSpec& cluster,
                            Precision precision = Precision::fp32, const Implementation& implementation = {});

// A bound no predict_step of the layout falls below, cheap to compute (no
// replay, no memory): the average stage's compute and recomputation per
// micro-batch times the micro-batches, plus the bubble of that average.
double step_ms_lower_bound(const Config& cfg, const RunLayout& layout, const ClusterSpec& cluster,
                           Precision precision = Precision::fp32);

// Which groups of the mesh span nodes when `devices_per_node` consecutive
// ranks share a node (tp innermost: the mesh order of mesh/dims.hpp).
bool group_spans_nodes(const ParallelDims& dims, const AxisSet& axes, int devices_per_node);

// Predicted time of one collective of `bytes` (the comm layer's count)
// over `n` ranks on links of `bandwidth_gbs` and `latency_us` (per message).
enum class Collective { all_reduce, all_gather, reduce_scatter, p2p };
double collective_ms(Collective kind, double bytes, int n, double bandwidth_gbs, double latency_us);
// The bus bandwidth of `kind` on one link of `cluster` (inside a node or
// between nodes): its own key where the file has one, else the all-reduce's.
double link_bandwidth_gbs(const ClusterSpec& cluster, Collective kind, bool inter_node);

}  // namespace ndmini
