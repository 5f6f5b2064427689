// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The model on one rank, split. StageRuntime runs the chunks of one
// pipeline stage; GptModel (model/gpt.hpp) computes them. The runtime owns
// how they are split over the ranks. It holds the parameter store (FSDP
// shards or replicas) and executes each chunk's unit events, FSDP's scopes
// around every unit's compute (parallel/unit_events.hpp). It keeps the
// activation record of every (chunk, micro-batch) in flight. It finalises
// the gradients across FSDP, data parallelism, tensor parallelism and the
// tied embedding of the pipeline's two ends.
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "core/types.hpp"
#include "model/gpt.hpp"
#include "parallel/param_store.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/pipeline/tied_embedding.hpp"
#include "parallel/unit_events.hpp"

namespace ndmini {

// The groups this rank's model is split over (from ParallelContext) and the
// chunks its pipeline stage runs (from the run's StagePlan); all null and no
// chunks: one rank holding the whole model.
struct ModelParallel {
  Communicator* tp = nullptr;
  bool sequence_parallel = false;
  Communicator* cp = nullptr;
  DataParallelGroups data;                 // FSDP and data-parallel groups
  Communicator* tied_embedding = nullptr;  // first and last pipeline stage (pp > 1)
  std::vector<Chunk> chunks;               // empty: one chunk of every layer, the embedding and the head
  // MoE blocks: the expert group their routed experts split over (null: ep =
  // 1) and train.moe_max_load, the bound of an expert's rows.
  Communicator* experts = nullptr;
  double moe_max_load = 0;
  double moe_z_loss = 0, moe_seq_aux = 0;  // train.moe_z_loss, train.moe_seq_aux: the auxiliary losses
};

class StageRuntime {
 public:
  // precision bf16: mixed precision (a bf16 working copy of the parameters,
  // bf16 operands of every matrix product; ParamStore, GptModel).
  StageRuntime(const ModelConfig& m, int micro_batch, const ModelParallel& par = {},
               Recompute recompute = Recompute::none, Precision precision = Precision::fp32);
  ~StageRuntime();
  StageRuntime(const StageRuntime&) = delete;
  StageRuntime& operator=(const StageRuntime&) = delete;

  const ModelConfig& config() const { return model_.config(); }
  const std::vector<Chunk>& chunks() const { return model_.chunks(); }
  ParamStore& store() { return *store_; }
  const ParamStore& store() const { return *store_; }
  const std::vector<ParamInfo>& params() const { return store_->layout().params; }
  // This rank's persistent parameters and gradients: the whole flat buffer
  // when unsharded (indexed by ParamInfo::offset), else its FSDP shard.
  View1D param_buffer() const { return store_->shard_params(); }
  View1D grad_buffer() const { return store_->shard_grads(); }
  // Which tokens of each sequence this rank holds (context parallelism).
  const CpLayout& cp_layout() const { return model_.cp_layout(); }

  // Deterministic init (gpt_init_param): every layout builds the same global model.
  void init(std::uint64_t seed);

  // ---- one micro-batch through one chunk (the pipeline's actions) ----
  // Rows: tokens and targets hold micro_batch x seq_len / cp tokens (this cp
  // rank's chunks of each sequence, sequence-major); activations between
  // chunks hold activation_elements() floats (the residual rows this rank
  // holds: a sequence-parallel slice with SP).
  std::size_t activation_elements() const { return model_.activation_elements(); }
  // Where the previous stage's output goes before forward() of a chunk that
  // is not the first (the record of (chunk, micro_batch) is created here).
  real* input_buffer(int chunk, int micro_batch);
  // The forward of `micro_batch` through `chunk`. The first chunk embeds
  // `tokens`; the head chunk computes the loss of `targets` and at once its
  // own backward (its gradients are ADDED, scaled by loss_scale), and
  // returns the sum of the micro-batch's per-token losses (0 elsewhere).
  // `last_micro_batch`: no further micro-batch runs through this chunk in
  // this step (data parallelism may start reducing).
  double forward(int chunk, int micro_batch, ConstTokenView tokens, ConstTokenView targets, real loss_scale,
                 bool last_micro_batch);
  // The output of a forward (not the head chunk): what the next stage receives.
  const real* output(int chunk, int micro_batch);
  // Where the next stage's gradient of that output goes before backward().
  real* output_grad_buffer(int chunk, int micro_batch);
  // The backward of `micro_batch` through `chunk`: gradients ADDED; the
  // gradient of the chunk's input written to `input_grad` (not the first
  // chunk; activation_elements() floats). The micro-batch's record is freed.
  void backward(int chunk, int micro_batch, real* input_grad, bool last_micro_batch);
  // Evaluation (forward only, loss_scale 0): frees the record of a forward
  // that has no backward; after the last, end_evaluation() drops every unit
  // FSDP still holds gathered (reshard_after_forward = false keeps them).
  // Gradients are never touched.
  void discard(int chunk, int micro_batch) { free_record(chunk, micro_batch); }
  void end_evaluation();
  // After the step's last backward: completes every gradient reduction
  // (FSDP, data parallel, sequence-parallel partial sums, the tied wte).
  void finish_grads();
  // Whether this stage's copy of the tied wte equals the other pipeline
  // end's, bit for bit. Collective over the tied pair; true on other ranks.
  bool tied_wte_identical();

