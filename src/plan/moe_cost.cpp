// SPDX-License-Identifier: BSD-3-Clause
#include "plan/moe_cost.hpp"

#include <algorithm>

#include "core/types.hpp"
#include "model/moe.hpp"
#include "plan/cost_model.hpp"

namespace ndmini {
namespace {

// The milliseconds of `count` products of rows x in -> out at the rate of
// their shape class.
double product_ms(double count, double rows, double in, double out, const ClusterSpec& c, Precision precision) {
  if (count <= 0 || rows <= 0) return 0;
  const double rate =
      c.peak_flops(precision) / 1e3 * c.gemm_efficiency(gemm_class(std::min({rows, in, out})), precision);
  return count * 2 * rows * in * out / rate;
}

// The MLP's products forward for `rows` rows of width `hidden` split over `tp`:
// c_fc (or c_gate and c_up) column-parallel, c_proj row-parallel.
double mlp_ms(const ModelConfig& m, double rows, double hidden, int tp, const ClusterSpec& c, Precision precision) {
  const double C = m.channels;
  return product_ms(m.gated() ? 2 : 1, rows, C, hidden / tp, c, precision) +
         product_ms(1, rows, hidden / tp, C, c, precision);
}

}  // namespace

double all_to_all_ms(double bytes, int n, const ClusterSpec& c) {
  if (n <= 1 || bytes <= 0) return 0;
  const int local = std::min(n, std::max(1, c.devices_per_node));  // consecutive ranks: a node holds this many
  const double intra = link_bandwidth_gbs(c, Collective::p2p, false) * c.network_efficiency * 1e6;  // bytes per ms
  const double inter = link_bandwidth_gbs(c, Collective::p2p, true) * c.network_efficiency * 1e6;
  const double on_node = bytes * (local - 1.0) / n / intra;
  const double off_node = n > local ? bytes * static_cast<double>(n - local) / n / inter : 0.0;
  const double latency = (n > local ? c.inter_latency_us : c.intra_latency_us) * 1e-3;
  return std::max(on_node, off_node) + latency;
}

MoeBlockCost moe_block_cost(const Config& cfg, const ParallelDims& d, const ClusterSpec& c, Precision precision) {
  const ModelConfig& m = cfg.model;
  MoeBlockCost k;
  if (!m.moe()) return k;
  const double C = m.channels, E = m.moe_experts, top_k = m.moe_top_k, F = m.moe_ffn();
  const bool sp = d.tp > 1 && d.sequence_parallel;
  const double full_rows = static_cast<double>(cfg.train.micro_batch) * m.seq_len / d.cp;
  // Each rank routes the rows it holds: under sequence parallelism its 1/tp.
  k.rows = sp ? full_rows / d.tp : full_rows;
  const double activation = precision == Precision::bf16 ? sizeof(bf16) : sizeof(real);
  k.a2a_bytes = k.rows * top_k * C * activation;
  k.inter_node = d.ep > c.devices_per_node;
  k.a2a_ms = all_to_all_ms(k.a2a_bytes, d.ep, c);
  k.imbalance = cfg.perf.moe_imbalance;
  // A rank's E / ep experts receive, on average, its own rows x k (every
  // member of the group routes as many): the busiest rank imbalance times that.
  const double local_experts = E / d.ep;
  const double routed = k.rows * top_k * k.imbalance;
  k.router_ms = product_ms(1, k.rows, C, E, c, precision);
  k.experts_ms = local_experts * mlp_ms(m, routed / local_experts, F, 1, c, precision);
  k.shared_ms = m.moe_shared_hidden > 0 ? mlp_ms(m, full_rows, m.moe_shared_hidden, d.tp, c, precision) : 0.0;
  // The permutation into expert order and back: each writes and reads the routed rows once.
  const double kernel_rate = (c.kernel_bandwidth_gbs > 0 ? c.kernel_bandwidth_gbs : c.memory_bandwidth_gbs) * 1e6;
  k.permute_ms = kernel_rate > 0 ? 4 * routed * C * activation / kernel_rate : 0.0;
  k.forward_ms = k.router_ms + k.experts_ms + k.shared_ms + k.permute_ms + 2 * k.a2a_ms;
  k.backward_ms = 2 * (k.router_ms + k.experts_ms + k.shared_ms) + k.permute_ms + 2 * k.a2a_ms;
  k.dense_mlp_ms = mlp_ms(m, full_rows, m.ffn(), d.tp, c, precision);
  // State: the experts over the expert fsdp group; router (replicated over
  // tp) and shared expert (split over tp) over fsdp, as the dense MLP.
  const MoeBlockParams params = moe_block_params(m);
  k.expert_params_per_rank = local_experts * static_cast<double>(params.expert);
  const double shared = static_cast<double>(params.shared);
  k.shard_elements = k.expert_params_per_rank / d.expert_fsdp() + E * C / d.fsdp() + shared / d.tp / d.fsdp();
  k.dense_mlp_shard_elements = static_cast<double>(params.dense_mlp) / d.tp / d.fsdp();
  return k;
}

}  // namespace ndmini
