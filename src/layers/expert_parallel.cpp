// SPDX-License-Identifier: BSD-3-Clause
// ExpertParallel: routing on the host (it decides the exchange's counts),
// the rows moved and combined by kernels (kernels/moe_kernels.cpp), one
// product per local expert (kernels::linear_forward/backward).
#include "layers/expert_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <type_traits>
#include <utility>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

template <class T>
constexpr bool kBf16 = std::is_same_v<T, bf16>;

using IntView = Kokkos::View<int*, MemSpace>;

void copy_to_device(const IntView& dst, const std::vector<int>& src) {
  const auto host = Kokkos::create_mirror_view(dst);
  for (std::size_t i = 0; i < src.size(); ++i) host(i) = src[i];
  Kokkos::deep_copy(dst, host);
}

// Rows [first, first + n) of a [rows, cols] matrix.
template <class M>
M rows_of(const M& m, std::size_t first, std::size_t n) {
  return M(m.data() + first * m.extent(1), n, m.extent(1));
}

// A kept operand's values as [rows, cols] (T: real or bf16).
template <class T>
Matrix<T> kept(const KeptOperand& k, std::size_t rows, std::size_t cols) {
  return k.as<T>(rows, cols);
}

// An expert's matrix out of the stacked [E rows, cols] tensor.
template <class M>
M expert_matrix(const M& stacked, int expert, std::size_t rows) {
  return rows_of(stacked, static_cast<std::size_t>(expert) * rows, rows);
}
Slice1D expert_vector(const Slice1D& stacked, int expert, std::size_t n) {
  return stacked.extent(0) > 0 ? Slice1D(stacked.data() + static_cast<std::size_t>(expert) * n, n) : Slice1D();
}

std::size_t rows_bound(double max_load, int ep, std::size_t rows, int k, int experts) {
  const std::size_t worst = static_cast<std::size_t>(ep) * rows;  // every token of the group, once
  if (max_load == 0) return worst;
  const double mean = static_cast<double>(ep) * rows * k / experts;
  return std::min(worst, static_cast<std::size_t>(std::ceil(max_load * mean)));
}

}  // namespace

MoeSizes ExpertParallel::sizes_of(const ModelConfig& m, double max_load, int ep, std::size_t rows, bool bf16) {
  MoeSizes s;
  s.rows = rows;
  s.slots = static_cast<std::size_t>(m.moe_top_k);
  s.experts = static_cast<std::size_t>(m.moe_experts);
  s.ep = static_cast<std::size_t>(ep);
  s.channels = static_cast<std::size_t>(m.channels);
  s.hidden = static_cast<std::size_t>(m.moe_ffn());
  s.gated = m.gated();
  s.bf16 = bf16;
  // What may arrive here: each local expert up to its bound, and never
  // more than the group's rows times the slots that can land on this rank.
  const std::size_t local = s.experts / s.ep;
  const std::size_t bound = rows_bound(max_load, ep, rows, m.moe_top_k, m.moe_experts);
  s.capacity = std::min(local * bound, s.ep * rows * std::min(s.slots, local));
  return s;
}

std::size_t MoeSizes::kept_bytes() const {
  const std::size_t element = bf16 ? sizeof(ndmini::bf16) : sizeof(real);
  const std::size_t operands = capacity * channels + capacity * hidden * (gated ? 3 : 2) + rows * slots * channels;
  return operands * element;
}

std::size_t MoeSizes::scratch_bytes() const {
  const std::size_t A = rows * slots, Q = capacity, wire = std::max(A, Q) * channels;
  std::size_t floats = 2 * rows * experts + 2 * Q * channels + Q * hidden * (gated ? 2 : 1) + A;
  if (bf16) floats += rows * channels;  // x widened for the router
  std::size_t bytes = floats * sizeof(real) + 2 * wire * (bf16 ? sizeof(ndmini::bf16) : sizeof(real));
  if (bf16) bytes += Q * std::max(channels, hidden) * sizeof(ndmini::bf16);  // dy rounded for the products
  bytes += (A + A + 2 * Q) * sizeof(int) + A * sizeof(real);                 // the exchange's indices and weights
  if (ep > 1) bytes += (experts + ep * experts) * sizeof(real);              // the counts' exchange
  return bytes;
}

