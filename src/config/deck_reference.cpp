// SPDX-License-Identifier: BSD-3-Clause
#include "config/deck_reference.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

#include "config/config.hpp"
#include "core/error.hpp"

namespace ndmini {
namespace {

// What each section is for, printed above its table.
const std::map<std::string, std::string>& section_intros() {
  static const std::map<std::string, std::string> intros = {
      {"model",
       "The shape (L, C, H, V, T; required) and the architecture: GPT-2's by default, Llama's with "
       "`model.family = \"llama\"` (a key given beside it wins). [model.md](model.md) defines the model; `train`, "
       "`check` and `plan` "
       "take every architecture."},
      {"data",
       "What the model reads. Every batch is a pure function of (seed, step, source): [model.md](model.md#data) "
       "gives the order."},
      {"train", "The optimizer steps, the batch and the learning-rate schedule."},
      {"parallel",
       "The mesh degrees and the pipeline schedule; [parallelism.md](parallelism.md) describes each axis and "
       "the rules a layout must keep."},
      {"checkpoint", "Saving and resuming; [checkpoints.md](checkpoints.md) describes the folder and its protocol."},
      {"comm", "Collectives: the hang deadline and MPI's progress; see [debugging.md](debugging.md)."},
      {"perf", "The peak used for MFU, the memory a rank may use, and the cluster a run is predicted on."},
      {"fault",
       "Fault injection, to prove the failures are handled ([checkpoints.md](checkpoints.md#fault-injection)); "
       "a fault that could never fire is refused."},
  };
  return intros;
}

// The meaning of every key, by its dotted name.
const std::map<std::string, std::string>& meanings() {
  static const std::map<std::string, std::string> text = {
      {"model.layers", "L: transformer blocks"},
      {"model.channels", "C: the width; a multiple of `model.heads`"},
      {"model.heads", "H: attention heads; must divide C"},
      {"model.vocab", "V: the vocabulary (256 for `data.source = \"text\"`; pad GPT-2's to 50304 for tp)"},
      {"model.seq_len", "T: tokens per sequence"},
      {"model.family",
       "the defaults of the keys below: `\"gpt2\"` (LayerNorm, learned positions, GELU, biases, tied head) or "
       "`\"llama\"` (RMSNorm, RoPE, SwiGLU, no biases, untied head)"},
      {"model.norm", "`\"layernorm\"` or `\"rmsnorm\"` (Llama's: no mean, no bias)"},
      {"model.norm_eps", "the norm's epsilon"},
      {"model.position",
       "`\"learned\"` (a `wpe` table of T x C) or `\"rope\"` (rotary, Hugging Face Llama's `rotate_half`; no "
       "`wpe`)"},
      {"model.rope_theta", "RoPE's base (Llama 3: 500000)"},
      {"model.mlp", "`\"gelu\"` (c_fc, GELU, c_proj) or `\"swiglu\"` (silu(gate) x up, then down)"},
      {"model.ffn_hidden", "F: the MLP's hidden width; 0 is 4C (gelu only; swiglu needs it); a multiple of tp"},
      {"model.kv_heads",
       "key/value heads (grouped-query attention; 1 is multi-query); 0 is `model.heads`; must divide H and be a "
       "multiple of tp"},
      {"model.tie_embeddings", "the LM head is `wte` (true) or a matrix of its own, `lm_head` (false)"},
      {"model.bias", "biases in the linear layers and the LayerNorms (Llama: false)"},
      {"model.moe_experts",
       "E: routed experts of each Mixture-of-Experts block ([model.md](model.md#mixture-of-experts)); 0: a dense "
       "model; `parallel.ep` splits the experts' compute"},
      {"model.moe_top_k", "k: the experts each token is sent to; 1 to E"},
      {"model.moe_every",
       "block l is an MoE block when l >= `moe_dense_first` and l is a multiple of this (DeepSeek-V3's "
       "`moe_layer_freq`); at least 1"},
      {"model.moe_dense_first", "that many leading blocks keep the dense MLP (DeepSeek-V3's `first_k_dense_replace`)"},
      {"model.moe_hidden", "each routed expert's hidden width; 0: the dense MLP's (`model.ffn_hidden`, or 4C)"},
      {"model.moe_shared_hidden",
       "an always-on shared expert beside the routed ones (DeepSeek), of this hidden width, split over tp as the "
       "dense MLP; 0: none"},
      {"model.moe_score",
       "`\"softmax\"` (top-k of a softmax, renormalised, as Mixtral) or `\"sigmoid\"` (DeepSeek-V3: sigmoid "
       "scores, a per-expert bias for the selection only, `train.moe_bias_rate`)"},
      {"model.moe_router",
       "`\"learned\"` (a linear router [E, C]) or `\"balanced\"` (a test router: token i of the global batch goes "
       "to experts i, i+1, ..., i+k-1 mod E)"},
      {"data.source", "`\"synthetic\"`, `\"text\"` (a file as bytes, V = 256) or `\"tokens\"` (an llm.c `.bin` file)"},
      {"data.path", "the file for `text` and `tokens`"},
      {"data.allow_source_change",
       "a resume is refused when the data differs from what the checkpoint was trained on (kind, size, digest of "
       "the first MiB); true continues on the new data on purpose (a moved but identical file needs no switch)"},
      {"data.val_path",
       "held-out data for the validation loss (`train.eval_every`): a separate file of the same kind as "
       "`data.path` (`text` and `tokens` only)"},
      {"data.val_fraction",
       "in [0, 1): hold out the last fraction of `data.path`'s tokens for the validation loss; training never "
       "reads them (so a resume refuses a change of it). `text` and `tokens` only; set this or `data.val_path`, "
       "not both. The synthetic source needs neither: it holds out walks of its own (the same graph, coins from "
       "another seed stream)"},
      {"train.steps", "optimizer steps"},
      {"train.global_batch", "sequences of `seq_len` tokens per optimizer step"},
      {"train.micro_batch",
       "sequences per forward/backward on one data-parallel rank; `global_batch / micro_batch` micro-batches "
       "are accumulated"},
      {"train.seed", "seeds the init and the synthetic data"},
      {"train.lr", "peak learning rate, in (0, 10)"},
      {"train.min_lr", "final learning rate, in [0, `train.lr`]"},
      {"train.warmup_steps",
       "linear warm-up, then cosine decay to `min_lr` at the last step (above `train.steps`: a note, the run "
       "ends in warm-up)"},
      {"train.weight_decay", "AdamW decay, on 2-D tensors only; in [0, 1]"},
      {"train.grad_clip", "global-norm clipping; 0 disables"},
      {"train.log_every", "progress line and metrics record every N steps (and the last)"},
      {"train.recompute",
       "`\"none\"` or `\"block\"`: keep only each block's output in the forward, recompute the block in its "
       "backward"},
      {"train.precision",
       "`\"fp32\"`, or `\"bf16\"`: mixed precision (fp32 masters, bf16 operands of every matrix product)"},
      {"train.eval_every",
       "validation loss every N steps and at the last step; 0: never. Computed before the step, with the "
       "parameters that step's `loss` is computed with, forward only (no gradient, no update: training is bitwise "
       "the same with it or without it), under every layout; a file source needs `data.val_path` or "
       "`data.val_fraction`"},
      {"train.eval_batches",
       "global batches of held-out data per validation loss (the same batches every time: batch j is the "
       "held-out source's batch of step j)"},
      {"train.moe_bias_rate",
       "sigmoid router: the step of the per-expert selection bias after each optimizer step, from the token "
       "counts summed over every token-holding rank (sign of mean - load); 0: no bias"},
      {"train.moe_seq_aux",
       "the coefficient of the balance loss computed per sequence (so it does not depend on the micro-batch); 0: "
       "off (reported as `aux` in the progress line)"},
      {"train.moe_z_loss",
       "the coefficient of the router's z-loss (mean squared log-sum-exp of its logits); 0: off (reported as "
       "`aux` in the progress line)"},
      {"train.moe_max_load",
       "the bound of one expert's tokens on a rank, a multiple of the mean load (tokens x k / E); nothing is "
       "dropped: a step that exceeds it stops every rank with a message naming the expert and its load; 0: the "
       "worst case E / k, never exceeded; else >= 1"},
      {"parallel.dp_replicate", "data-parallel replicas; -1: what is left of the world (one -1 at most)"},
      {"parallel.dp_shard",
       "FSDP shards; -1 (the default): what the other degrees leave of the world, 1 when another degree is -1"},
      {"parallel.tp", "tensor-parallel degree; must divide the heads and the vocabulary; -1: what is left"},
      {"parallel.cp", "context-parallel degree; `seq_len` must divide into 2 cp chunks; -1: what is left"},
      {"parallel.pp", "pipeline stages; -1: what is left of the world"},
      {"parallel.sequence_parallel", "with tp: shard the LayerNorm/residual regions along the tokens"},
      {"parallel.reshard_after_forward",
       "FSDP: free a block's gathered parameters after its forward, gather again for backward"},
      {"parallel.schedule", "pipeline schedule: `\"1f1b\"`, `\"gpipe\"` or `\"interleaved_1f1b\"` (with pp > 1)"},
      {"parallel.virtual_stages", "pipeline chunks per pp rank, for `\"interleaved_1f1b\"`"},
      {"parallel.ep",
       "expert parallelism: each MoE block's experts split over ep consecutive ranks of dp_shard x cp x tp (no mesh "
       "axis of its own, [parallelism.md](parallelism.md#expert-parallelism-ep)); must divide `model.moe_experts` and "
       "dp_shard x cp x tp; with tp > 1 it needs `parallel.sequence_parallel`"},
      {"checkpoint.dir", "where checkpoints go"},
      {"checkpoint.every", "save after every N steps; 0: never"},
      {"checkpoint.keep", "newest checkpoints kept"},
      {"checkpoint.at_start", "also save step 0 before training"},
      {"checkpoint.on_signal",
       "on SIGTERM, SIGINT or SIGUSR1, a run that saves checkpoints (`every` > 0 or `at_start`) saves the state "
       "it stops at ([cluster.md](cluster.md#pre-emption-and-requeue))"},
      {"checkpoint.async",
       "copy the state to host memory at a due step and write it from a background thread while training goes on; "
       "the next save, a stop signal's save and the final save wait for it "
       "([checkpoints.md](checkpoints.md#asynchronous-saves))"},
      {"comm.timeout_s",
       "a collective waited for longer than this is a hang: the job reports and exits with status 12; 0: no "
       "deadline, else 0.1 to 604800 (one week)"},
      {"comm.progress_poll_us",
       "while a non-blocking MPI transfer is in flight, a thread runs MPI's progress engine every this many "
       "microseconds, so gradient reductions and FSDP gathers move during compute (needs `MPI_THREAD_MULTIPLE`, "
       "which ndmini asks MPI for in any case; without it a note says so and MPI progresses inside its own calls); "
       "0: no progress thread"},
      {"comm.reduce_dtype",
       "`\"fp32\"`, or `\"bf16\"`: the gradient reductions (data-parallel all-reduce, FSDP reduce-scatter, the "
       "tied embedding, sequence parallelism's replicated tensors) round to bf16 and sum in bf16, half the bytes; "
       "needs `train.precision = \"bf16\"` ([model.md](model.md#precision))"},
      {"perf.peak_gflops", "peak GFLOP/s per rank for MFU; 0: measure with a GEMM calibration at start-up"},
      {"perf.gemm_route",
       "the library of the host's fp32 matrix products: `\"auto\"` times BLAS and oneDNN at start-up on the "
       "run's own shapes and sends the Linear layers' and the attention heads' products each to the fastest (the "
       "banner's `gemm:` line says which, with the rates; with `perf.peak_gflops` set nothing is timed and BLAS "
       "runs them); `\"blas\"` or `\"onednn\"` forces one (runs compared bit for bit pin it); bf16 runs through "
       "oneDNN and a GPU build through cuBLAS either way"},
      {"perf.memory_per_rank_gib",
       "memory one rank may use, GiB; a deck whose estimate exceeds it is refused before anything is allocated; "
       "0: the node's available memory / its ranks"},
      {"perf.cluster",
       "a cluster file ([planner.md](planner.md#cluster-files)) to predict the run's step on: the banner, the "
       "PERFORMANCE block and the metrics summary set the predicted parts beside the measured ones; empty: no "
       "prediction"},
      {"perf.moe_imbalance",
       "Mixture-of-Experts: the busiest rank's routed tokens over the mean, an assumption of the predicted step "
       "([planner.md](planner.md#mixture-of-experts)); 1 (the default) is the balanced router's, and that of "
       "Megatron-LM's published MoE layer timings (forced load balancing); set a learned router's measured one"},
      {"fault.kind",
       "`\"none\"`, `\"kill\"` (SIGKILL), `\"nan\"` (a NaN gradient), `\"enospc\"` (a full disk in a save) or "
       "`\"skip_collective\"` (a rank skips a collective; the hang detection names it)"},
      {"fault.rank",
       "the world rank it hits; `skip_collective` also takes -1: every rank drops its sums over `fault.group` "
       "from `fault.step` on (each sums as if alone in the group; nobody waits), a layout that forgot those sums"},
      {"fault.step",
       "`kill`, `nan`, `skip_collective`: the training step (from 0; `nan` at `train.steps` hits the check of the "
       "final state); `enospc`, or `kill` with a phase: the step of the checkpoint being saved"},
      {"fault.phase",
       "for saves: `\"create\"`, `\"write\"`, `\"close\"`, `\"rename\"` or `\"latest\"`; required by `enospc`"},
      {"fault.group",
       "`skip_collective` with `fault.rank = -1`: the communicator whose sums every rank drops: `\"tp\"`, "
       "`\"fsdp\"`, `\"dp_replicate\"`, `\"tied_wte\"`, `\"efsdp\"` (the routed experts' FSDP group), "
       "`\"batch\"` or `\"norm\"`; it must have 2 ranks or more in the layout"},
  };
  return text;
}

std::string cell(const std::string& default_value) {
  if (default_value.empty()) return "required";
  return "`" + default_value + "`";
}

// The schema's keys, each shown to have a meaning and each meaning a key.
std::vector<DeckKey> described_keys() {
  const std::vector<DeckKey> keys = deck_keys();
  const auto& text = meanings();
  // Both ways, so the page can neither miss a key nor keep a removed one.
  for (const auto& k : keys)
    require(text.count(k.section + "." + k.name) == 1,
            "deck key " + k.section + "." + k.name + " has no meaning in src/config/deck_reference.cpp; add one");
  for (const auto& [dotted, meaning] : text)
    require(std::any_of(keys.begin(), keys.end(), [&](const DeckKey& k) { return k.section + "." + k.name == dotted; }),
            "src/config/deck_reference.cpp describes " + dotted + ", which is no deck key; remove it");
  return keys;
}

const std::string& section_intro(const std::string& section) {
  const auto intro = section_intros().find(section);
  require(intro != section_intros().end(),
          "deck section [" + section + "] has no introduction in src/config/deck_reference.cpp; add one");
  return intro->second;
}

}  // namespace

std::string deck_keys_text() {
  const std::vector<DeckKey> keys = described_keys();
  std::size_t key_width = 0, type_width = 0, default_width = 0;
  for (const auto& k : keys) {
    key_width = std::max(key_width, k.section.size() + 1 + k.name.size());
    type_width = std::max(type_width, k.type.size());
    default_width = std::max(default_width, cell(k.default_value).size());
  }
  const auto pad = [](const std::string& s, std::size_t width) { return s + std::string(width - s.size() + 2, ' '); };
  std::ostringstream out;
  std::string section;
  for (const auto& k : keys) {
    if (k.section != section) {
      section = k.section;
      out << (out.tellp() > 0 ? "\n[" : "[") << section << "] " << section_intro(section) << "\n";
    }
    out << "  " << pad(k.section + "." + k.name, key_width) << pad(k.type, type_width)
        << pad(cell(k.default_value), default_width) << meanings().at(k.section + "." + k.name) << "\n";
  }
  return out.str();
}

std::string deck_reference_markdown() {
  const std::vector<DeckKey> keys = described_keys();
  const auto& text = meanings();

  std::ostringstream out;
  out << "<!-- SPDX-License-Identifier: BSD-3-Clause -->\n"
         "<!-- Generated from the deck parser's schema (src/config/config.cpp) and the meanings in\n"
         "     src/config/deck_reference.cpp; do not edit. Regenerate:\n"
         "     cmake --build build --target ndmini_deck_doc && build/miniapp/ndmini_deck_doc > docs/deck.md -->\n"
         "# The deck\n\n"
         "A deck is a TOML file of the sections below. Every key is optional except the model's; an unknown key\n"
         "is refused with the nearest valid one (`ndmini: error: tiny.toml: unknown key train.setps; did you mean\n"
         "train.steps?`). `--set section.key=value` overrides any key from the command line (the value is read\n"
         "as TOML, or as a bare string: `--set data.source=text`). `ndmini check DECK` prints the resolved deck;\n"
         "`ndmini config DECK` prints every key with its value and where it came from (default, deck, `--set`),\n"
         "and `ndmini keys` lists these tables from the binary.\n"
         "The decks that come with ndmini are listed in [running.md](running.md#decks-in-inputs).\n";
  std::string section;
  for (const auto& k : keys) {
    if (k.section != section) {
      section = k.section;
      out << "\n## [" << section << "]\n\n" << section_intro(section) << "\n\n";
      out << "| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    out << "| `" << k.section << "." << k.name << "` | " << k.type << " | " << cell(k.default_value) << " | "
        << text.at(k.section + "." + k.name) << " |\n";
  }
  return out.str();
}

}  // namespace ndmini
