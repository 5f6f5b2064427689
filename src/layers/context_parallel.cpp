// SPDX-License-Identifier: BSD-3-Clause
#include "layers/context_parallel.hpp"

#include <string>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

// Tags keep the two streams of the backward ring apart (with cp = 2 the
// next and the previous rank are the same peer).
constexpr int kKvTag = 1;
constexpr int kDkvTag = 2;

// dst += src, elementwise.
void accumulate(View1D dst, const View1D& src) {
  real* d = dst.data();
  const real* s = src.data();
  Kokkos::parallel_for(
      "ndmini::cp_accumulate", Kokkos::RangePolicy<ExecSpace>(0, dst.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { d[i] += s[i]; });
}

}  // namespace

CpLayout make_cp_layout(int seq_len, int cp, int rank) {
  if (cp < 1 || rank < 0 || rank >= cp)
    throw Error("context parallelism: rank " + std::to_string(rank) + " is not in a cp group of " + std::to_string(cp));
  if (seq_len < 1) throw Error("model.seq_len = " + std::to_string(seq_len) + " must be positive");
  if (cp > 1 && seq_len % (2 * cp) != 0)
    throw Error("model.seq_len = " + std::to_string(seq_len) +
                " is not divisible by 2 x parallel.cp = " + std::to_string(2 * cp) +
                ": context parallelism cuts each sequence into 2*cp equal chunks; choose a seq_len that is a "
                "multiple of " +
                std::to_string(2 * cp) + " or a smaller cp");
  return CpLayout{cp, rank, seq_len};
}

ContextParallelAttention::ContextParallelAttention(Communicator* cp, const kernels::AttentionShape& local,
                                                   int seq_len_global, bool causal, bool bf16)
    : comm_(cp != nullptr && cp->size() > 1 ? cp : nullptr), shape_(local), causal_(causal), bf16_(bf16) {
  layout_ = make_cp_layout(seq_len_global, comm_ ? comm_->size() : 1, comm_ ? comm_->rank() : 0);
  require(local.batch > 0 && local.heads > 0 && local.channels > 0 && local.channels % local.heads == 0,
          "ContextParallelAttention: batch, heads and channels must be positive, channels divisible by heads");
  if (local.kv_heads < 0 || local.heads % local.kv() != 0)
    throw Error("ContextParallelAttention: kv_heads = " + std::to_string(local.kv_heads) +
                " must divide heads = " + std::to_string(local.heads) + " (grouped-query attention)");
  if (local.seq_len != layout_.local_len())
    throw Error("ContextParallelAttention: local seq_len " + std::to_string(local.seq_len) +
                " is not T/cp = " + std::to_string(seq_len_global) + "/" + std::to_string(layout_.cp));
  if (bf16_ && local.part_size() % 2 != 0)  // K/V travel two bf16 values to a float slot
    throw Error("ContextParallelAttention: bf16 needs an even B x T/cp x C/tp, not " +
                std::to_string(local.part_size()));
  const Buffers b = buffer_sizes(shape_, layout_.cp, bf16_);
  heads_ = View1D("cp_attention_heads", b.heads);
  delta_ = View1D("cp_attention_delta", b.delta);
  dqkvh_ = View1D("cp_attention_dqkvh", b.dqkvh);
  scratch_ = View1D("cp_attention_scratch", b.scratch);
  if (bf16_) {
    dout_bf16_ = Bf16View1D("cp_attention_dout_bf16", b.dout_bf16);
    scratch_bf16_ = Bf16View1D("cp_attention_scratch_bf16", b.scratch_bf16);
  }
  if (comm_) {
    for (int i = 0; i < 2; ++i) {
      kv_[i] = View1D("cp_attention_kv", b.kv);
      dkv_[i] = View1D("cp_attention_dkv", b.dkv);
    }
    dkv_in_ = View1D("cp_attention_dkv_in", b.dkv_in);
    if (b.dkv_wire > 0)
      for (Bf16View1D& w : dkv_wire_) w = uninitialized_bf16("cp_attention_dkv_wire", b.dkv_wire);
    ops_.reserve(4);
  }
}

