// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// GPT-2 (docs/model.md) as a stack of pipeline chunks: an embedding unit, the
// transformer blocks, a head unit (final LayerNorm, the LM head tied to wte,
// the loss). One rank runs the chunks its pipeline stage holds
// (parallel/pipeline/schedule.hpp); for each chunk it runs the forward or the
// backward of one micro-batch at a time, keeping the activations of every
// micro-batch in flight until its backward.
//
// This file says WHAT is computed. How it is split lives in src/parallel/:
// tensor and sequence parallelism (tensor_parallel.hpp), context-parallel
// attention (context_parallel.hpp), FSDP and data-parallel gradient
// reduction (param_store.hpp), the pipeline's stages, schedules and tied
// embedding (pipeline/). The model calls them; it issues no collective itself.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "core/types.hpp"
#include "mesh/dims.hpp"
#include "model/block.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/param_layout.hpp"
#include "parallel/param_store.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/pipeline/tied_embedding.hpp"
#include "parallel/tensor_parallel.hpp"

namespace ndmini {

// ---- sizes and rules (no allocation) ----------------------------------------

// All parameters, and N for MFU: all but wpe (the LM head is tied to wte).
std::int64_t gpt_param_count(const ModelConfig& m);
std::int64_t gpt_flops_param_count(const ModelConfig& m);
// Model FLOPs per trained token: 6N + 12 L C T (forward and backward).
double gpt_flops_per_token(const ModelConfig& m);

// The model's rules for a split over the mesh (mesh/dims.hpp): tp divides the heads, 4C and the vocabulary;
// 2 cp divides seq_len; with sequence parallelism tp divides seq_len / cp.
// Throws Error naming the key and the fix.
void check_model_split(const ModelConfig& m, const ParallelDims& split);

// The global tensors of the model, in checkpoint order: names and shapes.
struct GlobalTensor {
  std::string name;
  std::vector<std::int64_t> shape;
};
std::vector<GlobalTensor> gpt_global_tensors(const ModelConfig& m);

// Parameter layout of the chunks one pipeline stage holds, for tp rank
// `tp_rank` of `tp`; every tensor starts on a 64-byte boundary and every
// unit is padded to split into `shards` equal FSDP shards.
// Units, per chunk in order: wte (a unit of its own, so the embedding's and
// the head's copies shard alike), wpe (embedding chunk), one per block,
// ln_f (head chunk).
ParamLayout gpt_param_layout(const ModelConfig& m, const std::vector<Chunk>& chunks, int tp = 1, int tp_rank = 0,
                             int shards = 1);

// Bytes per rank, from the same sizes the model allocates: parameters,
// gradients and AdamW state; the activations one micro-batch keeps in one
// chunk (the largest chunk of the stage); and scratch. `in_flight` is the
// most (micro-batch, chunk) records the schedule keeps at once on the stage.
struct MemoryEstimate {
  std::int64_t state_bytes = 0;
  std::int64_t activation_bytes_per_micro_batch = 0;
  std::int64_t in_flight = 0;
  std::int64_t scratch_bytes = 0;
  std::int64_t total() const { return state_bytes + in_flight * activation_bytes_per_micro_batch + scratch_bytes; }
};
MemoryEstimate gpt_memory_estimate(const ModelConfig& m, const ParallelDims& split, int micro_batch,
                                   const std::vector<Chunk>& chunks, int in_flight, Recompute recompute);

// ---- the model on one rank ----------------------------------------------------

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
};

class GptStage {
 public:
  GptStage(const ModelConfig& m, int micro_batch, const ModelParallel& par = {}, Recompute recompute = Recompute::none);
  ~GptStage();
  GptStage(const GptStage&) = delete;
  GptStage& operator=(const GptStage&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  ParamStore& store() { return *store_; }
  const ParamStore& store() const { return *store_; }
  const std::vector<ParamInfo>& params() const { return store_->layout().params; }
  // This rank's persistent parameters and gradients: the whole flat buffer
  // when unsharded (indexed by ParamInfo::offset), else its FSDP shard.
  View1D param_buffer() const { return store_->shard_params(); }
  View1D grad_buffer() const { return store_->shard_grads(); }
  // Which tokens of each sequence this rank holds (context parallelism).
  const CpLayout& cp_layout() const { return attention_.layout(); }

  // Deterministic init: global element i of parameter `name` is drawn from
  // the counter-based RNG at (seed, name, i), so every layout builds the
  // same global model.
  void init(std::uint64_t seed);

  // ---- one micro-batch through one chunk (the pipeline's actions) ----
  // Rows: tokens and targets hold micro_batch x seq_len / cp tokens (this cp
  // rank's chunks of each sequence, sequence-major); activations between
  // chunks hold activation_elements() floats (the residual rows this rank
  // holds: a sequence-parallel slice with SP).
  std::size_t activation_elements() const;
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

 private:
  // The units of one chunk (-1: not in this chunk).
  struct ChunkUnits {
    int wte = -1, wpe = -1, ln_f = -1;
    std::vector<int> blocks;
  };
  // What one micro-batch keeps between the forward and the backward of one chunk.
  struct Record {
    View1D input;                          // the chunk's input: embedding output or received activations
    View1D grad;                           // d(output): received, or computed by the head's loss
    TokenView tokens;                      // first chunk: the embedding backward needs them
    std::vector<BlockActivations> layers;  // per block (only the outputs with recomputation)
    std::size_t bytes = 0;
  };
  int local_chunk(int chunk) const;
  Record& record(int chunk, int micro_batch);       // found or made (a forward's start)
  Record& find_record(int chunk, int micro_batch);  // must exist (after its forward)
  void free_record(int chunk, int micro_batch);
  BlockTensors block_params(int unit) { return block_layout_.view(store_->params(unit)); }
  BlockTensors block_grads(int unit) { return block_layout_.view(store_->grads(unit)); }
  Slice2D wte(real* unit_base) const;
  // The head: final LayerNorm, tied LM head, loss; with grad_scale != 0 also
  // its backward, writing d(x) into dx. Returns the loss sum.
  double head(ConstSlice2D x, ConstTokenView targets, real grad_scale, const ChunkUnits& u, Slice2D dx,
              bool last_micro_batch, bool owns_wte);

  ModelConfig cfg_;
  int micro_batch_ = 1;
  Recompute recompute_ = Recompute::none;
  std::vector<Chunk> chunks_;
  std::vector<ChunkUnits> units_;
  std::unique_ptr<ParamStore> store_;
  TiedEmbedding tied_;               // the two copies of wte (pp > 1)
  int wte_unit_ = -1;                // this stage's wte unit, if it holds one
  std::size_t lnf_bias_offset_ = 0;  // ln_f/bias in its unit (ln_f/weight starts it)
  TensorParallel tp_;
  kernels::AttentionShape attention_shape_;  // this rank's part: its tokens, its heads
  ContextParallelAttention attention_;
  TransformerBlock block_;
  BlockLayout block_layout_;
  TokenView positions_;                            // absolute position of each residual row
  std::map<std::pair<int, int>, Record> records_;  // (local chunk, micro-batch) in flight
  std::vector<std::vector<Record>> spare_;         // freed records per local chunk, reused
  BlockActivations recomputed_;                    // recompute = block: one block's activations
  View1D lnf_, lnf_mean_, lnf_rstd_, logits_, losses_, dln_;
  std::size_t activation_bytes_ = 0, peak_activation_bytes_ = 0;
  double recompute_ms_ = 0;
};

}  // namespace ndmini
