// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Block attention with log-sum-exp: the kernel of causal multi-head
// self-attention, one (Q block, K/V block) pair at a time, never keeping a
// [T, T] matrix between calls.
//
// Data are head-major: head (b, h) is a contiguous [rows, hs] matrix, heads
// one after another (q of a micro-batch: [B, H, T, hs]). An operand is a
// HeadRows: a pointer to row 0 of the first head, the distance between
// heads, and a row count, so rows [r0, r0 + n) of every head -- one
// context-parallel chunk -- are an operand without a copy. The block kernels
// pair the i-th matrix of q with the i-th of k and v; grouped-query attention
// (r query heads per kv head) is r calls, call j taking query heads
// g r + j of every kv head g: q, O, LSE, dO, D and dQ with r times the head
// stride, from head j on (see ContextParallelAttention).
//
// Positions: query row i is at q_pos0 + i, key row j at k_pos0 + j. Causal
// mask: a key is visible iff k_pos <= q_pos. Scale 1/sqrt(hs).
//
// Forward merges one K/V block into a running (O, LSE) per query row: O is
// the normalised output so far and LSE the log of its softmax denominator
// (max included). Starting from O = 0, LSE = -inf, merging blocks in any
// order gives softmax(Q K^T / sqrt(hs) + mask) V over all of them, up to
// float rounding:
//   LSE' = log(exp(LSE) + exp(LSE_blk)),
//   O'   = exp(LSE - LSE') O + exp(LSE_blk - LSE') O_blk.
// Backward (FlashAttention style) recomputes P = exp(S - LSE) from Q, K and
// the FINAL LSE and takes D = rowsum(dO * O) of the FINAL O; it accumulates
// this block pair's share of dQ, dK and dV, so summing over the pairs gives
// the full gradient.
//
// Work the causal mask removes is skipped: a fully masked pair returns at
// once; otherwise the query rows are cut into tiles and each tile multiplies
// only the key prefix visible to its last row (on a diagonal block about
// half the products of a full square). The heads share every tile's shape,
// so each product of a tile is one strided-batched GEMM over the heads
// (gemm_strided_batched: cublasGemmStridedBatchedEx on CUDA; on a CPU core
// one head at a time, so its tile stays in cache) on a scratch tile per
// head; the softmax steps are Kokkos kernels, in their coalesced form on a
// GPU (a row per warp, lanes along the row). Everything runs in a fixed
// order without atomics, so results are deterministic.
#include <cstddef>

#include "core/types.hpp"