ContextParallelAttention::Buffers ContextParallelAttention::buffer_sizes(const kernels::AttentionShape& local, int cp,
                                                                         bool bf16) {
  Buffers b;
  const std::size_t part = local.part_size(), kv_part = local.kv_part_size();
  const int block_rows = cp > 1 ? local.seq_len / 2 : local.seq_len;  // CpLayout::chunk_len()
  b.heads = part;
  b.delta = local.rows_size();
  b.dqkvh = local.qkvh_size();
  // A block call batches B x KV heads (one query head of each kv head).
  b.scratch = kernels::attention_block_scratch_size(block_rows, block_rows, local.batch * local.kv());
  if (bf16) {
    b.dout_bf16 = part;
    b.scratch_bf16 = b.scratch;
  }
  if (cp > 1) {                           // the ring carries k and v of the kv heads only
    b.kv = bf16 ? kv_part : 2 * kv_part;  // bf16: 2 kv_part values, two to a float
    b.dkv = b.dkv_in = 2 * kv_part;
    if (bf16) b.dkv_wire = 2 * kv_part;
  }
  return b;
}

kernels::HeadRows ContextParallelAttention::chunk_rows(real* base, int half, std::size_t head_stride, int width) const {
  const int c = layout_.chunk_len();
  return {base + static_cast<std::size_t>(half) * c * width, head_stride, c};
}
kernels::ConstHeadRows ContextParallelAttention::chunk_rows(const real* base, int half, std::size_t head_stride,
                                                            int width) const {
  const int c = layout_.chunk_len();
  return {base + static_cast<std::size_t>(half) * c * width, head_stride, c};
}
kernels::ConstBf16HeadRows ContextParallelAttention::chunk_rows(const bf16* base, int half, std::size_t head_stride,
                                                                int width) const {
  const int c = layout_.chunk_len();
  return {base + static_cast<std::size_t>(half) * c * width, head_stride, c};
}

template <class P>
auto ContextParallelAttention::query_rows(P* base, int half, int j, int width) const {
  const std::size_t head = static_cast<std::size_t>(shape_.seq_len) * width;
  return chunk_rows(base + j * head, half, shape_.group() * head, width);
}

kernels::AttentionBlock ContextParallelAttention::block(int q_half, int src, int k_half) const {
  const CpLayout src_layout{layout_.cp, src, layout_.seq_len};
  const int c = layout_.chunk_len();
  return {shape_.batch * shape_.kv(),
          shape_.head_size(),
          layout_.chunk(q_half) * c,
          src_layout.chunk(k_half) * c,
          causal_,
          0};
}

bool ContextParallelAttention::block_forward(kernels::HeadRows o, kernels::HeadRows lse, kernels::ConstHeadRows q,
                                             kernels::ConstHeadRows k, kernels::ConstHeadRows v,
                                             const kernels::AttentionBlock& blk) {
  return kernels::attention_block_forward(o, lse, q, k, v, blk, scratch_);
}
bool ContextParallelAttention::block_forward(kernels::HeadRows o, kernels::HeadRows lse, kernels::ConstBf16HeadRows q,
                                             kernels::ConstBf16HeadRows k, kernels::ConstBf16HeadRows v,
                                             const kernels::AttentionBlock& blk) {
  return kernels::attention_block_forward(o, lse, q, k, v, blk, scratch_, scratch_bf16_);
}
bool ContextParallelAttention::block_backward(kernels::HeadRows dq, kernels::HeadRows dk, kernels::HeadRows dv,
                                              kernels::ConstHeadRows q, kernels::ConstHeadRows k,
                                              kernels::ConstHeadRows v, kernels::ConstHeadRows dout,
                                              kernels::ConstHeadRows lse, kernels::ConstHeadRows delta,
                                              const kernels::AttentionBlock& blk) {
  return kernels::attention_block_backward(dq, dk, dv, q, k, v, dout, lse, delta, blk, scratch_);
}
bool ContextParallelAttention::block_backward(kernels::HeadRows dq, kernels::HeadRows dk, kernels::HeadRows dv,
                                              kernels::ConstBf16HeadRows q, kernels::ConstBf16HeadRows k,
                                              kernels::ConstBf16HeadRows v, kernels::ConstBf16HeadRows dout,
                                              kernels::ConstHeadRows lse, kernels::ConstHeadRows delta,
                                              const kernels::AttentionBlock& blk) {
  return kernels::attention_block_backward(dq, dk, dv, q, k, v, dout, lse, delta, blk, scratch_, scratch_bf16_);
}

