// SPDX-License-Identifier: BSD-3-Clause
// The cost model (docs/planner.md): the traffic of every communicator, as
// the layers, FSDP and the pipeline issue it, and the time of each part.
#include "plan/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include "model/gpt.hpp"
#include "model/moe.hpp"
#include "parallel/param_store.hpp"
#include "parallel/stage_runtime.hpp"
#include "run/memory_estimate.hpp"

namespace ndmini {
namespace {

// AdamW per element of the shard: reads parameter, gradient and both
// moments and writes parameter and moments (28 bytes); the gradient norm
// reads the gradient (4) and zeroing it for the next step writes it (4).
constexpr double kOptimizerBytesPerElement = 36;

// The reported groups of ParallelContext::reported(), in its order, and the axes each spans.
struct GroupAxes {
  const char* name;
  AxisSet axes;
};
constexpr AxisSet kAxisSets[kNumAxes] = {{true, false, false, false, false},
                                         {false, true, false, false, false},
                                         {false, false, true, false, false},
                                         {false, false, false, true, false},
                                         {false, false, false, false, true}};
const AxisSet& only(Axis a) { return kAxisSets[static_cast<int>(a)]; }

enum Group { kDpReplicate, kFsdp, kTp, kCp, kPp, kTied, kBatch, kNorm, kGroups };

// One stage's traffic, and with a cluster the time of each collective.
class TrafficCounter {
 public:
  TrafficCounter(const ParallelDims& d, const ClusterSpec* cluster) : cluster_(cluster) {
    const GroupAxes groups[kGroups] = {{"dp_replicate", only(Axis::dp_replicate)},
                                       {"fsdp", kFsdpAxes},
                                       {"tp", only(Axis::tp)},
                                       {"cp", only(Axis::cp)},
                                       {"pp", only(Axis::pp)},
                                       {"tied_wte", only(Axis::pp)},
                                       {"batch", kBatchAxes},
                                       {"norm", kNormAxes}};
    for (int g = 0; g < kGroups; ++g) {
      GroupTraffic& t = traffic_[g];
      t.name = groups[g].name;
      t.size = g == kTied ? 2 : d.span(groups[g].axes);
      t.inter_node = cluster != nullptr && group_spans_nodes(d, groups[g].axes, cluster->devices_per_node);
    }
  }
  // `calls` collectives of `bytes` each (the comm layer's count).
  void add(Group g, Collective kind, std::int64_t calls, double bytes) {
    if (calls <= 0) return;
    GroupTraffic& t = traffic_[g];
    t.calls += calls;
    t.bytes += calls * bytes;
    if (cluster_ == nullptr) return;
    const double bandwidth = link_bandwidth_gbs(*cluster_, kind, t.inter_node) * cluster_->network_efficiency;
    const double latency = t.inter_node ? cluster_->inter_latency_us : cluster_->intra_latency_us;
    t.ms += calls * collective_ms(kind, bytes, t.size, bandwidth, latency);
  }
  GroupTraffic& operator[](Group g) { return traffic_[g]; }
  std::vector<GroupTraffic> groups(const ParallelDims& d) const {
    std::vector<GroupTraffic> out;
    for (int g = 0; g < kGroups; ++g)
      if (g != kTied || d.pp > 1) out.push_back(traffic_[g]);  // tied_wte is a group only with a pipeline
    return out;
  }

