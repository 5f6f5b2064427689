// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The input deck: TOML text -> validated structs. Every key is optional except
// the model's; unknown keys are refused with the nearest valid key suggested.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/bf16.hpp"

namespace ndmini {

// ---- the deck's enumerated values, parsed once here; each has one name table,
// used both to parse the deck and to print the value.

template <class E>
struct EnumName {
  E value;
  const char* name;
  bool in_deck = true;  // false: a value the code derives, never written in a deck
};

// The name of `value` in `table` ("?" if it has none).
template <class E, std::size_t N>
constexpr const char* name_in(const EnumName<E> (&table)[N], E value) {
  for (const auto& e : table)
    if (e.value == value) return e.name;
  return "?";
}

// Pipeline schedule (parallel/pipeline/schedule.hpp); none: pp = 1.
enum class ScheduleKind { none, gpipe, one_f_one_b, interleaved };
inline constexpr EnumName<ScheduleKind> kScheduleNames[] = {{ScheduleKind::one_f_one_b, "1f1b"},
                                                            {ScheduleKind::gpipe, "gpipe"},
                                                            {ScheduleKind::interleaved, "interleaved_1f1b"},
                                                            {ScheduleKind::none, "none", false}};
// Activation recomputation: block recomputes each block's forward in its backward.
enum class Recompute { none, block };
inline constexpr EnumName<Recompute> kRecomputeNames[] = {{Recompute::none, "none"}, {Recompute::block, "block"}};
// Precision: core/bf16.hpp.
inline constexpr EnumName<Precision> kPrecisionNames[] = {{Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}};
// The library of the host's fp32 matrix products (kernels/gemm_library.hpp):
// auto, by timing at start-up; blas or onednn forced.
enum class GemmRoute { automatic, blas, onednn };
inline constexpr EnumName<GemmRoute> kGemmRouteNames[] = {
    {GemmRoute::automatic, "auto"}, {GemmRoute::blas, "blas"}, {GemmRoute::onednn, "onednn"}};
// Fault injection (fault/fault.hpp).
enum class FaultKind { none, kill, nan, enospc, skip_collective };
inline constexpr EnumName<FaultKind> kFaultKindNames[] = {{FaultKind::none, "none"},
                                                          {FaultKind::kill, "kill"},
                                                          {FaultKind::nan, "nan"},
                                                          {FaultKind::enospc, "enospc"},
                                                          {FaultKind::skip_collective, "skip_collective"}};
// The phases of a checkpoint save, in order (io/checkpoint.hpp): the deck's
// fault.phase and the words of the save's error messages.
enum class SavePhase { create, write, close, rename, latest };
inline constexpr EnumName<SavePhase> kSavePhaseNames[] = {{SavePhase::create, "create"},
                                                          {SavePhase::write, "write"},
                                                          {SavePhase::close, "close"},
                                                          {SavePhase::rename, "rename"},
                                                          {SavePhase::latest, "latest"}};

// The model's architecture (docs/model.md). model.family sets the defaults of
// the keys below in one line: gpt2 (LayerNorm, learned positions, GELU MLP,
// biases, tied head) or llama (RMSNorm, RoPE, SwiGLU, no biases, untied head).
enum class ModelFamily { gpt2, llama };
inline constexpr EnumName<ModelFamily> kModelFamilyNames[] = {{ModelFamily::gpt2, "gpt2"},
                                                              {ModelFamily::llama, "llama"}};
enum class NormKind { layernorm, rmsnorm };
inline constexpr EnumName<NormKind> kNormNames[] = {{NormKind::layernorm, "layernorm"}, {NormKind::rmsnorm, "rmsnorm"}};
enum class PositionKind { learned, rope };
inline constexpr EnumName<PositionKind> kPositionNames[] = {{PositionKind::learned, "learned"},
                                                            {PositionKind::rope, "rope"}};
enum class MlpKind { gelu, swiglu };
inline constexpr EnumName<MlpKind> kMlpNames[] = {{MlpKind::gelu, "gelu"}, {MlpKind::swiglu, "swiglu"}};
// Mixture-of-Experts routing (docs/model.md, "Mixture-of-Experts"): the
// scores (softmax: top-k of a softmax, renormalised, as Mixtral; sigmoid:
// DeepSeek-V3's, with a per-expert bias for the selection only) and the
// router (learned, or balanced: a test router, round-robin by global token id).
enum class MoeScore { softmax, sigmoid };
inline constexpr EnumName<MoeScore> kMoeScoreNames[] = {{MoeScore::softmax, "softmax"}, {MoeScore::sigmoid, "sigmoid"}};
enum class MoeRouter { learned, balanced };
inline constexpr EnumName<MoeRouter> kMoeRouterNames[] = {{MoeRouter::learned, "learned"},
                                                          {MoeRouter::balanced, "balanced"}};

inline const char* name_of(ScheduleKind v) { return name_in(kScheduleNames, v); }
inline const char* name_of(Recompute v) { return name_in(kRecomputeNames, v); }
inline const char* name_of(Precision v) { return name_in(kPrecisionNames, v); }
inline const char* name_of(GemmRoute v) { return name_in(kGemmRouteNames, v); }
inline const char* name_of(FaultKind v) { return name_in(kFaultKindNames, v); }
inline const char* name_of(SavePhase v) { return name_in(kSavePhaseNames, v); }
inline const char* name_of(ModelFamily v) { return name_in(kModelFamilyNames, v); }
inline const char* name_of(NormKind v) { return name_in(kNormNames, v); }
inline const char* name_of(PositionKind v) { return name_in(kPositionNames, v); }
inline const char* name_of(MlpKind v) { return name_in(kMlpNames, v); }
inline const char* name_of(MoeScore v) { return name_in(kMoeScoreNames, v); }
inline const char* name_of(MoeRouter v) { return name_in(kMoeRouterNames, v); }

struct ModelConfig {
  // The shape: every deck gives it.
  int layers = 0;
  int channels = 0;
  int heads = 0;
  int vocab = 0;
  int seq_len = 0;
  // The architecture: GPT-2's unless the deck says otherwise (model.family
  // changes the defaults; a key given beside it wins).
  ModelFamily family = ModelFamily::gpt2;
  NormKind norm = NormKind::layernorm;
  double norm_eps = 1e-5;
  PositionKind position = PositionKind::learned;
  double rope_theta = 10000.0;
  MlpKind mlp = MlpKind::gelu;
  int ffn_hidden = 0;  // the MLP's hidden width F; 0: 4C (gelu only)
  int kv_heads = 0;    // key/value heads (grouped-query attention); 0: model.heads
  bool tie_embeddings = true;
  bool bias = true;