  // ---- one rank holding the whole model (tests, evaluation) ----
  // Forward and backward of one micro-batch; returns the loss sum.
  double forward_backward(ConstTokenView tokens, ConstTokenView targets, real loss_scale, bool last_micro_batch = true);
  // Forward only: the sum of per-token losses.
  double forward_loss(ConstTokenView tokens, ConstTokenView targets);

  // The most bytes of activations held at once so far (records in flight).
  std::size_t peak_activation_bytes() const { return peak_activation_bytes_; }
  // With recompute = block: milliseconds spent re-running block forwards
  // since the last call (fenced, so the figure is the kernels' own time).
  double take_recompute_ms() { return std::exchange(recompute_ms_, 0.0); }
  // The rows this rank's MoE blocks routed to each expert in the training
  // forwards since the last call: [layer E + expert] over every layer of the
  // model (zero for dense blocks and other stages' blocks); empty without MoE.
  std::vector<std::int64_t> take_routed_rows();
  // The MoE auxiliary losses' sums of those forwards, before their
  // coefficients (MoeRouteStats): z-loss over the rows, the sequence-wise
  // balance loss over the sequences.
  struct AuxSums {
    double z_loss = 0, seq_aux = 0;
  };
  AuxSums take_aux_sums() { return std::exchange(aux_sums_, AuxSums{}); }

  // What one record of `chunk` holds: record() allocates it, record_bytes() counts it.
  struct RecordContents {
    std::size_t activation_floats;  // the chunk's input, and as many for the gradient of its output
    std::size_t tokens;             // the first chunk's token ids (its embedding backward needs them); 0 elsewhere
    int layers;                     // one block's activations each
    bool output_only;               // recompute = block: of each block only its output
  };
  static RecordContents record_contents(const Chunk& chunk, const BlockSizes& block, Recompute recompute);
  // Blocks of their layer's kind (dense or MoE), or all alike: `block`.
  static std::size_t record_bytes(const Chunk& chunk, const LayerSizes& blocks, Recompute recompute);
  static std::size_t record_bytes(const Chunk& chunk, const BlockSizes& block, Recompute recompute);
  // recompute = block: the one block's activations of each kind the stage
  // holds, shared by its blocks (their bytes: scratch).
  static std::size_t recomputed_bytes(const ModelConfig& m, const std::vector<Chunk>& chunks, const LayerSizes& blocks);

  // Tests: every unit event executed from now on is appended to `log`
  // (null: none). The memory estimate replays the same list.
  void record_unit_events(std::vector<UnitEvent>* log) { event_log_ = log; }
  // Tests: the MoE blocks' routing recorded or replayed (layers/moe_routing.hpp);
  // whoever feeds a forward names its tokens in log->next first.
  void set_moe_routing_log(MoeRoutingLog* log) {
    moe_log_ = log;
    model_.set_moe_routing_log(log);
  }
  MoeRoutingLog* moe_routing_log() const { return moe_log_; }

 private:
  // What one micro-batch keeps between the forward and the backward of one chunk.
  struct Record {
    View1D input;                          // the chunk's input: embedding output or received activations
    View1D grad;                           // d(output): received, or computed by the head's loss
    TokenView tokens;                      // first chunk: the embedding backward needs them
    std::vector<BlockActivations> layers;  // per block (only the outputs with recomputation)
    real loss_scale = 0;                   // the forward's: the backward's MoE auxiliary losses use it
    std::size_t bytes = 0;
  };
  int local_chunk(int chunk) const;
  Record& record(int chunk, int micro_batch);       // found or made (a forward's start)
  Record& find_record(int chunk, int micro_batch);  // must exist (after its forward)
  void free_record(int chunk, int micro_batch);
  void count_routed(int layer, const MoeRouteStats& routed);  // a training forward's, into routed_rows_
  // Runs `events`: the FSDP ones on the store, the compute ones by
  // `compute(event)`, each part of the chunk in its profile region.
  template <class Compute>
  void execute(const std::vector<UnitEvent>& events, int first_layer, bool last_micro_batch, Compute&& compute);

  GptModel model_;
  MoeRoutingLog* moe_log_ = nullptr;
  Recompute recompute_ = Recompute::none;
  std::unique_ptr<ParamStore> store_;
  TiedEmbedding tied_;  // the two copies of wte (pp > 1)
  UnitId wte_unit_;     // this stage's wte unit, if it holds one
  // Per local chunk, built once: a micro-batch's forward (with the head's
  // backward), its forward-only pass (a loss scale of 0), its backward.
  struct ChunkEvents {
    std::vector<UnitEvent> forward, evaluation, backward;
  };
  std::vector<ChunkEvents> events_;
  std::vector<UnitEvent> end_of_evaluation_;
  std::vector<UnitEvent>* event_log_ = nullptr;
  std::map<std::pair<int, int>, Record> records_;  // (local chunk, micro-batch) in flight
  std::vector<std::vector<Record>> spare_;         // freed records per local chunk, reused
  // recompute = block: one block's activations of each kind (dense, MoE).
  BlockActivations recomputed_, recomputed_moe_;
  BlockActivations& recomputed(int layer) { return config().moe_block(layer) ? recomputed_moe_ : recomputed_; }
  std::vector<std::int64_t> routed_rows_;  // take_routed_rows()
  AuxSums aux_sums_;                       // take_aux_sums()
  std::size_t activation_bytes_ = 0, peak_activation_bytes_ = 0;
  double recompute_ms_ = 0;
};

}  // namespace ndmini