ExpertParallel::ExpertParallel(const ModelConfig& m, double max_load, Communicator* group, std::size_t rows,
                               std::vector<int> positions, bool bf16)
    : m_(m), group_(group != nullptr && group->size() > 1 ? group : nullptr), positions_(std::move(positions)) {
  ep_ = group_ != nullptr ? group_->size() : 1;
  ep_rank_ = group_ != nullptr ? group_->rank() : 0;
  if (m.moe_experts % ep_ != 0) throw InternalError("the expert group does not divide the experts");
  local_experts_ = m.moe_experts / ep_;
  first_expert_ = ep_rank_ * local_experts_;
  if (positions_.size() != rows) throw InternalError("the balanced router needs the position of every routed row");
  bound_ = rows_bound(max_load, ep_, rows, m.moe_top_k, m.moe_experts);
  sizes_ = sizes_of(m, max_load, ep_, rows, bf16);
  const MoeSizes& s = sizes_;
  const std::size_t A = s.rows * s.slots, Q = s.capacity, C = s.channels, F = s.hidden;
  const std::size_t wire = std::max(A, Q) * C;
  logits_ = uninitialized("ndmini::moe_logits", s.rows * s.experts);
  out_rows_ = uninitialized("ndmini::moe_expert_rows", Q * C);
  row_grad_ = uninitialized("ndmini::moe_row_grad", Q * C);
  hidden_grad_ = uninitialized("ndmini::moe_hidden_grad", Q * F);
  if (s.gated) up_grad_ = uninitialized("ndmini::moe_up_grad", Q * F);
  dweight_ = uninitialized("ndmini::moe_dweight", A);
  if (bf16) {
    x_fp32_ = uninitialized("ndmini::moe_x_widened", s.rows * C);
    wire_bf16_send_ = uninitialized_bf16("ndmini::moe_wire_send", wire);
    wire_bf16_recv_ = uninitialized_bf16("ndmini::moe_wire_recv", wire);
    dy_bf16_ = uninitialized_bf16("ndmini::moe_dy_bf16", Q * std::max(C, F));
  } else {
    wire_fp32_send_ = uninitialized("ndmini::moe_wire_send", wire);
    wire_fp32_recv_ = uninitialized("ndmini::moe_wire_recv", wire);
  }
  send_row_ = IntView("ndmini::moe_send_row", A);
  slot_position_ = IntView("ndmini::moe_slot_position", A);
  expert_major_ = IntView("ndmini::moe_expert_major", Q);
  received_order_ = IntView("ndmini::moe_received_order", Q);
  weight_ = View1D("ndmini::moe_weight", A);
  dlogits_ = uninitialized("ndmini::moe_dlogits", s.rows * s.experts);
  if (group_ != nullptr) {
    counts_send_ = View1D("ndmini::moe_counts_send", s.experts);
    counts_recv_ = View1D("ndmini::moe_counts", ep_ * s.experts);
  }
}

void ExpertParallel::set_aux_losses(MoeAuxLosses aux) {
  if (aux.seq_aux != 0) {
    if (aux.sequences.size() != sizes_.rows || aux.seq_len <= 0 || aux.micro_batch <= 0 ||
        *std::max_element(aux.sequences.begin(), aux.sequences.end()) >= aux.micro_batch)
      throw InternalError("the sequence-wise aux loss needs the sequence of every routed row");
    sequences_ = aux.micro_batch;
  }
  aux_ = std::move(aux);
}

void ExpertParallel::set_routing_log(MoeRoutingLog* log, std::vector<int> sequences) {
  if (log != nullptr && sequences.size() != sizes_.rows)
    throw InternalError("the MoE routing log needs the sequence of every routed row");
  log_ = log;
  row_sequence_ = std::move(sequences);
}

MoeToken ExpertParallel::token_of(std::size_t row) const {
  MoeToken t = log_->next;
  t.sequence += row_sequence_[row];
  t.position = positions_[row];
  return t;
}

MoeActivations ExpertParallel::allocate() const {
  const MoeSizes& s = sizes_;
  const std::size_t Q = s.capacity, C = s.channels, F = s.hidden, A = s.rows * s.slots;
  MoeActivations a;
  auto operand = [&](KeptOperand& k, const char* label, std::size_t n) {
    if (s.bf16)
      k.bf16 = uninitialized_bf16(std::string(label) + "_bf16", n);
    else
      k.fp32 = uninitialized(label, n);
  };
  operand(a.received, "ndmini::moe_received", Q * C);
  operand(a.hidden, "ndmini::moe_hidden", Q * F);
  if (s.gated) operand(a.hidden_up, "ndmini::moe_hidden_up", Q * F);
  operand(a.activated, "ndmini::moe_activated", Q * F);
  operand(a.returned, "ndmini::moe_returned", A * C);
  return a;
}

