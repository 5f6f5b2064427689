// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Where every parameter element lives: the global tensor (its name and
// shape, as in docs/model.md), this tensor-parallel rank's part of it, and its
// place in the flat buffers that FSDP shards.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/types.hpp"

namespace ndmini {

// How tensor parallelism splits a parameter over the tp group.
enum class TpSplit {
  replicated,  // every tp rank holds all of it (LayerNorms, wpe, row-parallel biases)
  rows,        // dim 0 split: column-parallel weights and biases, the vocabulary of wte
  cols,        // dim 1 split: row-parallel weights
  // Not split over tp: an MoE block's routed experts [E, rows, cols] split
  // over ep instead, this rank holding E/ep whole experts; their gradients
  // are summed over the expert fsdp group (which holds the tp ranks), never
  // over tp alone.
  experts,
};

// One unit's parameters as the model's compute reads them: fp32 `values`
// (the masters; under bf16 mixed precision the masters rounded to bf16)
// and, under bf16, the same values as bf16 (the operands of matrix products;
// null in fp32). Both indexed like the parameter layout from the unit's start.
struct UnitWeights {
  real* values = nullptr;
  const bf16* bf16_values = nullptr;
};

struct ParamInfo {
  std::string name;                        // global name, e.g. "h/3/mlp/c_fc/weight"
  std::vector<std::int64_t> global_shape;  // the whole tensor, row-major
  std::vector<std::int64_t> shape;         // this tp rank's part
  TpSplit split = TpSplit::replicated;
  // A rows split applies per section: c_attn's rows are q, then k, then v,
  // and each tp rank holds its heads' rows of all three (3 sections).
  int sections = 1;
  int unit = 0;            // FSDP unit (this rank's numbering; see ParamLayout)
  std::size_t offset = 0;  // in the flat tp-local buffer (all units, unsharded)
  std::size_t size = 0;    // elements of `shape`
  bool decay = false;      // AdamW weight decay: 2-D tensors only
  // A second copy of a tensor another rank owns: the tied wte of the last
  // pipeline stage (the first stage's copy is the owner). Its gradients are
  // summed with the owner's, so both stay equal; it is not written to
  // checkpoints nor counted in the gradient norm.
  bool tied_copy = false;
  // experts: the global index of the first expert held (ep rank x E/ep).
  std::int64_t first_expert = 0;
};

// The parameters one rank holds, cut into units: the granularity of FSDP's
// gather/release and reduce-scatter and of data parallelism's all-reduce
// buckets. The model decides the units (one per block, small ones for the
// embedding and the head); every unit is padded so it splits evenly.
//
// An MoE block's routed experts are a unit of their own right after the
// block's: they are sharded over the expert fsdp group (mesh/dims.hpp), not
// over fsdp, so their shards differ in size and owner. The block's unit
// names it (experts_unit); ParamStore gathers, releases and reduces the two
// together, so the unit events only ever name the block.
struct ParamLayout {
  std::vector<ParamInfo> params;         // in flat-buffer order
  std::vector<std::size_t> unit_offset;  // start of each unit in the flat buffer
  std::vector<std::size_t> unit_size;    // padded size of each unit
  std::vector<int> experts_unit;         // per unit: the unit of its routed experts (-1: none)
  std::vector<bool> holds_experts;       // per unit: a unit of routed experts
  std::size_t total = 0;                 // flat buffer size
  int tp_rank = 0, tp_size = 1;
  // The FSDP group sizes the units are padded for: fsdp (dp_shard x cp) for
  // all units but the experts', the expert fsdp group for those.
  int shards = 1, expert_shards = 1;
  int shards_of(int unit) const { return holds_experts[static_cast<std::size_t>(unit)] ? expert_shards : shards; }
};

// A block of a global tensor (row-major hyperslab) and where its elements
// start in the tp-local tensor (row-major too).
struct GlobalBlock {
  std::vector<std::uint64_t> offset, count;
  std::size_t local_begin = 0;
};

// The global blocks that local elements [begin, end) of `p` on tp rank
// `tp_rank` cover, in local order. A contiguous local range is one block per
// run of whole rows (split at q/k/v section boundaries) plus partial rows.
// A 3-D tensor (an MoE block's experts [E, rows, cols], never split over tp)
// is cut at each expert too: its blocks hold rows of one expert ({1, n, cols}).
std::vector<GlobalBlock> global_blocks(const ParamInfo& p, int tp_rank, std::size_t begin, std::size_t end);

// A block as rows of the row-major global tensor: the flat index of its
// first element, its rows (of `cols` elements, `stride` apart: the global
// tensor's last dimension; 1-D tensors are a column) and the local row
// length `local_cols` (the tp-local tensor's last dimension).
struct BlockRows {
  std::uint64_t first = 0, rows = 0, cols = 0, stride = 0, local_cols = 0;
};
BlockRows block_rows(const ParamInfo& p, const GlobalBlock& b);

}  // namespace ndmini
