// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The routed experts of a Mixture-of-Experts block, over the expert group
// (ep consecutive ranks of dp_shard x cp x tp, mesh/dims.hpp): the router,
// the dispatch of each token to its k experts, the experts' products and the
// combine, forward and backward (docs/model.md, "Mixture-of-Experts").
//
// Each rank routes the token rows it holds (its residual rows: with sequence
// parallelism its slice of the tp group's rows). Routing is fp32 and
// deterministic: scores are a softmax (top-k, renormalised over the k, as
// Mixtral) or sigmoids (top-k of score + a selection bias that does not
// enter the weights, renormalised, as DeepSeek-V3); ties go to the lower
// expert id; the balanced test router sends the token at position t to
// experts (t k + j) mod E, j < k, weighted as the softmax router weights them.
//
// Dropless: every token reaches its k experts. The expert group exchanges its
// per-expert counts once (an all-gather: every member knows the count matrix),
// so when an expert's load passes the bound (train.moe_max_load times the mean
// load) all members stop together with one message naming the expert and its
// load. The rows then travel in a fixed order: a stable counting sort puts
// this rank's assignments in order of expert, then token, then slot; the
// variable all-to-all (Communicator::all_to_all_v) delivers each expert's rows
// to its ep rank, which orders them by expert, then source rank, then token
// (the order one rank would see them in), runs one product per local expert,
// and sends the outputs back the same way. The combine sums each token's k
// weighted outputs in slot order, with no atomics. ep = 1 runs the same path
// with self-sends, so one rank is the reference for every layout.
//
// Under bf16 the rows travel as bf16 (the operands of the products, as every
// other activation transfer), and the expert products take bf16 operands.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "config/config.hpp"
#include "core/types.hpp"
#include "layers/moe_routing.hpp"

namespace ndmini {

// One MoE block's expert tensors as the layer reads them: the router of all
// E experts, and the matrices of this ep rank's El = E/ep experts [ep_rank El,
// (ep_rank + 1) El) stacked on the local expert index (the experts unit's
// [El, rows, cols] tensors seen as [El rows, cols]). T is the products'
// operand type (real, or bf16 under mixed precision); the router stays fp32.
template <class T>
struct ExpertMatrices {
  ConstMatrix<T> fc, up, proj;  // [El F, C] (c_fc, or c_gate under swiglu), [El F, C] (c_up: swiglu), [El C, F]
};
struct ExpertTensors {
  Slice2D router;              // [E, C]
  Slice1D selection_bias;      // [E]: sigmoid scores' selection bias (empty: none)
  Slice2D fc, up, proj;        // as ExpertMatrices, fp32
  Slice1D fc_b, up_b, proj_b;  // [El F], [El F], [El C]; empty without model.bias
};

// The routing of one micro-batch through one MoE block, and what its
// backward reads, all kept from the forward (recomputation replays it).
// Sizes: R routed rows, k slots per row, E experts, `capacity` rows at most
// arriving at this rank (ExpertParallel::capacity).
struct MoeActivations {
  // Routing, on the host (it decides the exchange's counts).
  std::vector<std::int32_t> expert;  // [R k]: each row's experts, in slot order
  std::vector<real> weight;          // [R k]: their combine weights
  std::vector<real> logit;           // [R E]: the router's logits (the z-loss's backward)
  std::vector<real> score;           // [R E]: softmax probabilities or sigmoids (the router's backward)
  std::vector<std::int64_t> counts;  // [ep E]: rows each member of the group sends to each expert
  std::vector<real> sequence_load;   // [S E] with the sequence-wise aux loss: f of each sequence and expert
  bool routed = false;               // set by the forward; a recompute replays it
  // Kept operands (T under bf16): the rows this rank's experts received,
  // expert-major [capacity, C]; the experts' hidden before the activation
  // [capacity, F] (swiglu: the gate's output), swiglu's up output, the
  // activation's output [capacity, F]; the experts' outputs as they came
  // back to this rank, in send order [R k, C].
  KeptOperand received, hidden, hidden_up, activated, returned;
};

// The bytes of one block's MoeActivations (the memory estimate adds them).
struct MoeSizes {
  std::size_t rows = 0, slots = 0, experts = 0, ep = 1, capacity = 0, channels = 0, hidden = 0;
  bool gated = false, bf16 = false;
  std::size_t kept_bytes() const;
  std::size_t scratch_bytes() const;  // the layer's own buffers, shared by the blocks
};

// What one forward routed: rows this rank sent to each expert, and the
// auxiliary losses before their coefficients: the router z-loss summed over
// the rows, the sequence-wise balance loss sum_e f_e P_e summed over the
// sequences (each sequence's value shared out among the ranks that hold its
// rows, so a sum over every token-holding rank counts it once).
struct MoeRouteStats {
  std::vector<std::int64_t> sent;  // [E]
  double z_loss_sum = 0;
  double seq_aux_sum = 0;
};

// The auxiliary losses (train.moe_z_loss, train.moe_seq_aux) and what the
// sequence-wise one needs: each routed row's sequence within the
// micro-batch, and the groups over which the rows of one sequence are
// spread (cp, and tp under sequence parallelism): its sums run over them.
struct MoeAuxLosses {
  double z_loss = 0;           // times the mean over tokens of logsumexp(logits)^2
  double seq_aux = 0;          // times the mean over sequences of sum_e f_e P_e (DeepSeek-V3)
  std::vector<int> sequences;  // [R]: 0 .. micro_batch - 1
  std::vector<Communicator*> sequence_groups;
  int micro_batch = 0;  // the sequences of a micro-batch (the same on every rank of the groups)
  int seq_len = 0;      // T: the tokens of a whole sequence
};

class ExpertParallel {
 public:
  // m: the MoE keys (experts, top-k, scores, router, expert width, MLP
  // kind, biases); max_load: train.moe_max_load (0: the worst case, no
  // bound short of every token); group: the expert group (null: ep = 1);
  // rows: the rows this rank routes per micro-batch; positions: each row's
  // position in its sequence (the balanced router's token id).
  ExpertParallel(const ModelConfig& m, double max_load, Communicator* group, std::size_t rows,
                 std::vector<int> positions, bool bf16);
  // Adds the auxiliary losses to the objective (none by default).
  void set_aux_losses(MoeAuxLosses aux);
  // Tests: each routed row's experts are added to log->record, or taken
  // from log->replay (layers/moe_routing.hpp), for the token log->next
  // names plus the row's sequence in the micro-batch (`sequences`, [R]) and
  // position. A replayed token that is not in log->replay is an InternalError.
  void set_routing_log(MoeRoutingLog* log, std::vector<int> sequences);