// ---- routing ------------------------------------------------------------------

double ExpertParallel::route(ConstSlice2D x, const ExpertTensors& w, MoeActivations& a) {
  const std::size_t R = sizes_.rows, E = sizes_.experts, k = sizes_.slots;
  kernels::linear_forward<real>(as_matrix(logits_, R, E), x, w.router, Slice1D());
  const auto device_logits = Kokkos::create_mirror_view_and_copy(HostSpace(), logits_);
  a.logit.assign(device_logits.data(), device_logits.data() + R * E);
  const std::vector<real>& logits = a.logit;
  std::vector<real> bias(E, 0);
  if (w.selection_bias.extent(0) > 0) {
    const auto b = Kokkos::create_mirror_view_and_copy(HostSpace(), w.selection_bias);
    for (std::size_t e = 0; e < E; ++e) bias[e] = b(e);
  }
  a.expert.assign(R * k, 0);
  a.weight.assign(R * k, 0);
  a.score.assign(R * E, 0);
  const bool sigmoid = m_.moe_score == MoeScore::sigmoid && m_.moe_router == MoeRouter::learned;
  std::vector<real> select(E);
  double z_sum = 0;  // the router z-loss: logsumexp(logits)^2 summed over the rows
  for (std::size_t r = 0; r < R; ++r) {
    const real* l = &logits[r * E];
    real* score = &a.score[r * E];
    const real top = *std::max_element(l, l + E);
    double sum = 0;
    for (std::size_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - top));
    const double lse = top + std::log(sum);
    z_sum += lse * lse;
    if (sigmoid) {
      for (std::size_t e = 0; e < E; ++e) score[e] = 1 / (1 + std::exp(-l[e]));
    } else {
      for (std::size_t e = 0; e < E; ++e) score[e] = static_cast<real>(std::exp(static_cast<double>(l[e] - top)) / sum);
    }
    std::int32_t* chosen = &a.expert[r * k];
    if (log_ != nullptr && log_->replay != nullptr) {
      // The recorded run's experts, in its slot order; the weights below are this run's scores.
      const MoeToken token = token_of(r);
      const auto it = log_->replay->find(token);
      if (it == log_->replay->end() || it->second.experts.size() != k)
        throw InternalError("the replayed MoE routing has no choice of " + std::to_string(k) +
                            " experts for the token at position " + std::to_string(token.position) + " of sequence " +
                            std::to_string(token.sequence) + " of batch " + std::to_string(token.batch) + " in block " +
                            std::to_string(token.layer) + " at step " + std::to_string(token.step));
      std::copy(it->second.experts.begin(), it->second.experts.end(), chosen);
    } else if (m_.moe_router == MoeRouter::balanced) {
      for (std::size_t j = 0; j < k; ++j) chosen[j] = static_cast<std::int32_t>((positions_[r] * k + j) % E);
    } else {
      // Top-k by score (plus the selection bias), ties to the lower expert id.
      for (std::size_t e = 0; e < E; ++e) select[e] = score[e] + bias[e];
      for (std::size_t j = 0; j < k; ++j) {
        std::size_t best = E;
        for (std::size_t e = 0; e < E; ++e) {
          if (select[e] == -INFINITY) continue;
          if (best == E || select[e] > select[best]) best = e;
        }
        chosen[j] = static_cast<std::int32_t>(best);
        select[best] = -INFINITY;
      }
    }
    if (log_ != nullptr && log_->record != nullptr) {
      MoeChoice& c = (*log_->record)[token_of(r)];
      c.experts.assign(chosen, chosen + k);
      c.select.resize(E);
      for (std::size_t e = 0; e < E; ++e) c.select[e] = score[e] + bias[e];
    }
    double chosen_sum = 0;
    for (std::size_t j = 0; j < k; ++j) chosen_sum += score[chosen[j]];
    for (std::size_t j = 0; j < k; ++j) a.weight[r * k + j] = static_cast<real>(score[chosen[j]] / chosen_sum);
  }
  return z_sum;
}

