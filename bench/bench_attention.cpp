// SPDX-License-Identifier: BSD-3-Clause
// Causal self-attention forward and backward at the decks' shapes, through
// ContextParallelAttention: attention_* is the one-rank path (one diagonal
// block; under mpiexec every rank runs its own), attention_ring_* the ring
// over all ranks, cp = P under mpiexec -n P (each rank T/P rows per
// sequence; skipped on one rank). FLOPs are the nominal count of the full T x T
// products, causal mask ignored (forward Q K^T and P V, 2 B T^2 C each;
// backward twice that), the same for every implementation so rates compare;
// the kernel itself skips the masked half.
#include <memory>
#include <string>

#include "bench_common.hpp"
#include "layers/context_parallel.hpp"

namespace {

using namespace ndmini;
using namespace ndmini::bench;

// One layer's buffers: activations of B sequences (T/cp rows each on this
// rank) and the state one forward saves for its backward.
struct AttentionBuffers {
  kernels::AttentionShape local;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<ContextParallelAttention> attn;
  View2D qkv, out, dout, dqkv;
  View1D qkvh, lse;
  AttentionBuffers(const kernels::AttentionShape& global, int cp) : local(global) {
    if (cp > 1) comm = std::make_unique<Communicator>(MPI_COMM_WORLD, "cp");
    local.seq_len = global.seq_len / cp;
    attn = std::make_unique<ContextParallelAttention>(comm.get(), local, global.seq_len);
    const std::size_t n = static_cast<std::size_t>(local.batch) * local.seq_len, C = local.channels;
    qkv = View2D("qkv", n, 3 * C);
    out = View2D("out", n, C);
    dout = View2D("dout", n, C);
    dqkv = View2D("dqkv", n, 3 * C);
    qkvh = View1D("qkvh", ContextParallelAttention::qkvh_size(local));
    lse = View1D("lse", ContextParallelAttention::lse_size(local));
    randomize(flat(qkv), 1, 1);
    randomize(flat(dout), 2);
  }
  ContextParallelAttention::Saved saved() const { return {qkvh, lse, {}}; }
  void forward() { attn->forward(out, qkv, saved()); }
  void backward() { attn->backward(dqkv, dout, out, saved()); }
};

double forward_flops(const kernels::AttentionShape& s) {
  return 4.0 * s.batch * static_cast<double>(s.seq_len) * s.seq_len * s.channels;
}

// The cp degree of a benchmark: 1, or every rank for the ring (0 when it cannot run).
int cp_degree(benchmark::State& state, bool ring, int seq_len) {
  if (!ring) return 1;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2 || seq_len % (2 * world) != 0) {
    state.SkipWithError("the ring needs mpiexec -n P with P >= 2 and T divisible by 2P");
    return 0;
  }
  return world;
}

void BM_attention_forward(benchmark::State& state, kernels::AttentionShape s, bool ring) {
  const int cp = cp_degree(state, ring, s.seq_len);
  if (cp == 0) return;
  AttentionBuffers buf(s, cp);
  for (auto _ : state) time_iteration(state, [&] { buf.forward(); });
  set_flops(state, forward_flops(s) / cp);
}

void BM_attention_backward(benchmark::State& state, kernels::AttentionShape s, bool ring) {
  const int cp = cp_degree(state, ring, s.seq_len);
  if (cp == 0) return;
  AttentionBuffers buf(s, cp);
  buf.forward();  // backward reads the saved q, k, v, LSE and the output
  for (auto _ : state) time_iteration(state, [&] { buf.backward(); });
  set_flops(state, 2 * forward_flops(s) / cp);
}

bool register_all() {
  for (bool ring : {false, true})
    for (const Deck& d : kDecks) {
      const kernels::AttentionShape s{kBatch, kSeqLen, d.channels, d.heads};
      const std::string shape = std::string(d.name) + "/B:" + std::to_string(s.batch) +
                                "/T:" + std::to_string(s.seq_len) + "/C:" + std::to_string(s.channels) +
                                "/H:" + std::to_string(s.heads);
      const std::string prefix = ring ? "attention_ring_" : "attention_";
      benchmark::RegisterBenchmark((prefix + "forward/" + shape).c_str(), BM_attention_forward, s, ring)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((prefix + "backward/" + shape).c_str(), BM_attention_backward, s, ring)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  return true;
}

const bool registered = register_all();

}  // namespace