  int ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * channels; }
  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int head_size() const { return channels / heads; }
  bool gated() const { return mlp == MlpKind::swiglu; }
  bool learned_positions() const { return position == PositionKind::learned; }
  // Whether this is GPT-2's architecture (every key at GPT-2's value).
  bool gpt2_blocks() const {
    return norm == NormKind::layernorm && norm_eps == 1e-5 && position == PositionKind::learned &&
           mlp == MlpKind::gelu && ffn() == 4 * channels && kv() == heads && tie_embeddings && bias;
  }

  // Mixture-of-Experts (docs/model.md): 0 experts is a dense model, as before.
  // Block l is an MoE block when l >= moe_dense_first and l % moe_every == 0
  // (DeepSeek-V3's first_k_dense_replace and moe_layer_freq).
  int moe_experts = 0;        // E: routed experts per MoE block
  int moe_top_k = 2;          // k: experts each token is sent to
  int moe_every = 1;          // every k-th block is an MoE block
  int moe_dense_first = 0;    // that many leading blocks stay dense
  int moe_hidden = 0;         // each routed expert's hidden width; 0: the dense MLP's, ffn()
  int moe_shared_hidden = 0;  // an always-on shared expert's hidden width; 0: none
  MoeScore moe_score = MoeScore::softmax;
  MoeRouter moe_router = MoeRouter::learned;

