// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Context parallelism (cp): the sequence split over the ranks of the cp
// group, attention computed as a ring.
//
// Chunk layout. A sequence of T tokens is cut into 2*cp chunks of
// c = T / (2 cp) tokens; cp rank i holds chunks i and 2cp-1-i, in that
// order, as its T/cp local rows:
//
//   T = 16, cp = 2, c = 4:   chunk   0    1    2    3
//                            rank    0    1    1    0
//   rank 0 rows 0..7 = positions 0-3, 12-15;  rank 1 rows = positions 4-7, 8-11
//
// Under a causal mask chunk k attends to chunks 0..k, so pairing an early
// chunk with its mirror image gives every rank the same attention work:
// 2cp-1 full c x c chunk pairs and 2 diagonal (half-masked) ones. A
// micro-batch of B sequences is B*T/cp token-major rows on each rank,
// sequence-major (the local rows of sequence 0, then of sequence 1, ...).
// With cp = 1 the layout is the identity (T need not be even) and attention
// is one diagonal block over the whole sequence.
//
// Ring forward. Each rank holds its local Q, K, V (head-major). K and V
// travel round the ring: at step s = 0..cp-1 rank r holds the K/V of rank
// (r - s) mod cp and, while it computes its two q chunks against those two
// k chunks (pairs the causal mask hides skipped), already sends them on to
// rank r+1 and receives the next from rank r-1 (one non-blocking
// Communicator::batch_p2p per step, double buffers; cp-1 exchanges). The
// block kernel merges each pair into the running (O, LSE) with the
// log-sum-exp rule, so the order in which blocks arrive does not matter.
//
// Ring backward. K and V go round again; dQ accumulates locally. The dK, dV
// partial sums of a K/V block follow it one step behind: at step s a rank
// computes its share for the block it holds into a fresh buffer while the
// partial sum from the ranks before it is in flight, adds the two, and sends
// the sum on with the next step's exchange. After the last step the sums,
// now complete, take one more hop home (that exchange carries only dK, dV):
// cp exchanges in all, each issued by every rank in the same order. Under
// bf16 K/V and the dK/dV sums travel in bf16 (the sums rounded before each
// hop and widened on arrival; each rank adds its share in fp32).
//
// Grouped-query attention (KV kv heads, r = H/KV query heads each): the
// ring carries k and v of the KV heads only, so its K/V and dK/dV messages
// are r times smaller than multi-head attention's. Each block pair is r
// calls of the block kernel, call j taking query heads g r + j of every kv
// head g; dK, dV sum the r calls' shares in the order j = 0..r-1.
//
// Every exchange is accounted by the cp Communicator itself (calls, bytes,
// time, exposed time).
#include <vector>

#include "comm/communicator.hpp"
#include "core/types.hpp"
#include "kernels/attention.hpp"

namespace ndmini {

// Where the local rows of a cp rank sit in the sequence.
struct CpLayout {
  int cp = 1;       // ranks in the cp group
  int rank = 0;     // this rank in it
  int seq_len = 0;  // T, the whole sequence

  int chunk_len() const { return cp > 1 ? seq_len / (2 * cp) : seq_len; }
  int local_len() const { return seq_len / cp; }
  // The chunk (of 2cp) that local half 0 or 1 holds; with cp = 1 a single chunk 0.
  int chunk(int half) const { return half == 0 ? rank : 2 * cp - 1 - rank; }
  // Absolute position of local row t (0 <= t < local_len()) of a sequence.
  int position(int local_t) const {
    if (cp == 1) return local_t;
    const int c = chunk_len();
    return chunk(local_t / c) * c + local_t % c;
  }
};

// The layout of rank `rank` of `cp`; throws Error naming model.seq_len and
// parallel.cp unless T is divisible by 2*cp (any T when cp = 1).
CpLayout make_cp_layout(int seq_len, int cp, int rank);

class ContextParallelAttention {
 public:
  // cp: the cp group (nullptr or size 1: no ring; the group must outlive
  // this object). local: B, seq_len = local rows per sequence (T/cp),
  // channels = C/tp (local heads x hs), heads = H/tp, kv_heads = KV/tp
  // (0: heads; must divide heads). Allocates its scratch
  // once, in MemSpace; it holds nothing between calls, so one object can
  // serve every layer. causal = false gives full attention (tests). bf16:
  // mixed precision: q, k, v (kept, and sent round the ring) and dO are
  // bf16, the products take bf16 operands; O, LSE, D and dq, dk, dv fp32.
  ContextParallelAttention(Communicator* cp, const kernels::AttentionShape& local, int seq_len_global,
                           bool causal = true, bool bf16 = false);