void ExpertParallel::exchange_counts(MoeActivations& a) {
  const std::size_t E = sizes_.experts;
  std::vector<std::int64_t> mine(E, 0);
  for (std::int32_t e : a.expert) ++mine[e];
  a.counts.assign(static_cast<std::size_t>(ep_) * E, 0);
  if (group_ == nullptr) {
    a.counts = mine;
  } else {
    // Counts travel as floats: exact below 2^24 rows per expert and micro-batch.
    const auto h = Kokkos::create_mirror_view(counts_send_);
    for (std::size_t e = 0; e < E; ++e) h(e) = static_cast<real>(mine[e]);
    Kokkos::deep_copy(counts_send_, h);
    group_->all_gather(counts_send_.data(), counts_recv_.data(), E);
    const auto all = Kokkos::create_mirror_view_and_copy(HostSpace(), counts_recv_);
    for (std::size_t i = 0; i < a.counts.size(); ++i) a.counts[i] = static_cast<std::int64_t>(all(i));
  }
  // Every member sees the same matrix: all stop here together, or none. The
  // other expert groups may route within the bound and go on: a JobError,
  // which ends the job rather than leave them waiting (ep rank 0 speaks).
  for (std::size_t e = 0; e < E; ++e) {
    std::int64_t load = 0;
    for (int src = 0; src < ep_; ++src) load += a.counts[src * E + e];
    if (load > static_cast<std::int64_t>(bound_)) {
      char mean[32];
      std::snprintf(mean, sizeof mean, "%.1f", static_cast<double>(ep_) * sizes_.rows * sizes_.slots / E);
      throw JobError("expert " + std::to_string(e) + " of an MoE block was sent " + std::to_string(load) +
                         " token rows in one micro-batch, above train.moe_max_load x the mean load (" +
                         std::to_string(bound_) + " rows; the mean is " + mean +
                         "): the router sends too many tokens to one expert; raise train.moe_max_load (0: no bound "
                         "short of every token), or balance the router (train.moe_seq_aux, train.moe_bias_rate)",
                     ep_rank_ == 0);
    }
  }
}