namespace ndmini::kernels {

// Shapes for one micro-batch on one rank: B sequences of seq_len rows,
// `channels` = heads x hs columns (the tp-local heads under tensor
// parallelism) of q and of the output. Grouped-query attention: kv_heads
// (KV, a divisor of heads; 0 means heads, multi-head attention) heads of k
// and v, each shared by r = heads / KV consecutive query heads: query head h
// reads kv head h / r.
//   qkv  [B*T, (H + 2 KV) hs]   c_attn output, token-major (all q, then all k, then all v)
//   qkvh q [B, H, T, hs], then k [B, KV, T, hs], then v [B, KV, T, hs]: the same, head-major
//   out  [B*T, C]               heads concatenated, token-major, ready for c_proj
// Kept the last member so that {B, T, C, H} still means multi-head attention.
struct AttentionShape {
  int batch, seq_len, channels, heads;
  int kv_heads = 0;
  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int head_size() const { return channels / heads; }
  int group() const { return heads / kv(); }              // r: query heads per kv head
  int kv_channels() const { return kv() * head_size(); }  // columns of k (and of v)
  int qkv_width() const { return channels + 2 * kv_channels(); }
  // Floats of the head-major q part [B, H, T, hs] (also of O and dO) and of
  // one value per query row [B, H, T] (LSE, D).
  std::size_t part_size() const { return static_cast<std::size_t>(batch) * seq_len * channels; }
  std::size_t rows_size() const { return static_cast<std::size_t>(batch) * heads * seq_len; }
  // Floats of the k part (and of the v part) [B, KV, T, hs], and its rows B x KV x T.
  std::size_t kv_part_size() const { return static_cast<std::size_t>(batch) * seq_len * kv_channels(); }
  std::size_t kv_rows_size() const { return static_cast<std::size_t>(batch) * kv() * seq_len; }
  // Offsets in qkvh (and dqkvh) of the k and the v part; all of it.
  std::size_t k_offset() const { return part_size(); }
  std::size_t v_offset() const { return part_size() + kv_part_size(); }
  std::size_t qkvh_size() const { return part_size() + 2 * kv_part_size(); }
};

// Rows [0, rows) of `heads` matrices spaced head_stride floats apart; row
// width is the head size (one float for LSE and D).
struct HeadRows {
  real* data = nullptr;
  std::size_t head_stride = 0;
  int rows = 0;
};
struct ConstHeadRows {
  const real* data = nullptr;
  std::size_t head_stride = 0;
  int rows = 0;
  ConstHeadRows() = default;
  ConstHeadRows(const real* d, std::size_t stride, int n) : data(d), head_stride(stride), rows(n) {}
  ConstHeadRows(const HeadRows& r) : data(r.data), head_stride(r.head_stride), rows(r.rows) {}  // NOLINT: implicit
};
// The q, k, v and dO operands under bf16 mixed precision.
struct ConstBf16HeadRows {
  const bf16* data = nullptr;
  std::size_t head_stride = 0;
  int rows = 0;
};

// What the operands of one block pair share.
struct AttentionBlock {
  int heads = 0;      // matrices per operand (B x H)
  int head_size = 0;  // hs
  int q_pos0 = 0;     // absolute position of query row 0
  int k_pos0 = 0;     // absolute position of key row 0
  bool causal = true;
  int tile_rows = 0;  // query rows per tile of the causal staircase; 0: the tuned default
};

// Floats of scratch the block kernels need for up to q_rows x k_rows, for
// `heads` heads batched together (a GPU batches them all; a CPU one at a time,
// so there the size does not grow with heads). A smaller scratch, of at least
// one head's share, batches fewer heads at once.
std::size_t attention_block_scratch_size(int q_rows, int k_rows, int heads = 1);

// Which form the block kernels take. automatic: the build's (device where
// MemSpace is a GPU's memory). Tests on a CPU select `device` to check the
// GPU form there: coalesced row kernels (teams of rows, vector lanes along a
// row), every head in one batched product and the GPU's tile height.
enum class AttentionKernelForm { automatic, host, device };
void set_attention_kernel_form(AttentionKernelForm form);

// Merges q against (k, v) into (o, lse) as above. o: [rows of q, hs];
// lse: one float per query row. Returns false, touching nothing, when the
// causal mask hides the whole pair. Query rows that see no key of this block
// keep their O and LSE.
bool attention_block_forward(HeadRows o, HeadRows lse, ConstHeadRows q, ConstHeadRows k, ConstHeadRows v,
                             const AttentionBlock& blk, Slice1D scratch);
// The same with bf16 q, k, v (mixed precision): the products take bf16
// operands (P rounded to bf16 in scratch_bf16, as many values as `scratch`)
// and accumulate in fp32; the softmax, O and LSE stay fp32.
bool attention_block_forward(HeadRows o, HeadRows lse, ConstBf16HeadRows q, ConstBf16HeadRows k, ConstBf16HeadRows v,
                             const AttentionBlock& blk, Slice1D scratch, Bf16Slice1D scratch_bf16);

// Accumulates this pair's gradients: dq += dS K, dk += dS^T Q, dv += P^T dO
// with P = exp(S - lse), dS = P (dP - delta) / sqrt(hs), dP = dO V^T.
// lse and delta = rowsum(dO * O) are those of the final, merged forward.
// Returns false, touching nothing, when the pair is fully masked.
bool attention_block_backward(HeadRows dq, HeadRows dk, HeadRows dv, ConstHeadRows q, ConstHeadRows k, ConstHeadRows v,
                              ConstHeadRows dout, ConstHeadRows lse, ConstHeadRows delta, const AttentionBlock& blk,
                              Slice1D scratch);
// The same with bf16 q, k, v and dout (P and dS rounded to bf16 in
// scratch_bf16 for the products); dq, dk, dv accumulate in fp32.
bool attention_block_backward(HeadRows dq, HeadRows dk, HeadRows dv, ConstBf16HeadRows q, ConstBf16HeadRows k,
                              ConstBf16HeadRows v, ConstBf16HeadRows dout, ConstHeadRows lse, ConstHeadRows delta,
                              const AttentionBlock& blk, Slice1D scratch, Bf16Slice1D scratch_bf16);

// ---- layout passes around the block kernel (one pass each, fused with the
// initialisation the next step needs) -------------------------------------------
// qkv [B*T, (H + 2 KV) hs] -> qkvh (q, k, v head-major, as above); and
// o := 0, lse := -inf, the identity of the merge (o and lse head-major,
// [B, H, T, hs] and [B, H, T]).
void attention_split_qkv(Slice1D qkvh, Slice1D o, Slice1D lse, ConstSlice2D qkv, const AttentionShape& s);
// The same with qkvh rounded to bf16 (mixed precision).
void attention_split_qkv(Bf16Slice1D qkvh, Slice1D o, Slice1D lse, ConstSlice2D qkv, const AttentionShape& s);
// o [B, H, T, hs] -> out [B*T, C].
void attention_merge_heads(Slice2D out, ConstSlice1D o, const AttentionShape& s);
// The backward's prologue: dout [B*T, C] -> dO [B, H, T, hs] head-major,
// delta = rowsum(dO * O) per head row from the forward's out [B*T, C], and
// zeroes the first `zero_parts` (0 to 3) of dqkvh's parts dq, dk, dv.
void attention_backward_prologue(Slice1D dout_heads, Slice1D delta, Slice1D dqkvh, int zero_parts, ConstSlice2D dout,
                                 ConstSlice2D out, const AttentionShape& s);
// The same with dO rounded to bf16 (mixed precision; delta from the fp32 dout).
void attention_backward_prologue(Bf16Slice1D dout_heads, Slice1D delta, Slice1D dqkvh, int zero_parts,
                                 ConstSlice2D dout, ConstSlice2D out, const AttentionShape& s);
// dqkvh (dq, dk, dv head-major) -> dqkv [B*T, (H + 2 KV) hs] (overwritten).
void attention_merge_qkv(Slice2D dqkv, ConstSlice1D dqkvh, const AttentionShape& s);

}  // namespace ndmini::kernels