  // What one forward keeps for its backward: head-major q, k, v and the
  // log-sum-exp of every query row. The caller owns the memory (e.g. per
  // layer and micro-batch in flight), sized by qkvh_size() and lse_size().
  struct Saved {
    Slice1D qkvh;           // q [B, H, T/cp, hs], k and v [B, KV, T/cp, hs]
    Slice1D lse;            // [B, H, T/cp]
    Bf16Slice1D qkvh_bf16;  // instead of qkvh under bf16
  };
  static std::size_t qkvh_size(const kernels::AttentionShape& local) { return local.qkvh_size(); }
  static std::size_t lse_size(const kernels::AttentionShape& local) { return local.rows_size(); }

  // The floats of the scratch one ContextParallelAttention allocates (its
  // constructor and the memory estimate use these): head-major O / dO, D,
  // dq dk dv and the block kernel's tile always; the ring's K/V and dK/dV
  // buffers when cp > 1.
  // Under bf16: dO and the tiles' bf16 rounding in bf16 values, the
  // ring's K/V blocks, bf16 values two to a float slot (kv counts floats),
  // and the dK/dV sums on the wire (one outgoing, one arriving).
  struct Buffers {
    std::size_t heads = 0, delta = 0, dqkvh = 0, scratch = 0;
    std::size_t kv = 0, dkv = 0, dkv_in = 0;      // ring: each of kv and dkv twice (double buffers)
    std::size_t dout_bf16 = 0, scratch_bf16 = 0;  // bf16 values
    std::size_t dkv_wire = 0;                     // bf16 values, twice (out and in): bf16 with a ring
    std::size_t bytes() const {
      return (heads + delta + dqkvh + scratch + 2 * kv + 2 * dkv + dkv_in) * sizeof(real) +
             (dout_bf16 + scratch_bf16 + 2 * dkv_wire) * sizeof(bf16);
    }
  };
  static Buffers buffer_sizes(const kernels::AttentionShape& local, int cp, bool bf16 = false);

  // qkv [B*T/cp, (H + 2 KV) hs] token-major (the c_attn output, local
  // heads; qkv_width() columns) -> out [B*T/cp, C]
  // token-major; writes saved's buffers. Collective over the cp group.
  void forward(Slice2D out, ConstSlice2D qkv, const Saved& saved);
  // dout [B*T/cp, C] -> dqkv [B*T/cp, qkv_width()] (overwritten). `out` is the
  // forward's output (for D = rowsum(dO * O)). Collective over the cp group.
  void backward(Slice2D dqkv, ConstSlice2D dout, ConstSlice2D out, const Saved& saved);

  const CpLayout& layout() const { return layout_; }
  const kernels::AttentionShape& local_shape() const { return shape_; }

