// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The layouts of the equivalence suite (test_equivalence.cpp), shared with
// the memory and planner tests (test_memory.cpp, test_plan.cpp) so all cover
// the same list, with the world helpers they share.
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "run/layout.hpp"

namespace ndmini::equivalence {

// This process's world: the suite picks the layouts of its size.
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

struct Layout {
  int ranks;
  std::vector<std::string> degrees;  // --set values of the layout
  std::vector<std::string> model;    // --set values of the model, for the reference too
};

inline std::string label(const Layout& l) {
  std::string s;
  for (const auto* list : {&l.model, &l.degrees})
    for (const auto& d : *list) s += (s.empty() ? "" : " ") + d.substr(d.find('.') + 1);
  return s;
}

inline std::vector<std::string> joined(const Layout& l) {
  std::vector<std::string> all = l.model;
  all.insert(all.end(), l.degrees.begin(), l.degrees.end());
  return all;
}

// The layouts of the equivalence suite over 1, 2, 4 and 8 ranks (tiny: 4
// heads, so tp <= 4; seq_len 64, so cp <= 4 with SP at tp = 2). Pipelines
// take more layers where they need them (a layer per chunk); recompute =
// block runs beside each pipeline and context layout.
inline const std::vector<Layout>& layouts() {
  const std::string rc = "train.recompute=block";
  const std::vector<std::string> four = {"model.layers=4"}, eight = {"model.layers=8"};
  static const std::vector<Layout> all = {
      {1, {"parallel.tp=1"}, {}},
      {1, {rc}, {}},
      {2, {"parallel.dp_replicate=2"}, {}},
      {2, {"parallel.dp_shard=2"}, {}},
      {2, {"parallel.tp=2"}, {}},
      {2, {"parallel.tp=2", "parallel.sequence_parallel=true"}, {}},
      // Two sequences per micro-batch: the sequence-parallel chunks of N/tp rows cross sequences.
      {2, {"parallel.tp=2", "parallel.sequence_parallel=true", "train.micro_batch=2"}, {}},
      {2, {"parallel.pp=2", "parallel.schedule=gpipe"}, {}},
      {2, {"parallel.pp=2", "parallel.schedule=gpipe", rc}, {}},
      {2, {"parallel.pp=2", "parallel.schedule=1f1b", "train.micro_batch=2"}, {}},
      {2, {"parallel.pp=2", "parallel.schedule=1f1b", rc}, {}},
      {2, {"parallel.cp=2"}, {}},
      {2, {"parallel.cp=2", rc}, {}},
      {4, {"parallel.dp_replicate=2", "parallel.dp_shard=2"}, {}},
      {4, {"parallel.dp_shard=4", "parallel.reshard_after_forward=false"}, {}},
      {4, {"parallel.dp_replicate=2", "parallel.tp=2"}, {}},
      {4, {"parallel.dp_shard=2", "parallel.tp=2", "parallel.sequence_parallel=true"}, {}},
      {4, {"parallel.tp=4"}, {}},
      {4, {"parallel.pp=4", "parallel.schedule=1f1b"}, four},
      {4, {"parallel.pp=4", "parallel.schedule=1f1b", rc}, four},
      {4, {"parallel.pp=4", "parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=2"}, eight},
      {4, {"parallel.pp=4", "parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=2", rc}, eight},
      {4, {"parallel.pp=2", "parallel.dp_replicate=2"}, {}},
      {4,
       {"parallel.pp=2", "parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=2", "parallel.dp_shard=2"},
       four},
      {4, {"parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true"}, {}},
      {4, {"parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true", rc}, {}},
      {4, {"parallel.cp=4"}, {}},
      {4, {"parallel.cp=4", rc}, {}},
      {4, {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"}, {}},
      {4, {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true", rc}, {}},
      {8, {"parallel.dp_replicate=2", "parallel.dp_shard=2", "parallel.tp=2"}, {}},
      {8, {"parallel.dp_shard=2", "parallel.tp=4", "parallel.sequence_parallel=true"}, {}},
      {8, {"parallel.dp_replicate=8"}, {}},
      {8, {"parallel.pp=2", "parallel.dp_shard=2", "parallel.tp=2"}, {}},
      {8, {"parallel.pp=2", "parallel.dp_shard=2", "parallel.tp=2", rc}, {}},
      {8, {"parallel.cp=2", "parallel.dp_replicate=2", "parallel.tp=2"}, {}},
      {8, {"parallel.cp=2", "parallel.dp_replicate=2", "parallel.tp=2", rc}, {}},
      {8, {"parallel.pp=2", "parallel.cp=2", "parallel.tp=2"}, {}},
      {8, {"parallel.pp=2", "parallel.cp=2", "parallel.tp=2", rc}, {}},
      {8, {"parallel.pp=2", "parallel.dp_replicate=2", "parallel.cp=2"}, {}},
      {8, {"parallel.pp=2", "parallel.dp_replicate=2", "parallel.cp=2", rc}, {}},
  };
  return all;
}

// The layouts of the Mixture-of-Experts suite (moe-tiny: 4 experts, top-2,
// both blocks MoE) over 1, 2 and 4 ranks: expert parallelism (ep) over each
// axis it may span (dp_shard, cp, tp with SP), beside dp_replicate and the
// pipelines; the experts FSDP-sharded over the rest of dp_shard x cp x tp
// (ep = 1 on 2 ranks; ep 2 of dp_shard 4) or whole (ep = dp_shard x cp x tp); the balanced test router and the learned
// one; a shared expert; dense and MoE blocks mixed (moe_every = 2); SwiGLU experts; recompute = block; the balancing
// terms (balancing()).
inline std::vector<std::string> balancing() {
  return {"model.moe_score=sigmoid", "train.moe_bias_rate=0.01", "train.moe_seq_aux=0.01", "train.moe_z_loss=0.001"};
}
inline const std::vector<Layout>& moe_layouts() {
  const std::string rc = "train.recompute=block", ep2 = "parallel.ep=2", ep4 = "parallel.ep=4";
  const std::string sp = "parallel.sequence_parallel=true", balanced = "model.moe_router=balanced";
  const std::string shared = "model.moe_shared_hidden=128", mixed = "model.moe_every=2";
  static const std::vector<Layout> all = {
      {1, {rc}, {}},
      {2, {"parallel.dp_shard=2"}, {}},
      {2, {"parallel.tp=2", sp}, {}},
      {2, {"parallel.dp_shard=2", ep2}, {}},
      {2, {"parallel.dp_shard=2", ep2}, {balanced}},
      {2, {"parallel.dp_shard=2", ep2, rc}, {}},
      {2, {"parallel.dp_shard=2", ep2}, {shared, mixed}},
      {2, {"parallel.dp_shard=2", ep2}, {"model.mlp=swiglu", "model.ffn_hidden=128"}},
      {2, {"parallel.tp=2", sp, ep2}, {}},
      {2, {"parallel.tp=2", sp, ep2}, {shared}},
      {2, {"parallel.cp=2", ep2}, {}},
      {2, {"parallel.cp=2", ep2, rc}, {balanced}},
      {4, {"parallel.dp_replicate=2", "parallel.dp_shard=2", ep2}, {}},
      {4, {"parallel.dp_shard=4", ep2}, {}},
      {4, {"parallel.dp_shard=4", ep4}, {}},
      {4, {"parallel.dp_shard=4", ep4}, {balanced}},
      {4, {"parallel.dp_shard=2", "parallel.tp=2", sp, ep4}, {shared}},
      {4, {"parallel.pp=2", "parallel.dp_shard=2", ep2, "parallel.schedule=1f1b"}, {}},
      {4, {"parallel.pp=2", "parallel.dp_shard=2", ep2, "parallel.schedule=1f1b", rc}, {}},
      {4,
       {"parallel.pp=2", "parallel.dp_shard=2", ep2, "parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=2"},
       {"model.layers=4", mixed}},
      // The balancing terms: sigmoid scores with the selection bias moved every
      // step from the counts of every rank, the sequence-wise balance loss
      // (a sequence's sums over cp and tp) and the z-loss.
      {2, {"parallel.dp_shard=2", ep2}, balancing()},
      {2, {"parallel.tp=2", sp, ep2}, balancing()},
      {2, {"parallel.cp=2", ep2}, balancing()},
      {4, {"parallel.pp=2", "parallel.dp_shard=2", ep2, "parallel.schedule=1f1b"}, balancing()},
  };
  return all;
}

// The global batch (a --set value) that gives each data-parallel rank of
// `overrides`' layout on `ranks` ranks a few micro-batches of the deck: at
// least 2 (gradient accumulation runs), at least pp (every pipeline schedule
// reaches its steady state), never more sequences than the deck's own global
// batch. Most of a test's time on oversubscribed cores is the collectives of
// each micro-batch, so fewer micro-batches are what makes a layout's run cheap.
inline std::string few_micro_batches(const std::string& deck_path, const std::vector<std::string>& overrides,
                                     int ranks) {
  const Config cfg = load_config(deck_path, overrides);
  const ParallelDims d = resolve_layout(cfg, ranks).dims;
  const int per_rank = std::max(2, d.pp);
  const int batch = std::min(cfg.train.global_batch, per_rank * cfg.train.micro_batch * d.dp_replicate * d.dp_shard);
  return "train.global_batch=" + std::to_string(batch);
}

}  // namespace ndmini::equivalence