  bool moe() const { return moe_experts > 0; }
  bool moe_block(int layer) const { return moe() && layer >= moe_dense_first && layer % moe_every == 0; }
  int moe_ffn() const { return moe_hidden > 0 ? moe_hidden : ffn(); }
  int moe_blocks() const {
    int n = 0;
    for (int l = 0; l < layers; ++l) n += moe_block(l) ? 1 : 0;
    return n;
  }
};

struct DataConfig {
  std::string source = "synthetic";  // "synthetic", "text" or "tokens"
  std::string path;                  // for "text" and "tokens"
  // A resumed run normally refuses a data source other than the one the
  // checkpoint was trained on (kind, size, first-MiB digest); true continues
  // on the new source on purpose.
  bool allow_source_change = false;
  // Held-out data for the validation loss (train.eval_every): a separate
  // file of the same kind as `path`, or the last `val_fraction` of the
  // file's tokens (then left out of training). The synthetic source needs
  // neither: it holds out a stream of its own (a different seed stream).
  std::string val_path;
  double val_fraction = 0.0;
};

struct TrainConfig {
  int steps = 20;
  int global_batch = 8;  // sequences per optimizer step
  int micro_batch = 4;   // sequences per forward/backward on one data-parallel rank
  std::uint64_t seed = 1234;
  double lr = 3e-4;
  double min_lr = 3e-5;
  int warmup_steps = 2;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables clipping
  int log_every = 1;
  Recompute recompute = Recompute::none;
  Precision precision = Precision::fp32;  // bf16: mixed precision (docs/model.md, "Precision")
  int eval_every = 0;                     // validation loss every N steps (and at the last); 0: never
  int eval_batches = 1;                   // global batches of held-out data per validation loss
  // Mixture-of-Experts training (docs/model.md): the sigmoid router's bias
  // update rate (0: no bias), the per-sequence balance loss and the router's
  // z-loss coefficients (0: off), and the bound of an expert's load as a
  // multiple of the mean load (0: no bound below the worst case, E / top_k).
  double moe_bias_rate = 0.0;
  double moe_seq_aux = 0.0;
  double moe_z_loss = 0.0;
  double moe_max_load = 0.0;
};

struct ParallelConfig {
  int dp_replicate = 1;
  // -1: the ranks the other degrees leave (torchtitan's default), so an unset
  // layout fills the world with FSDP. An explicit -1 on another axis takes
  // that role instead (parse_config sets an unset dp_shard to 1 then).
  int dp_shard = -1;
  int tp = 1;
  int cp = 1;
  int pp = 1;
  bool sequence_parallel = false;
  bool reshard_after_forward = true;  // FSDP: free a block's gathered parameters after its forward
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_stages = 1;  // pipeline chunks per pp rank (interleaved_1f1b)
  // Expert parallelism: the experts of an MoE block split over ep consecutive
  // ranks of dp_shard x cp x tp (mesh/dims.hpp), not a mesh axis of its own.
  int ep = 1;
};

struct CheckpointConfig {
  std::string dir = "ckpt";
  int every = 0;  // 0: never, N: after every N optimizer steps
  int keep = 3;   // newest checkpoints kept
  bool at_start = false;
  // SIGTERM, SIGINT or SIGUSR1 (core/signals.hpp): where the run saves
  // checkpoints, save the state at the step boundary it stops at.
  bool on_signal = true;
  // Copy the state to host memory at a due step and write it from a
  // background thread while training goes on (io::AsyncSave).
  bool async = false;
};