void ContextParallelAttention::check(const Saved& saved, std::size_t rows, std::size_t out_cols,
                                     std::size_t qkv_cols) const {
  const std::size_t C = shape_.channels, W = shape_.qkv_width();
  const std::size_t held = bf16_ ? saved.qkvh_bf16.extent(0) : saved.qkvh.extent(0);
  if (held < qkvh_size(shape_) || saved.lse.extent(0) < lse_size(shape_))
    throw Error("ContextParallelAttention: Saved buffers smaller than qkvh_size() / lse_size()");
  if (rows != static_cast<std::size_t>(shape_.batch) * shape_.seq_len || out_cols != C || qkv_cols != W)
    throw Error(
        "ContextParallelAttention: activations are not [B*T/cp, C] and [B*T/cp, (H + 2 KV) hs] of the "
        "local shape");
}

void ContextParallelAttention::forward(Slice2D out, ConstSlice2D qkv, const Saved& saved) {
  check(saved, qkv.extent(0), out.extent(1), qkv.extent(1));
  if (out.extent(0) != qkv.extent(0)) throw Error("ContextParallelAttention::forward: out and qkv differ in rows");
  if (bf16_) {
    kernels::attention_split_qkv(saved.qkvh_bf16, heads_, saved.lse, qkv, shape_);
    forward_ring(saved.qkvh_bf16.data(), saved);
  } else {
    kernels::attention_split_qkv(saved.qkvh, heads_, saved.lse, qkv, shape_);
    forward_ring(saved.qkvh.data(), saved);
  }
  kernels::attention_merge_heads(out, heads_, shape_);
}

template <class T>
void ContextParallelAttention::forward_ring(T* qkvh, const Saved& saved) {
  if (!comm_) {
    const int T_len = shape_.seq_len, hs = shape_.head_size();
    const std::size_t stride = static_cast<std::size_t>(T_len) * hs;
    using Rows = decltype(chunk_rows(static_cast<const T*>(qkvh), 0, 0, 0));
    const T* q = qkvh;
    for (int j = 0; j < shape_.group(); ++j)
      block_forward(query_rows(heads_.data(), 0, j, hs), query_rows(saved.lse.data(), 0, j, 1), query_rows(q, 0, j, hs),
                    Rows{qkvh + shape_.k_offset(), stride, T_len}, Rows{qkvh + shape_.v_offset(), stride, T_len},
                    {shape_.batch * shape_.kv(), hs, 0, 0, causal_, 0});
    return;
  }
  const int cp = comm_->size(), r = comm_->rank(), next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  const T* kv = qkvh + shape_.k_offset();  // k and v parts are adjacent: one message
  for (int s = 0; s < cp; ++s) {
    CommRequest req;
    if (s < cp - 1) {
      // A transfer moves bits: bf16 values travel two to a float slot.
      ops_.clear();
      ops_.push_back({P2POp::Kind::send, reinterpret_cast<real*>(const_cast<T*>(kv)), kv_floats<T>(), next, kKvTag});
      ops_.push_back({P2POp::Kind::recv, kv_[s % 2].data(), kv_floats<T>(), prev, kKvTag});
      req = comm_->batch_p2p(ops_);
    }
    forward_step((r - s + cp) % cp, static_cast<const T*>(qkvh), kv, saved, req);
    req.wait();
    kv = reinterpret_cast<const T*>(kv_[s % 2].data());
  }
}