  static MoeSizes sizes_of(const ModelConfig& m, double max_load, int ep, std::size_t rows, bool bf16);
  const MoeSizes& sizes() const { return sizes_; }
  MoeActivations allocate() const;

  // out [R, C] += the routed experts' combined output for the rows x [R, C]
  // (x: bf16 under mixed precision). Routes unless a.routed (a recompute:
  // the kept routing is replayed; the stats then repeat the routing's
  // counts and carry no aux sums: count them once, from the first forward). Throws Error when an expert's load passes
  // the bound, on every member of the expert group alike.
  template <class T>
  MoeRouteStats forward(Slice2D out, ConstMatrix<T> x, const ExpertTensors& w, const ExpertMatrices<T>& wm,
                        MoeActivations& a);
  // dx [R, C] += d(x) of the routed part, for dout = d(out) [R, C]; adds
  // this rank's experts' and the router's gradients into g. loss_scale: the main loss's weight of one
  // token (1 / the global batch's tokens); the auxiliary losses' gradients
  // are added at that scale (0: none, as in a forward-only pass).
  template <class T>
  void backward(Slice2D dx, const ExpertTensors& g, ConstSlice2D dout, ConstMatrix<T> x, const ExpertTensors& w,
                const ExpertMatrices<T>& wm, const MoeActivations& a, real loss_scale = 0);

  int ep() const { return ep_; }
  int ep_rank() const { return ep_rank_; }
  int first_expert() const { return first_expert_; }
  int local_experts() const { return local_experts_; }

 private:
  // Fills a's routing from the rows x; returns the z-loss sum of the rows.
  double route(ConstSlice2D x, const ExpertTensors& w, MoeActivations& a);
  // The sequence-wise balance loss: fills a.sequence_load, returns this rank's share.
  double sequence_balance(MoeActivations& a);
  // Row r's token, as the routing log names it.
  MoeToken token_of(std::size_t row) const;
  // Each score as the balance loss normalises it (softmax: itself; sigmoid: over the row's sum).
  void normalised_scores(const MoeActivations& a, std::size_t row, std::vector<double>& out) const;
  void exchange_counts(MoeActivations& a);
  // Where the assignments go (from a.expert and a.counts): send order and
  // the expert-major order of the rows received.
  void plan_exchange(const MoeActivations& a);
  template <class T>
  void experts_forward(const ExpertTensors& w, const ExpertMatrices<T>& wm, const MoeActivations& a);
  template <class T>
  void experts_backward(const ExpertTensors& g, const ExpertMatrices<T>& wm, const MoeActivations& a);
  template <class T>
  ConstSlice2D widened(ConstMatrix<T> x);
  // The exchange's send and receive buffers in T (bf16 rows travel as bf16).
  template <class T>
  std::pair<Buffer<T>, Buffer<T>> wire() const;

  ModelConfig m_;
  Communicator* group_;
  int ep_ = 1, ep_rank_ = 0, first_expert_ = 0, local_experts_ = 0;
  std::size_t bound_ = 0;  // rows an expert may receive
  MoeSizes sizes_;
  std::vector<int> positions_;
  MoeAuxLosses aux_;
  int sequences_ = 0;  // per micro-batch
  MoeRoutingLog* log_ = nullptr;
  std::vector<int> row_sequence_;  // [R]: each row's sequence in its micro-batch (with log_)
  // The exchange of the current micro-batch (plan_exchange).
  std::vector<std::int64_t> send_counts_, recv_counts_;  // rows, per ep rank
  std::vector<std::int64_t> expert_rows_;                // rows each local expert received
  Kokkos::View<int*, MemSpace> send_row_;                // send position -> token row
  Kokkos::View<int*, MemSpace> slot_position_;           // row r, slot j -> its send position
  Kokkos::View<int*, MemSpace> expert_major_;            // expert-major position -> received position
  Kokkos::View<int*, MemSpace> received_order_;          // received position -> expert-major position
  Kokkos::View<real*, MemSpace> weight_;                 // [R k] combine weights, on the device
  // Scratch shared by the blocks.
  View1D logits_, dlogits_, x_fp32_, out_rows_, dweight_;
  View1D counts_send_, counts_recv_;  // the count matrix's all-gather (ep > 1)
  View1D hidden_grad_, up_grad_, row_grad_;
  View1D wire_fp32_send_, wire_fp32_recv_;
  Bf16View1D wire_bf16_send_, wire_bf16_recv_, dy_bf16_;
};

}  // namespace ndmini