 private:
  const ClusterSpec* cluster_;
  GroupTraffic traffic_[kGroups];
};

// Counts what the layers (layers/tensor_parallel.cpp, layers/context_parallel.cpp),
// FSDP, data parallelism, the pipeline and the trainer send in one step of `stage`.
// `half`: bf16 compute, under which FSDP's gathered parameters and every
// activation and activation gradient of tp, SP, cp and pp travel in 2 bytes;
// the cross-entropy's statistics stay 4. Gradient reductions move the wire
// format of comm.reduce_dtype (layers/grad_reduction.hpp). `code`: the
// pipeline's transfers as another code sends them (not a count of ndmini's).
TrafficCounter count_traffic(const Config& cfg, const RunLayout& l, int stage, const ClusterSpec* cluster,
                             bool half = false, const Implementation& code = {}) {
  const ParallelDims& d = l.dims;
  const ModelConfig& m = cfg.model;
  TrafficCounter t(d, cluster);
  const BlockSizes bs = GptModel::block_sizes_of(m, cfg.train.micro_batch, d.tp, d.sequence_parallel, d.cp);
  const double N = static_cast<double>(bs.rows), NC = static_cast<double>(bs.full());
  const double kFloat = sizeof(real);              // an fp32 value (the cross-entropy statistics)
  const double kHalf = half ? 2.0 : sizeof(real);  // an activation, its gradient or a gathered parameter
  const double kGradFloat = cfg.comm.reduce_dtype == Precision::bf16 ? sizeof(bf16) : sizeof(real);  // a gradient's
  const double part = static_cast<double>(bs.attention.kv_part_size());  // one of k, v (kv heads) on this rank
  // What the pipeline sends: bf16 values two to a float slot under bf16.
  const double activation_bytes =
      half ? sizeof(real) * std::ceil(bs.residual() / 2.0) : static_cast<double>(bs.residual()) * sizeof(real);
  const bool tp = d.tp > 1, sp = tp && d.sequence_parallel, cp = d.cp > 1;
  const bool recompute = l.recompute == Recompute::block;
  const int S = l.plan.chunks();
  const std::vector<Chunk> chunks = l.plan.chunks_of(stage);
  const std::vector<PipelineAction> actions = l.schedule.actions(stage);
  // The pipeline's transfers: with scatter/gather each tp rank sends its
  // 1/tp, and the receiver all-gathers the whole activation over tp.
  const bool scatter_gather = code.pp_scatter_gather && tp && !sp;
  const double transfer_bytes = scatter_gather ? activation_bytes / d.tp : activation_bytes;
  auto send = [&] { t.add(kPp, Collective::p2p, 1, transfer_bytes); };
  auto receive = [&] {
    t.add(kPp, Collective::p2p, 1, transfer_bytes);
    if (scatter_gather) t.add(kTp, Collective::all_gather, 1, activation_bytes);
  };

  // One block's forward (twice per micro-batch with recomputation) and backward.
  auto block_tp = [&](std::int64_t blocks) {
    if (!tp) return;
    if (sp) {  // LayerNorm outputs gathered, row-parallel outputs reduce-scattered (backward: their gradients)
      t.add(kTp, Collective::all_gather, 2 * blocks, NC * kHalf);
      t.add(kTp, Collective::reduce_scatter, 2 * blocks, NC * kHalf);
    } else {  // the two row-parallel outputs (forward) or the two input gradients (backward)
      t.add(kTp, Collective::all_reduce, 2 * blocks, NC * kHalf);
    }
  };
  auto block_cp_forward = [&](std::int64_t blocks) {
    if (cp) t.add(kCp, Collective::p2p, blocks * (d.cp - 1), 4 * part * kHalf);  // K/V out and in, cp - 1 times
  };
  auto block_cp_backward = [&](std::int64_t blocks) {
    if (!cp) return;
    // K/V around the ring (4 parts, cp - 1 times), dK/dV after each block
    // (4 parts, cp - 1 times) and their sums home (4): cp + 1 batches.
    const double bytes = 4.0 * (d.cp - 1) * part * kHalf + 4.0 * d.cp * part * kHalf;
    t.add(kCp, Collective::p2p, blocks * (d.cp + 1), bytes / (d.cp + 1));
  };
  for (const PipelineAction& a : actions) {
    const auto it = std::find_if(chunks.begin(), chunks.end(), [&](const Chunk& c) { return c.index == a.chunk; });
    const Chunk& c = *it;
    const std::int64_t blocks = c.layers();
    if (a.kind == PipelineAction::Kind::forward) {
      if (tp && c.embedding)  // the vocabulary-parallel lookup summed over tp
        t.add(kTp, sp ? Collective::reduce_scatter : Collective::all_reduce, 1, NC * kHalf);
      block_tp(blocks);
      block_cp_forward(blocks);
      if (tp && c.head) {
        if (sp) t.add(kTp, Collective::all_gather, 1, NC * kHalf);  // ln_f's output
        t.add(kTp, Collective::all_reduce, 1, N * kFloat);          // the logits' row maxima
        t.add(kTp, Collective::all_reduce, 1, 2 * N * kFloat);      // the softmax sums and target logits
        // The head's backward runs inside the forward: d(ln_f input) summed over tp.
        t.add(kTp, sp ? Collective::reduce_scatter : Collective::all_reduce, 1, NC * kHalf);
      }
      if (c.index > 0) receive();   // the input
      if (c.index < S - 1) send();  // the output
    } else {
      if (recompute) block_tp(blocks);
      block_tp(blocks);
      if (recompute) block_cp_forward(blocks);
      block_cp_backward(blocks);
      if (sp && c.embedding) t.add(kTp, Collective::all_gather, 1, NC * kHalf);  // d(embedding output)
      if (c.index < S - 1) receive();                                            // d(output)
      if (c.index > 0) send();                                                   // d(input)
    }
  }

  // After the last backward (StageRuntime::finish_grads).
  const int fsdp = d.fsdp();
  // The dense model's units: the planner prices an MoE block's experts itself (moe_cost.hpp).
  const ModelConfig dense = dense_base(cfg).model;
  const ParamLayout layout = gpt_param_layout(dense, chunks, d.tp, 0, fsdp);
  if (sp)  // the tp-replicated tensors' gradients are partial sums over tp
    for (const ParamStore::Piece& piece : ParamStore::pieces_of(layout, 0))
      if (layout.params[piece.param].split == TpSplit::replicated)
        t.add(kTp, Collective::all_reduce, 1, static_cast<double>(piece.length) * kGradFloat);
  if (fsdp > 1) {
    const FsdpTraffic f = fsdp_traffic(dense, layout, chunks, actions, cfg.parallel.reshard_after_forward);
    if (f.all_gathers > 0)
      t.add(kFsdp, Collective::all_gather, f.all_gathers, f.all_gather_floats / f.all_gathers * kHalf);
    if (f.reduce_scatters > 0)
      t.add(kFsdp, Collective::reduce_scatter, f.reduce_scatters,
            f.reduce_scatter_floats / f.reduce_scatters * kGradFloat);
  }
  if (d.dp_replicate > 1) {
    if (fsdp > 1)  // HSDP: the reduced shard summed over the replicas
      t.add(kDpReplicate, Collective::all_reduce, 1,
            static_cast<double>(ParamStore::shard_elements(layout)) * kGradFloat);
    else  // one bucket per unit, issued as the last micro-batch's backward finishes it
      t.add(kDpReplicate, Collective::all_reduce, static_cast<std::int64_t>(layout.unit_size.size()),
            static_cast<double>(layout.total) / layout.unit_size.size() * kGradFloat);
  }
  if (d.pp > 1 && m.tie_embeddings)  // untied: wte and lm_head are two tensors, nothing to sum
    for (const ChunkUnits& u : gpt_chunk_units(dense, chunks))
      if (u.wte >= 0)  // the tied embedding's gradients summed over the pipeline's two ends
        t.add(kTied, Collective::all_reduce, 1, static_cast<double>(layout.unit_size[u.wte]) / fsdp * kGradFloat);
  t.add(kBatch, Collective::all_reduce, 1, sizeof(double));  // the step's loss
  t.add(kNorm, Collective::all_reduce, 1, sizeof(double));   // the gradient norm
  return t;
}

// FLOPs of one micro-batch's forward through `c` on one device: the matrix
// products (2 per weight and token; the block's vectors counted alike, as
// in 6N) and attention (4 C T per layer and token: H query heads of hs
// channels, kv_heads or not), split over tp and cp.
double forward_flops(const ModelConfig& m, const Chunk& c, int micro_batch, const ParallelDims& d) {
  const double C = m.channels, T = m.seq_len, V = m.vocab;
  const double tokens = static_cast<double>(micro_batch) * T / d.cp / d.tp;
  double per_token = c.layers() * (2 * static_cast<double>(gpt_block_param_count(m)) + 4 * C * T);
  if (c.head) per_token += 2 * V * C;
  return tokens * per_token;
}

// Of forward_flops, the attention's: 4 C T per layer and token.
double attention_flops(const ModelConfig& m, const Chunk& c, int micro_batch, const ParallelDims& d) {
  const double C = m.channels, T = m.seq_len;
  return static_cast<double>(micro_batch) * T / d.cp / d.tp * c.layers() * 4 * C * T;
}

// The rates of one precision's products on a cluster, FLOPs per ms: each
// shape class's, the fallback's (efficiency.compute) and attention's.
struct ComputeRates {
  double gemm[kGemmClasses];
  double other, attention;
};
ComputeRates compute_rates(const ClusterSpec& cluster, Precision precision) {
  const double peak = cluster.peak_flops(precision) / 1e3;
  ComputeRates r{};
  for (int k = 0; k < kGemmClasses; ++k) r.gemm[k] = peak * cluster.gemm_efficiency(GemmClass(k), precision);
  r.other = peak * cluster.compute_efficiency;
  r.attention = peak * cluster.attention_efficiency;
  return r;
}

// Milliseconds of one micro-batch's forward through `c`: each Linear
// layer's product at the rate of its shape class (the rows N = micro_batch
// x T / cp, its input and output widths under tp; its two backward products
// have the same three dimensions, so the same class), attention at its own
// rate, and the FLOPs of forward_flops that are no product (the biases and
// norms: 2 per vector parameter and token, GPT-2's 26 C per token and
// layer) at efficiency.compute's.
double forward_ms(const ModelConfig& m, const Chunk& c, int micro_batch, const ParallelDims& d,
                  const ComputeRates& rates) {
  const double C = m.channels, T = m.seq_len, V = m.vocab, t = d.tp;
  const double rows = static_cast<double>(micro_batch) * T / d.cp;
  const double layers = c.layers();
  const double qkv = C + 2.0 * m.kv() * m.head_size(), F = m.ffn();  // GPT-2: 3C and 4C
  // The block's vector parameters in multiples of C (GPT-2: 13), so GPT-2's sum keeps its order.
  const double vectors = static_cast<double>(gpt_block_param_count(m) - gpt_block_matrix_param_count(m)) / C;
  struct Linear {
    double count, in, out;
  };
  const Linear linears[] = {{layers, C, qkv / t},                      // c_attn (or c_q, c_k, c_v), column-parallel
                            {layers, C / t, C},                        // attn_proj, row-parallel
                            {(m.gated() ? 2 : 1) * layers, C, F / t},  // c_fc (or c_gate and c_up), column-parallel
                            {layers, F / t, C},                        // mlp_proj, row-parallel
                            {c.head ? 1.0 : 0.0, C, V / t}};           // the LM head, vocabulary-parallel
  double ms =
      attention_flops(m, c, micro_batch, d) / rates.attention + rows * layers * 2 * vectors * C / t / rates.other;
  for (const Linear& l : linears)
    if (l.count > 0)
      ms += l.count * 2 * rows * l.in * l.out / rates.gemm[static_cast<int>(gemm_class(std::min({rows, l.in, l.out})))];
  return ms;
}

// A collective the model hides (wholly or in part) behind compute: of what
// it would hide with full overlap, only the cluster's overlap fraction.
double exposed_with_overlap(double ms, double exposed_at_full_overlap, double overlap) {
  return ms - overlap * (ms - exposed_at_full_overlap);
}

}  // namespace

Config dense_base(const Config& cfg) {
  Config dense = cfg;
  dense.model.moe_experts = 0;
  return dense;
}

PlanMemory plan_memory(const MemoryEstimate& e) {
  PlanMemory p;
  p.params = e.param_bytes;
  p.grads = e.grad_bytes;
  p.optimizer = e.optimizer_bytes;
  p.in_flight = e.in_flight;
  p.activations = e.in_flight * e.activation_bytes_per_micro_batch;
  p.comm_buffers = e.comm_buffer_bytes;
  p.workspace = e.scratch_bytes - e.comm_buffer_bytes;
  return p;
}

bool group_spans_nodes(const ParallelDims& dims, const AxisSet& axes, int devices_per_node) {
  // The group of rank 0: its farthest member is the sum of (degree - 1) x stride over its axes.
  const auto degrees = dims.degrees();
  long long stride = 1, farthest = 0;
  for (int i = kNumAxes - 1; i >= 0; --i) {
    if (axes[i]) farthest += (degrees[i] - 1) * stride;
    stride *= degrees[i];
  }
  return farthest >= devices_per_node;
}

double link_bandwidth_gbs(const ClusterSpec& c, Collective kind, bool inter_node) {
  double own = 0;  // the kind's own key (0: absent)
  switch (kind) {
    case Collective::all_gather:
      own = inter_node ? c.inter_all_gather_gbs : c.intra_all_gather_gbs;
      break;
    case Collective::reduce_scatter:
      own = inter_node ? c.inter_reduce_scatter_gbs : c.intra_reduce_scatter_gbs;
      break;
    case Collective::p2p:
      own = inter_node ? c.inter_p2p_gbs : c.intra_p2p_gbs;
      break;
    case Collective::all_reduce:
      break;
  }
  return own > 0 ? own : (inter_node ? c.inter_bandwidth_gbs : c.intra_bandwidth_gbs);
}

double collective_ms(Collective kind, double bytes, int n, double bandwidth_gbs, double latency_us) {
  // nccl-tests' definitions: a ring all-reduce moves 2 (n-1)/n of the
  // buffer over each link, an all-gather or reduce-scatter (n-1)/n of the
  // gathered size; a tree all-reduce needs 2 log2(n) latencies, the ring 2 (n-1).
  const double beta = bytes / (bandwidth_gbs * 1e9) * 1e3;  // ms for the whole buffer
  const double alpha = latency_us * 1e-3;
  if (kind == Collective::p2p) return beta + alpha;
  if (n <= 1) return 0;
  const double steps = n - 1.0, f = steps / n;
  if (kind == Collective::all_reduce)
    return 2 * f * beta + std::min(2 * steps, 2 * std::ceil(std::log2(static_cast<double>(n)))) * alpha;
  return f * beta + steps * alpha;
}

std::vector<GroupTraffic> traffic_per_step(const Config& cfg, const RunLayout& layout, int stage) {
  return count_traffic(cfg, layout, stage, nullptr, cfg.train.precision == Precision::bf16).groups(layout.dims);
}

double step_ms_lower_bound(const Config& cfg, const RunLayout& l, const ClusterSpec& cluster, Precision precision) {
  const ParallelDims& d = l.dims;
  // The fastest of the products' (any shape class), the rest's and the attention's rates for all FLOPs: a bound.
  double efficiency = std::max(cluster.compute_efficiency, cluster.attention_efficiency);
  for (int k = 0; k < kGemmClasses; ++k)
    efficiency = std::max(efficiency, cluster.gemm_efficiency(GemmClass(k), precision));
  const double rate = cluster.peak_flops(precision) * efficiency / 1e3;  // FLOPs per ms
  // Per micro-batch, summed over the stages.
  double total = 0;
  for (int s = 0; s < d.pp; ++s)
    for (const Chunk& c : l.plan.chunks_of(s)) {
      total += 3 * forward_flops(cfg.model, c, cfg.train.micro_batch, d) / rate;
      if (l.recompute == Recompute::block) {
        Chunk blocks_only = c;
        blocks_only.head = false;
        total += forward_flops(cfg.model, blocks_only, cfg.train.micro_batch, d) / rate;
      }
    }
  // The heaviest stage's m t_max + (sum - t_max) / v is at least this (m >= 1 >= 1/v).
  const double average = total / d.pp;
  const int v = l.schedule.kind() == ScheduleKind::interleaved ? d.virtual_stages : 1;
  return l.micro_batches * average + (d.pp > 1 ? (d.pp - 1.0) / v * average : 0.0);
}

StepPrediction predict_step(const Config& cfg, const RunLayout& l, const ClusterSpec& cluster, Precision precision,
                            const Implementation& code) {
  const ParallelDims& d = l.dims;
  const ModelConfig& m = cfg.model;
  const int B = cfg.train.micro_batch, mb = l.micro_batches;
  const int v = l.schedule.kind() == ScheduleKind::interleaved ? d.virtual_stages : 1;
  const ComputeRates rates = compute_rates(cluster, precision);
  const double memory_rate = cluster.memory_bandwidth_gbs * 1e6;  // the optimizer streams: bytes per ms
  const double kernel_rate = cluster.kernel_bandwidth_gbs * 1e6;  // the memory-bound kernels, likewise
  const double overlap = cluster.overlap_efficiency;
  const BlockSizes bs = GptModel::block_sizes_of(m, B, d.tp, d.sequence_parallel, d.cp);
  // bf16 halves the activations' and the gathered parameters' bytes in the
  // time model; the memory figures follow the allocating code's size functions.
  const bool half = precision == Precision::bf16;
  // Stored attention scores (a code without flash-style attention): each
  // kernel of the unfused attention reads and writes the a/tp heads' (T/cp)
  // x T score tensors in memory (far larger than any cache). Bytes per score
  // element, with e the activations' bytes: the forward 6e + 1 (Q K^T
  // writes the scores; the fused scale-mask-softmax reads them and writes
  // the probabilities; dropout reads those and writes its output and a
  // one-byte mask; the product with V reads the output), the backward
  // 9e + 1 (that product's backward writes the output's gradient and reads
  // the output; dropout's reads the gradient and the mask and writes the
  // probabilities'; the softmax's reads that and the probabilities and
  // writes the scores'; Q K^T's reads it twice, for dQ and for dK), and the
  // forward once more when recomputed.
  const double score_elements_per_layer =
      code.stored_attention_scores
          ? static_cast<double>(B) * m.heads / d.tp * (static_cast<double>(m.seq_len) / d.cp) * m.seq_len
          : 0.0;
  const double e = half ? 2 : sizeof(real);
  const double score_bytes_per_element = (6 * e + 1) + (9 * e + 1) + (l.recompute == Recompute::block ? 6 * e + 1 : 0);

  StepPrediction p;
  const double tokens = static_cast<double>(cfg.train.global_batch) * m.seq_len;
  p.model_flops = model_counts(m).flops_per_token * tokens;  // an MoE model's active parameters
  p.hardware_flops = p.model_flops;
  const std::vector<MemoryEstimate> memory = estimate_memory_per_stage(dense_base(cfg), l);

  // Per stage: the time of one micro-batch through its chunks (compute and
  // what blocks it), and what the step adds once.
  struct StageTime {
    double compute = 0, recompute = 0, kernels = 0, launches = 0, per_micro_batch = 0, once = 0, optimizer = 0;
    std::vector<GroupTraffic> comm;
  };
  std::vector<StageTime> stages(d.pp);
  std::vector<int> moe_blocks(d.pp, 0);
  double every_stage_micro_batch = 0;  // one micro-batch through every stage
  // An MoE block: its MoE part in place of the dense MLP forward_ms counts.
  const MoeBlockCost moe = moe_block_cost(cfg, d, cluster, precision);
  for (int s = 0; s < d.pp; ++s) {
    StageTime& st = stages[s];
    double attention = 0;  // of the compute: what ring attention's K/V exchange hides behind
    for (const Chunk& c : l.plan.chunks_of(s)) {
      st.compute += 3 * forward_ms(m, c, B, d, rates);
      attention += 3 * attention_flops(m, c, B, d) / rates.attention;
      if (l.recompute == Recompute::block) {
        Chunk blocks_only = c;
        blocks_only.head = false;
        st.recompute += forward_ms(m, blocks_only, B, d, rates);
        p.hardware_flops += forward_flops(m, blocks_only, B, d) * mb * d.data_parallel() * d.cp * d.tp;
      }
      double bytes = static_cast<double>(StageRuntime::record_bytes(c, bs, Recompute::none));
      if (c.head)
        bytes += static_cast<double>(GptModel::buffer_sizes(m, B, true, d.tp, d.sequence_parallel, d.cp).logits) *
                 sizeof(real);
      st.kernels += kActivationPasses * bytes * (half ? 0.5 : 1.0) / kernel_rate;
      st.kernels += score_bytes_per_element * score_elements_per_layer * c.layers() / kernel_rate;
      st.launches += kLaunchesPerBlock * c.layers() + (c.embedding ? kLaunchesOfEmbeddingAndHead / 2 : 0) +
                     (c.head ? kLaunchesOfEmbeddingAndHead / 2 : 0) +
                     (l.recompute == Recompute::block ? kLaunchesPerRecomputedBlock * c.layers() : 0);
    }
    for (const Chunk& c : l.plan.chunks_of(s))
      for (int layer = c.first_layer; layer < c.end_layer; ++layer) moe_blocks[s] += m.moe_block(layer) ? 1 : 0;
    // The all-to-alls block the block's compute (dispatch before the
    // experts, combine after): exposed whole, as the "ep" group.
    GroupTraffic ep{"ep", d.ep, moe.inter_node};
    if (moe_blocks[s] > 0) {
      const int nb = moe_blocks[s];
      const double a2a_compute = 4 * moe.a2a_ms;
      st.compute += nb * (moe.forward_ms + moe.backward_ms - a2a_compute - 3 * moe.dense_mlp_ms);
      const bool again = l.recompute == Recompute::block;
      if (again) st.recompute += nb * (moe.forward_ms - 2 * moe.a2a_ms - moe.dense_mlp_ms);
      ep.calls = static_cast<std::int64_t>(mb) * nb * (again ? 6 : 4);
      ep.bytes = static_cast<double>(ep.calls) * moe.a2a_bytes;
      ep.ms = ep.exposed_ms = static_cast<double>(ep.calls) * moe.a2a_ms;
    }
    const double launch_ms = st.launches * cluster.launch_overhead_us * 1e-3;
    TrafficCounter t = count_traffic(cfg, l, s, &cluster, half, code);
    // Blocking collectives inside the compute: tp always; the pipeline's
    // receives (half its transfers; the sends overlap); the ring exchange
    // where it takes longer than the attention it hides behind. What may
    // hide, hides as far as the cluster's overlap fraction lets it.
    t[kTp].exposed_ms = t[kTp].ms;
    t[kPp].exposed_ms = exposed_with_overlap(t[kPp].ms, t[kPp].ms / 2, overlap);
    t[kCp].exposed_ms = exposed_with_overlap(t[kCp].ms, std::max(0.0, t[kCp].ms - attention * mb), overlap);
    st.per_micro_batch = st.compute + st.recompute + st.kernels + launch_ms +
                         (t[kTp].exposed_ms + t[kPp].exposed_ms + t[kCp].exposed_ms + ep.exposed_ms) / mb;
    const double work = mb * (st.compute + st.recompute + st.kernels);
    // FSDP: each unit's all-gather is prefetched behind the unit before it and
    // its reduce-scatter runs behind the units after: exposed is what the
    // compute cannot cover, plus the first unit's gather.
    if (t[kFsdp].calls > 0)
      t[kFsdp].exposed_ms = exposed_with_overlap(
          t[kFsdp].ms, std::min(t[kFsdp].ms, std::max(0.0, t[kFsdp].ms - work) + t[kFsdp].ms / t[kFsdp].calls),
          overlap);
    // Data parallelism: buckets start as the last micro-batch's backward
    // finishes each unit; HSDP's shard all-reduce follows FSDP's reductions.
    if (t[kDpReplicate].calls > 0) {
      const double last_backward = 2.0 / 3 * (st.compute + st.kernels) + st.recompute;
      t[kDpReplicate].exposed_ms =
          d.fsdp() > 1
              ? t[kDpReplicate].ms
              : exposed_with_overlap(
                    t[kDpReplicate].ms,
                    std::max(t[kDpReplicate].ms / t[kDpReplicate].calls, t[kDpReplicate].ms - last_backward), overlap);
    }
    for (Group g : {kTied, kBatch, kNorm}) t[g].exposed_ms = t[g].ms;
    st.comm = t.groups(d);
    for (const GroupTraffic& g : st.comm)
      if (g.name != "tp" && g.name != "pp" && g.name != "cp") st.once += g.exposed_ms;
    if (ep.calls > 0) st.comm.push_back(ep);
    // The shard's elements: the fp32 gradients (the parameters also hold bf16 working copies).
    const double moe_elements = moe_blocks[s] * (moe.shard_elements - moe.dense_mlp_shard_elements);
    st.optimizer = kOptimizerBytesPerElement * (memory[s].grad_bytes / sizeof(real) + moe_elements) / memory_rate;
    st.once += st.optimizer;
    every_stage_micro_batch += st.per_micro_batch;
  }
  // The pipeline's idle time on stage s: the first micro-batch's forward
  // through the stages before it and the last one's backward through them,
  // and both ways through the stages after it, so one micro-batch through
  // every other stage, shortened v times by interleaving (GPipe and 1F1B
  // alike). With equal stages, the (pp - 1) / v micro-batch times of the
  // schedules' bubble fraction (p-1)/(v m); with a stage heavier than the
  // rest (the LM head's), less than (pp - 1) of its own.
  for (int s = 0; s < d.pp; ++s) {
    const double bubble = (every_stage_micro_batch - stages[s].per_micro_batch) / v;
    const double ms = mb * stages[s].per_micro_batch + stages[s].once + bubble;
    if (s == 0 || ms > p.step_ms) {
      p.step_ms = ms;
      p.stage = s;
      p.bubble_ms = bubble;
    }
  }
  const StageTime& st = stages[p.stage];
  p.compute_ms = mb * st.compute;
  p.recompute_ms = mb * st.recompute;
  p.kernels_ms = mb * st.kernels;
  p.optimizer_ms = st.optimizer;
  p.launches = mb * st.launches;
  p.launch_ms = p.launches * cluster.launch_overhead_us * 1e-3;
  p.comm = st.comm;
  for (const GroupTraffic& g : p.comm) p.exposed_comm_ms += g.exposed_ms;
  p.tokens_per_s = tokens / (p.step_ms / 1e3);
  p.mfu = p.model_flops / (p.step_ms / 1e3) / (d.size() * cluster.peak_flops(precision));
  const MemoryEstimate busiest = estimate_memory(dense_base(cfg), l);
  p.memory = plan_memory(busiest);
  p.moe_blocks = moe_blocks[p.stage];
  p.moe = moe;
  if (m.moe()) {
    // The estimate holds a dense MLP in each MoE block: its MoE part's state
    // instead, per element as the estimate counts it, on the stage with the most MoE blocks.
    const int most = *std::max_element(moe_blocks.begin(), moe_blocks.end());
    const double shard = static_cast<double>(busiest.grad_bytes) / sizeof(real);
    const double delta = most * (moe.shard_elements - moe.dense_mlp_shard_elements);
    if (shard > 0) {
      p.memory.params += static_cast<std::int64_t>(delta * static_cast<double>(busiest.param_bytes) / shard);
      p.memory.optimizer += static_cast<std::int64_t>(delta * static_cast<double>(busiest.optimizer_bytes) / shard);
    }
    p.memory.grads += static_cast<std::int64_t>(delta * sizeof(real));
  }
  p.fits = static_cast<double>(p.memory.total()) <= cluster.memory_bytes();
  return p;
}

}  // namespace ndmini