template <class T>
void ContextParallelAttention::forward_step(int src, const T* qkvh, const T* kv, const Saved& saved, CommRequest& req) {
  const std::size_t kv_part = shape_.kv_part_size(),
                    stride = static_cast<std::size_t>(shape_.seq_len) * shape_.head_size();
  const int hs = shape_.head_size();
  for (int qh = 0; qh < 2; ++qh)
    for (int kh = 0; kh < 2; ++kh) {
      // Call j: query heads g r + j against kv head g.
      for (int j = 0; j < shape_.group(); ++j)
        block_forward(query_rows(heads_.data(), qh, j, hs), query_rows(saved.lse.data(), qh, j, 1),
                      query_rows(qkvh, qh, j, hs), chunk_rows(kv, kh, stride, hs),
                      chunk_rows(kv + kv_part, kh, stride, hs), block(qh, src, kh));
      req.test();  // lets the transfer in flight progress (MPI progresses inside its calls)
    }
}

void ContextParallelAttention::backward(Slice2D dqkv, ConstSlice2D dout, ConstSlice2D out, const Saved& saved) {
  check(saved, dqkv.extent(0), dout.extent(1), dqkv.extent(1));
  if (dout.extent(0) != dqkv.extent(0) || out.extent(0) != dqkv.extent(0) || out.extent(1) != dout.extent(1))
    throw Error("ContextParallelAttention::backward: dqkv, dout and out differ in shape");
  // Without a ring dk, dv accumulate in place; with one the final exchange
  // writes them, so only dq needs zeroing.
  const int zero_parts = comm_ ? 1 : 3;
  if (bf16_) {
    kernels::attention_backward_prologue(dout_bf16_, delta_, dqkvh_, zero_parts, dout, out, shape_);
    backward_ring<bf16>(saved.qkvh_bf16.data(), dout_bf16_.data(), saved);
  } else {
    kernels::attention_backward_prologue(heads_, delta_, dqkvh_, zero_parts, dout, out, shape_);
    backward_ring<real>(saved.qkvh.data(), heads_.data(), saved);
  }
  kernels::attention_merge_qkv(dqkv, dqkvh_, shape_);
}