 private:
  // The ring with q, k, v of element type T (fp32, or bf16) at qkvh, and dO
  // (backward) at dout_heads.
  template <class T>
  void forward_ring(T* qkvh, const Saved& saved);
  template <class T>
  void backward_ring(const T* qkvh, const T* dout_heads, const Saved& saved);
  // The block pairs of one ring step: local q chunks against the two k
  // chunks of rank src, held at kv (k part, then v part).
  // `req` is the exchange in flight, polled between pairs so it progresses.
  template <class T>
  void forward_step(int src, const T* qkvh, const T* kv, const Saved& saved, CommRequest& req);
  template <class T>
  void backward_step(int src, const T* qkvh, const T* kv, const T* dout_heads, real* dkv, const Saved& saved,
                     CommRequest& req);
  // The block kernels with this object's scratch, for fp32 or bf16 operands.
  bool block_forward(kernels::HeadRows o, kernels::HeadRows lse, kernels::ConstHeadRows q, kernels::ConstHeadRows k,
                     kernels::ConstHeadRows v, const kernels::AttentionBlock& blk);
  bool block_forward(kernels::HeadRows o, kernels::HeadRows lse, kernels::ConstBf16HeadRows q,
                     kernels::ConstBf16HeadRows k, kernels::ConstBf16HeadRows v, const kernels::AttentionBlock& blk);
  bool block_backward(kernels::HeadRows dq, kernels::HeadRows dk, kernels::HeadRows dv, kernels::ConstHeadRows q,
                      kernels::ConstHeadRows k, kernels::ConstHeadRows v, kernels::ConstHeadRows dout,
                      kernels::ConstHeadRows lse, kernels::ConstHeadRows delta, const kernels::AttentionBlock& blk);
  bool block_backward(kernels::HeadRows dq, kernels::HeadRows dk, kernels::HeadRows dv, kernels::ConstBf16HeadRows q,
                      kernels::ConstBf16HeadRows k, kernels::ConstBf16HeadRows v, kernels::ConstBf16HeadRows dout,
                      kernels::ConstHeadRows lse, kernels::ConstHeadRows delta, const kernels::AttentionBlock& blk);
  void check(const Saved& saved, std::size_t rows, std::size_t out_cols, std::size_t qkv_cols) const;
  kernels::HeadRows chunk_rows(real* base, int half, std::size_t head_stride, int width) const;
  kernels::ConstHeadRows chunk_rows(const real* base, int half, std::size_t head_stride, int width) const;
  kernels::ConstBf16HeadRows chunk_rows(const bf16* base, int half, std::size_t head_stride, int width) const;
  // Rows of local half `half` of query heads g r + j (g over the B x KV kv
  // heads) of a q-shaped buffer (q, O, dO, dq: width hs; LSE, D: width 1):
  // the q side of call j of grouped-query attention (r = group()).
  template <class P>
  auto query_rows(P* base, int half, int j, int width) const;
  kernels::AttentionBlock block(int q_half, int src, int k_half) const;
  // The ring's dK/dV hop: adds to ops_ the send of the sum `out` to `next`
  // and the receive of `prev`'s into `in` (under bf16 into the wire buffer:
  // widen_arrived_dkv(in) then writes it to `in`).
  void add_dkv_exchange(const View1D& out, real* in, int next, int prev);
  void widen_arrived_dkv(real* in);
  // Floats of one K/V message: the k and v parts (kv heads only) of T values.
  template <class T>
  std::size_t kv_floats() const {
    return 2 * shape_.kv_part_size() * sizeof(T) / sizeof(real);
  }

  Communicator* comm_ = nullptr;  // null without a ring
  kernels::AttentionShape shape_;
  CpLayout layout_;
  bool causal_, bf16_;
  View1D heads_;                         // O (forward) / dO (backward), head-major [B, H, T/cp, hs]
  View1D delta_;                         // D = rowsum(dO * O), [B, H, T/cp]
  View1D dqkvh_;                         // dq, dk, dv head-major
  View1D scratch_;                       // the block kernel's tile
  View1D kv_[2];                         // ring: K/V blocks received (double buffer)
  View1D dkv_[2];                        // ring: dK/dV partial sums being built / being sent
  View1D dkv_in_;                        // ring: the partial sum arriving from rank - 1
  Bf16View1D dout_bf16_, scratch_bf16_;  // bf16: dO head-major, the tiles rounded
  Bf16View1D dkv_wire_[2];               // bf16 with a ring: a dK/dV sum rounded to send / arriving
  std::vector<P2POp> ops_;
};

}  // namespace ndmini