void ExpertParallel::plan_exchange(const MoeActivations& a) {
  const std::size_t E = sizes_.experts, k = sizes_.slots, R = sizes_.rows, A = R * k;
  const int El = local_experts_;
  // Send order: a stable counting sort of the assignments by expert (then
  // row, then slot: the order they are visited in).
  std::vector<std::int64_t> start(E + 1, 0);
  for (std::int32_t e : a.expert) ++start[e + 1];
  for (std::size_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int> send_row(A), slot_position(A);
  for (std::size_t s = 0; s < A; ++s) {
    const auto p = start[a.expert[s]]++;
    send_row[p] = static_cast<int>(s / k);
    slot_position[s] = static_cast<int>(p);
  }
  send_counts_.assign(ep_, 0);
  recv_counts_.assign(ep_, 0);
  for (int d = 0; d < ep_; ++d)
    for (int le = 0; le < El; ++le) {
      const std::size_t e = static_cast<std::size_t>(d) * El + le;
      send_counts_[d] += a.counts[ep_rank_ * E + e];
      recv_counts_[d] += a.counts[d * E + first_expert_ + le];
    }
  // Rows arrive by source rank, each source's by expert then row; the
  // experts read them by expert, then source rank (one rank's order).
  std::vector<std::int64_t> source_start(ep_ + 1, 0);
  for (int src = 0; src < ep_; ++src) source_start[src + 1] = source_start[src] + recv_counts_[src];
  const std::size_t Q = static_cast<std::size_t>(source_start[ep_]);
  if (Q > sizes_.capacity) throw InternalError("an MoE exchange receives more rows than its bound");
  std::vector<int> expert_major(Q), received_order(Q);
  expert_rows_.assign(El, 0);
  std::size_t q = 0;
  for (int le = 0; le < El; ++le)
    for (int src = 0; src < ep_; ++src) {
      std::int64_t at = source_start[src];
      for (int before = 0; before < le; ++before) at += a.counts[src * E + first_expert_ + before];
      const std::int64_t n = a.counts[src * E + first_expert_ + le];
      for (std::int64_t i = 0; i < n; ++i, ++q) {
        expert_major[q] = static_cast<int>(at + i);
        received_order[at + i] = static_cast<int>(q);
      }
      expert_rows_[le] += n;
    }
  copy_to_device(send_row_, send_row);
  copy_to_device(slot_position_, slot_position);
  copy_to_device(expert_major_, expert_major);
  copy_to_device(received_order_, received_order);
  const auto w = Kokkos::create_mirror_view(weight_);
  for (std::size_t s = 0; s < A; ++s) w(s) = a.weight[s];
  Kokkos::deep_copy(weight_, w);
}

void ExpertParallel::normalised_scores(const MoeActivations& a, std::size_t row, std::vector<double>& out) const {
  const std::size_t E = sizes_.experts;
  const real* score = &a.score[row * E];
  double sum = 1;
  if (m_.moe_score == MoeScore::sigmoid && m_.moe_router == MoeRouter::learned) {
    sum = 0;
    for (std::size_t e = 0; e < E; ++e) sum += score[e];
  }
  out.resize(E);
  for (std::size_t e = 0; e < E; ++e) out[e] = score[e] / sum;
}

// DeepSeek-V3's sequence-wise balance loss: per sequence, sum_e f_e P_e
// with f_e = E / (k T) x (the sequence's tokens routed to e) and P_e the
// mean over its T tokens of the normalised score of e. The rows of a
// sequence may lie on several ranks (cp, and tp with SP): the per-sequence
// sums run over those groups first.
double ExpertParallel::sequence_balance(MoeActivations& a) {
  const std::size_t E = sizes_.experts, k = sizes_.slots, R = sizes_.rows, S = sequences_;
  View1D sums("ndmini::moe_sequence_sums", 2 * S * E);  // counts, then score sums
  const auto h = Kokkos::create_mirror_view(sums);
  std::vector<double> p;
  for (std::size_t r = 0; r < R; ++r) {
    const std::size_t s = aux_.sequences[r];
    for (std::size_t j = 0; j < k; ++j) h(s * E + a.expert[r * k + j]) += 1;
    normalised_scores(a, r, p);
    for (std::size_t e = 0; e < E; ++e) h(S * E + s * E + e) += static_cast<real>(p[e]);
  }
  Kokkos::deep_copy(sums, h);
  int holders = 1;  // ranks that hold rows of each sequence
  for (Communicator* g : aux_.sequence_groups) {
    if (g == nullptr || g->size() == 1) continue;
    g->all_reduce(sums.data(), sums.extent(0));
    holders *= g->size();
  }
  Kokkos::deep_copy(h, sums);
  const double T = aux_.seq_len;
  a.sequence_load.assign(S * E, 0);
  double total = 0;
  for (std::size_t i = 0; i < S * E; ++i) {
    a.sequence_load[i] = static_cast<real>(E / (k * T) * h(i));
    total += a.sequence_load[i] * (h(S * E + i) / T);
  }
  return total / holders;
}

// ---- the exchange ---------------------------------------------------------------

namespace {

// The counts of one exchange in elements of rows of `cols` values: forward
// (send what goes out, receive what comes in) or back (the same, swapped).
AllToAllCounts element_counts(const std::vector<std::int64_t>& out, const std::vector<std::int64_t>& in,
                              std::size_t cols) {
  std::vector<std::size_t> send(out.size()), recv(in.size());
  for (std::size_t i = 0; i < out.size(); ++i) send[i] = static_cast<std::size_t>(out[i]) * cols;
  for (std::size_t i = 0; i < in.size(); ++i) recv[i] = static_cast<std::size_t>(in[i]) * cols;
  return AllToAllCounts::packed(std::move(send), std::move(recv));
}

// Moves rows between the group's members (a copy in place of one without a group).
template <class T>
void exchange(Communicator* group, const T* send, T* recv, const std::vector<std::int64_t>& out,
              const std::vector<std::int64_t>& in, std::size_t cols) {
  if (group == nullptr) {
    const std::size_t n = static_cast<std::size_t>(out[0]) * cols;
    Kokkos::deep_copy(Kokkos::View<T*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(recv, n),
                      Kokkos::View<const T*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(send, n));
    return;
  }
  group->all_to_all_v(send, recv, element_counts(out, in, cols));
}

}  // namespace

template <class T>
std::pair<Buffer<T>, Buffer<T>> ExpertParallel::wire() const {
  if constexpr (kBf16<T>)
    return {wire_bf16_send_, wire_bf16_recv_};
  else
    return {wire_fp32_send_, wire_fp32_recv_};
}

template <class T>
ConstSlice2D ExpertParallel::widened(ConstMatrix<T> x) {
  if constexpr (kBf16<T>) {
    kernels::widen_bf16(Slice1D(x_fp32_.data(), x.size()), ConstBf16Slice1D(x.data(), x.size()));
    return as_matrix(x_fp32_, x.extent(0), x.extent(1));
  } else {
    return x;
  }
}

template <class T>
MoeRouteStats ExpertParallel::forward(Slice2D out, ConstMatrix<T> x, const ExpertTensors& w,
                                      const ExpertMatrices<T>& wm, MoeActivations& a) {
  const std::size_t R = sizes_.rows, C = sizes_.channels, k = sizes_.slots, E = sizes_.experts, A = R * k;
  if (x.extent(0) != R || out.extent(0) != R) throw InternalError("the MoE layer routes a different number of rows");
  MoeRouteStats stats;
  if (!a.routed) {
    stats.z_loss_sum = route(widened<T>(x), w, a);
    if (aux_.seq_aux != 0) stats.seq_aux_sum = sequence_balance(a);
    exchange_counts(a);
    a.routed = true;
  }
  plan_exchange(a);
  stats.sent.assign(E, 0);
  for (std::int32_t e : a.expert) ++stats.sent[e];

  const auto [send_buf, recv_buf] = wire<T>();
  const std::size_t Q = static_cast<std::size_t>(std::accumulate(recv_counts_.begin(), recv_counts_.end(), 0LL));
  // Dispatch: this rank's rows in send order, out to the experts' ranks.
  kernels::gather_rows<T, T>(as_matrix(send_buf, A, C), x, send_row_);
  exchange(group_, send_buf.data(), recv_buf.data(), send_counts_, recv_counts_, C);
  kernels::gather_rows<T, T>(kept<T>(a.received, Q, C), as_matrix(recv_buf, Q, C), expert_major_);
  experts_forward<T>(w, wm, a);
  // And back: the outputs in the order they arrived, to where they came from.
  kernels::gather_rows<T, real>(as_matrix(send_buf, Q, C), as_matrix(out_rows_, Q, C), received_order_);
  exchange(group_, send_buf.data(), kept<T>(a.returned, A, C).data(), recv_counts_, send_counts_, C);
  kernels::combine_rows<T>(out, kept<T>(a.returned, A, C), weight_, slot_position_, static_cast<int>(k));
  return stats;
}

template <class T>
void ExpertParallel::experts_forward(const ExpertTensors& w, const ExpertMatrices<T>& wm, const MoeActivations& a) {
  const std::size_t C = sizes_.channels, F = sizes_.hidden;
  std::size_t first = 0;
  for (int le = 0; le < local_experts_; ++le) {
    const std::size_t n = static_cast<std::size_t>(expert_rows_[le]);
    const int e = le;  // the weights hold this rank's experts only
    if (n == 0) continue;
    const ConstMatrix<T> in = rows_of(kept<T>(a.received, sizes_.capacity, C), first, n);
    // fp32 results land in place (fp32) or in the backward's scratch, then rounded (bf16).
    const Slice2D hidden = kBf16<T> ? rows_of(as_matrix(hidden_grad_, sizes_.capacity, F), first, n)
                                    : rows_of(as_matrix(a.hidden.fp32, sizes_.capacity, F), first, n);
    kernels::linear_forward<T>(hidden, in, expert_matrix(wm.fc, e, F), expert_vector(w.fc_b, e, F));
    const Matrix<T> act = rows_of(kept<T>(a.activated, sizes_.capacity, F), first, n);
    if (sizes_.gated) {
      const Slice2D up = kBf16<T> ? rows_of(as_matrix(up_grad_, sizes_.capacity, F), first, n)
                                  : rows_of(as_matrix(a.hidden_up.fp32, sizes_.capacity, F), first, n);
      kernels::linear_forward<T>(up, in, expert_matrix(wm.up, e, F), expert_vector(w.up_b, e, F));
      kernels::swiglu_forward(act, hidden, up);
      if constexpr (kBf16<T>)
        kernels::round_to_bf16(Bf16Slice1D(rows_of(kept<T>(a.hidden_up, sizes_.capacity, F), first, n).data(), n * F),
                               ConstSlice1D(up.data(), n * F));
    } else {
      kernels::gelu_forward(act, hidden);
    }
    if constexpr (kBf16<T>)
      kernels::round_to_bf16(Bf16Slice1D(rows_of(kept<T>(a.hidden, sizes_.capacity, F), first, n).data(), n * F),
                             ConstSlice1D(hidden.data(), n * F));
    kernels::linear_forward<T>(rows_of(as_matrix(out_rows_, sizes_.capacity, C), first, n), ConstMatrix<T>(act),
                               expert_matrix(wm.proj, e, C), expert_vector(w.proj_b, e, C));
    first += n;
  }
}

template <class T>
void ExpertParallel::backward(Slice2D dx, const ExpertTensors& g, ConstSlice2D dout, ConstMatrix<T> x,
                              const ExpertTensors& w, const ExpertMatrices<T>& wm, const MoeActivations& a,
                              real loss_scale) {
  const std::size_t R = sizes_.rows, C = sizes_.channels, k = sizes_.slots, E = sizes_.experts, A = R * k;
  if (!a.routed) throw InternalError("an MoE backward without its forward's routing");
  plan_exchange(a);
  const std::size_t Q = static_cast<std::size_t>(std::accumulate(recv_counts_.begin(), recv_counts_.end(), 0LL));
  const auto [send_buf, recv_buf] = wire<T>();
  const int slots = static_cast<int>(k);
  // d(weight) of each slot: dout . the output it weighted.
  kernels::slot_dots<T>(dweight_, dout, kept<T>(a.returned, A, C), slot_position_, slots);
  // d(output of each slot) = weight dout, in send order, out to the experts.
  kernels::scatter_weighted<T>(as_matrix(send_buf, A, C), dout, weight_, slot_position_, slots);
  exchange(group_, send_buf.data(), recv_buf.data(), send_counts_, recv_counts_, C);
  kernels::gather_rows<real, T>(as_matrix(out_rows_, Q, C), as_matrix(recv_buf, Q, C), expert_major_);
  experts_backward<T>(g, wm, a);
  // d(input rows) back to their ranks, summed over each row's slots.
  kernels::gather_rows<T, real>(as_matrix(send_buf, Q, C), as_matrix(row_grad_, Q, C), received_order_);
  exchange(group_, send_buf.data(), recv_buf.data(), recv_counts_, send_counts_, C);
  kernels::sum_slots<T>(dx, as_matrix(recv_buf, A, C), slot_position_, slots);

  // The router: d(weights) -> d(logits), plus the z-loss's d(logits).
  const auto dweight = Kokkos::create_mirror_view_and_copy(HostSpace(), dweight_);
  const bool sigmoid = m_.moe_score == MoeScore::sigmoid && m_.moe_router == MoeRouter::learned;
  std::vector<real> dlogits(R * E, 0);
  const double z_loss = aux_.z_loss * loss_scale;
  // A sequence's balance loss is a mean over sequences: T tokens' worth of loss scale each.
  const double seq_aux = aux_.seq_aux * loss_scale * aux_.seq_len;
  std::vector<double> p, dp(E);
  for (std::size_t r = 0; r < R; ++r) {
    const std::int32_t* chosen = &a.expert[r * k];
    const real* wr = &a.weight[r * k];
    const real* score = &a.score[r * E];
    real* dl = &dlogits[r * E];
    double mean = 0;  // sum_j w_j dw_j
    for (std::size_t j = 0; j < k; ++j) mean += static_cast<double>(wr[j]) * dweight(r * k + j);
    if (sigmoid) {
      // w_j = s_j / S: ds_i = (dw_i - sum_j w_j dw_j) / S, ds/dl = s (1 - s).
      double sum = 0;
      for (std::size_t j = 0; j < k; ++j) sum += score[chosen[j]];
      for (std::size_t j = 0; j < k; ++j) {
        const real s = score[chosen[j]];
        dl[chosen[j]] = static_cast<real>((dweight(r * k + j) - mean) / sum * s * (1 - s));
      }
    } else {
      // w = the softmax of the chosen logits: dl_i = w_i (dw_i - sum_j w_j dw_j).
      for (std::size_t j = 0; j < k; ++j) dl[chosen[j]] = static_cast<real>(wr[j] * (dweight(r * k + j) - mean));
    }
    if (z_loss != 0) {
      // z = logsumexp(l)^2: dz/dl_e = 2 logsumexp(l) softmax(l)_e.
      const real* l = &a.logit[r * E];
      const real top = *std::max_element(l, l + E);
      double sum = 0;
      for (std::size_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - top));
      const double lse = top + std::log(sum);
      for (std::size_t e = 0; e < E; ++e)
        dl[e] += static_cast<real>(z_loss * 2 * lse * std::exp(static_cast<double>(l[e] - top)) / sum);
    }
    if (seq_aux != 0) {
      // d(balance)/d(p_e) = f_e / T for the row's sequence; then through the normalisation.
      normalised_scores(a, r, p);
      const real* f = &a.sequence_load[aux_.sequences[r] * E];
      double mean_dp = 0;
      for (std::size_t e = 0; e < E; ++e) {
        dp[e] = seq_aux * f[e] / aux_.seq_len;
        mean_dp += p[e] * dp[e];
      }
      if (sigmoid) {
        // p = s / sum(s): ds_e = (dp_e - sum_j p_j dp_j) / sum(s), then ds/dl = s (1 - s).
        double sum = 0;
        for (std::size_t e = 0; e < E; ++e) sum += score[e];
        for (std::size_t e = 0; e < E; ++e)
          dl[e] += static_cast<real>((dp[e] - mean_dp) / sum * score[e] * (1 - score[e]));
      } else {
        for (std::size_t e = 0; e < E; ++e) dl[e] += static_cast<real>(p[e] * (dp[e] - mean_dp));
      }
    }
  }
  const auto h = Kokkos::create_mirror_view(dlogits_);
  for (std::size_t i = 0; i < R * E; ++i) h(i) = dlogits[i];
  Kokkos::deep_copy(dlogits_, h);
  kernels::linear_backward<real>(dx, g.router, Slice1D(), as_matrix(dlogits_, R, E), widened<T>(x), w.router, {},
                                 real(1));
}