struct CommConfig {
  // A collective that does not complete within this many seconds is a hang:
  // every rank reports its collective ledger and the job exits non-zero.
  // 0 disables the deadline (the ledger is kept).
  double timeout_s = 600.0;
  // While a non-blocking MPI request is in flight, a thread runs MPI's
  // progress engine every this many microseconds (comm/progress.hpp), so the
  // transfer moves during compute; 0: progress inside MPI calls only.
  double progress_poll_us = 100.0;
  // The wire format of the gradient reductions (data-parallel all-reduce,
  // FSDP reduce-scatter, HSDP, the tied embedding, sequence parallelism's
  // replicated tensors): fp32, or bf16 (half the bytes; needs train.precision
  // = "bf16", so fp32 runs stay exact). Accumulation stays fp32 either way.
  Precision reduce_dtype = Precision::fp32;
};

struct PerfConfig {
  double peak_gflops = 0.0;  // per rank; 0 means: calibrate with a short GEMM at start-up
  // auto: the calibration times each library on the run's product shapes and
  // sends each class of products to the fastest (with a peak given above,
  // nothing is timed and BLAS runs fp32); blas or onednn: that library.
  GemmRoute gemm_route = GemmRoute::automatic;
  // Memory one rank may use, in GiB; 0 means: the node's available memory
  // divided by the ranks on it. A deck whose estimate exceeds it is refused.
  double memory_per_rank_gib = 0.0;
  // A cluster file (plan/cluster.hpp) to predict the run's step on: the
  // banner, the PERFORMANCE block and the metrics summary then carry the
  // prediction beside what is measured. Empty: no prediction.
  std::string cluster;
  // Mixture-of-Experts, for the predicted step (ndmini plan, perf.cluster):
  // the busiest rank's routed tokens over the mean (docs/planner.md).
  double moe_imbalance = 1.0;
};

// Fault injection, to prove that failures are handled (tests, scripts).
// kind none (the default) injects nothing.
struct FaultConfig {
  FaultKind kind = FaultKind::none;
  int rank = 0;                    // the world rank it hits; skip_collective: -1, every rank (drops fault.group's sums)
  int step = 0;                    // kill, nan, skip_collective: the training step (nan at train.steps: the final
                                   // state's check); enospc or kill with a phase: the step of the checkpoint saved
  std::optional<SavePhase> phase;  // for saves: the phase to fail
  std::string group = "batch";     // skip_collective on every rank: the communicator whose sums are dropped
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  CommConfig comm;
  PerfConfig perf;
  FaultConfig fault;
  // Where each key set came from: "section.key" -> "deck" or "--set" (a key
  // not in it has its default). `ndmini config` prints it.
  std::map<std::string, std::string> key_origin;
  std::string toml;  // the resolved deck (overrides applied), as TOML text; floats in their shortest
                     // form that reads back as the same double
};

// Parses deck text; `origin` names it in error messages (a file name).
// `overrides` are "section.key=value" strings applied on top (as --set does).
// Throws ndmini::Error naming the key and what would fix it.
Config parse_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides = {});

// The shortest text that reads back as exactly `v` ("0.0006", "1e-05",
// "3.0"), always a TOML float (never an integer).
std::string shortest_float(double v);

// The largest deck read, in bytes. A deck sets some fifty keys in a few KiB;
// 1 MiB leaves room for any comments while bounding what every rank reads,
// parses and stores (resolved) in each checkpoint's `config` attribute.
inline constexpr std::uint64_t kDeckMaxBytes = std::uint64_t{1} << 20;

// One key of the deck as the parser knows it (docs/deck.md is generated from
// these): its type ("integer", "float", "string", "boolean") and its default
// as TOML text, empty for a required key.
struct DeckKey {
  std::string section;
  std::string name;
  std::string type;
  std::string default_value;
};

// Every key a deck may set, in the parser's order.
std::vector<DeckKey> deck_keys();

// Reads and parses a deck file: a regular file of at most kDeckMaxBytes.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace ndmini