template <class T>
void ContextParallelAttention::backward_ring(const T* qkvh, const T* dout_heads, const Saved& saved) {
  const std::size_t k_off = shape_.k_offset(), v_off = shape_.v_offset();
  if (!comm_) {
    const int T_len = shape_.seq_len, hs = shape_.head_size();
    const std::size_t stride = static_cast<std::size_t>(T_len) * hs;
    using Rows = decltype(chunk_rows(qkvh, 0, 0, 0));
    real* dq = dqkvh_.data();
    // dk, dv sum the r calls' shares, in the fixed order j = 0..r-1.
    for (int j = 0; j < shape_.group(); ++j)
      block_backward(query_rows(dq, 0, j, hs), {dq + k_off, stride, T_len}, {dq + v_off, stride, T_len},
                     query_rows(qkvh, 0, j, hs), Rows{qkvh + k_off, stride, T_len}, Rows{qkvh + v_off, stride, T_len},
                     query_rows(dout_heads, 0, j, hs), query_rows(static_cast<const real*>(saved.lse.data()), 0, j, 1),
                     query_rows(static_cast<const real*>(delta_.data()), 0, j, 1),
                     {shape_.batch * shape_.kv(), hs, 0, 0, causal_, 0});
    return;
  }
  const int cp = comm_->size(), r = comm_->rank(), next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  const T* kv = qkvh + k_off;
  for (int s = 0; s < cp; ++s) {
    ops_.clear();
    if (s < cp - 1) {  // the next K/V block (bf16: two values to a float slot)
      ops_.push_back({P2POp::Kind::send, reinterpret_cast<real*>(const_cast<T*>(kv)), kv_floats<T>(), next, kKvTag});
      ops_.push_back({P2POp::Kind::recv, kv_[s % 2].data(), kv_floats<T>(), prev, kKvTag});
    }
    if (s > 0) add_dkv_exchange(dkv_[(s - 1) % 2], dkv_in_.data(), next, prev);
    CommRequest req = comm_->batch_p2p(ops_);
    View1D& dkv = dkv_[s % 2];
    Kokkos::deep_copy(dkv, real(0));
    backward_step((r - s + cp) % cp, qkvh, kv, dout_heads, dkv.data(), saved, req);
    req.wait();
    if (s > 0) {
      widen_arrived_dkv(dkv_in_.data());
      accumulate(dkv, dkv_in_);
    }
    kv = reinterpret_cast<const T*>(kv_[s % 2].data());
  }
  // The complete sums go home: ours arrives from rank r-1 into dk, dv.
  ops_.clear();
  add_dkv_exchange(dkv_[(cp - 1) % 2], dqkvh_.data() + k_off, next, prev);
  comm_->batch_p2p(ops_).wait();
  widen_arrived_dkv(dqkvh_.data() + k_off);
}

// The dK/dV sum `out` to the next rank and the previous rank's into `in`
// (2 kv parts each); under bf16 both through the wire buffers.
void ContextParallelAttention::add_dkv_exchange(const View1D& out, real* in, int next, int prev) {
  const std::size_t n = 2 * shape_.kv_part_size();
  if (!bf16_) {
    ops_.push_back({P2POp::Kind::send, out.data(), n, next, kDkvTag});
    ops_.push_back({P2POp::Kind::recv, in, n, prev, kDkvTag});
    return;
  }
  kernels::round_to_bf16(dkv_wire_[0], out);
  ops_.push_back({P2POp::Kind::send, reinterpret_cast<real*>(dkv_wire_[0].data()), n / 2, next, kDkvTag});
  ops_.push_back({P2POp::Kind::recv, reinterpret_cast<real*>(dkv_wire_[1].data()), n / 2, prev, kDkvTag});
}

void ContextParallelAttention::widen_arrived_dkv(real* in) {
  if (bf16_) kernels::widen_bf16(Slice1D(in, dkv_wire_[1].extent(0)), dkv_wire_[1]);
}

template <class T>
void ContextParallelAttention::backward_step(int src, const T* qkvh, const T* kv, const T* dout_heads, real* dkv,
                                             const Saved& saved, CommRequest& req) {
  const std::size_t kv_part = shape_.kv_part_size(),
                    stride = static_cast<std::size_t>(shape_.seq_len) * shape_.head_size();
  const int hs = shape_.head_size();
  for (int qh = 0; qh < 2; ++qh)
    for (int kh = 0; kh < 2; ++kh) {
      // dk, dv of kv head g sum the shares of its r query heads, j = 0..r-1 in order.
      for (int j = 0; j < shape_.group(); ++j)
        block_backward(query_rows(dqkvh_.data(), qh, j, hs), chunk_rows(dkv, kh, stride, hs),
                       chunk_rows(dkv + kv_part, kh, stride, hs), query_rows(qkvh, qh, j, hs),
                       chunk_rows(kv, kh, stride, hs), chunk_rows(kv + kv_part, kh, stride, hs),
                       query_rows(dout_heads, qh, j, hs),
                       query_rows(static_cast<const real*>(saved.lse.data()), qh, j, 1),
                       query_rows(static_cast<const real*>(delta_.data()), qh, j, 1), block(qh, src, kh));
      req.test();
    }
}

}  // namespace ndmini