template <class T>
void ExpertParallel::experts_backward(const ExpertTensors& g, const ExpertMatrices<T>& wm, const MoeActivations& a) {
  const std::size_t C = sizes_.channels, F = sizes_.hidden, Q = sizes_.capacity;
  std::size_t first = 0;
  for (int le = 0; le < local_experts_; ++le) {
    const std::size_t n = static_cast<std::size_t>(expert_rows_[le]);
    const int e = le;  // the weights hold this rank's experts only
    if (n == 0) continue;
    Matrix<T> dy_c, dy_f;  // dy rounded for the products (bf16); none in fp32
    if constexpr (kBf16<T>) {
      dy_c = as_matrix(dy_bf16_, n, C);
      dy_f = as_matrix(dy_bf16_, n, F);
    }
    const ConstSlice2D dy = rows_of(as_matrix(out_rows_, Q, C), first, n);
    const Slice2D dact = rows_of(as_matrix(hidden_grad_, Q, F), first, n);
    kernels::linear_backward<T>(dact, expert_matrix(g.proj, e, C), expert_vector(g.proj_b, e, C), dy,
                                rows_of(kept<T>(a.activated, Q, F), first, n), expert_matrix(wm.proj, e, C), dy_c);
    const ConstMatrix<T> in = rows_of(kept<T>(a.received, Q, C), first, n);
    const Slice2D din = rows_of(as_matrix(row_grad_, Q, C), first, n);
    if (sizes_.gated) {
      // d(gate) in place of d(product), d(up) beside it; d(input) sums both products'.
      const Slice2D dup = rows_of(as_matrix(up_grad_, Q, F), first, n);
      kernels::swiglu_backward(dact, dup, rows_of(kept<T>(a.hidden, Q, F), first, n),
                               rows_of(kept<T>(a.hidden_up, Q, F), first, n), dact);
      kernels::linear_backward<T>(din, expert_matrix(g.fc, e, F), expert_vector(g.fc_b, e, F), dact, in,
                                  expert_matrix(wm.fc, e, F), dy_f);
      kernels::linear_backward<T>(din, expert_matrix(g.up, e, F), expert_vector(g.up_b, e, F), dup, in,
                                  expert_matrix(wm.up, e, F), dy_f, real(1));
    } else {
      kernels::gelu_backward(dact, rows_of(kept<T>(a.hidden, Q, F), first, n), dact);
      kernels::linear_backward<T>(din, expert_matrix(g.fc, e, F), expert_vector(g.fc_b, e, F), dact, in,
                                  expert_matrix(wm.fc, e, F), dy_f);
    }
    first += n;
  }
}

template MoeRouteStats ExpertParallel::forward<real>(Slice2D, ConstMatrix<real>, const ExpertTensors&,
                                                     const ExpertMatrices<real>&, MoeActivations&);
template MoeRouteStats ExpertParallel::forward<bf16>(Slice2D, ConstMatrix<bf16>, const ExpertTensors&,
                                                     const ExpertMatrices<bf16>&, MoeActivations&);
template void ExpertParallel::backward<real>(Slice2D, const ExpertTensors&, ConstSlice2D, ConstMatrix<real>,
                                             const ExpertTensors&, const ExpertMatrices<real>&, const MoeActivations&,
                                             real);
template void ExpertParallel::backward<bf16>(Slice2D, const ExpertTensors&, ConstSlice2D, ConstMatrix<bf16>,
                                             const ExpertTensors&, const ExpertMatrices<bf16>&, const MoeActivations&,
                                             real);

}  // namespace ndmini
