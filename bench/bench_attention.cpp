// SPDX-License-Identifier: BSD-3-Clause
// Causal self-attention forward and backward at the decks' shapes. FLOPs
// count the full T x T products, causal mask ignored, as the kernels compute
// them: forward Q K^T and P V, 2 B T^2 C each; backward twice that.
#include <string>

#include "bench_common.hpp"

namespace {

using namespace ndmini;
using namespace ndmini::bench;

// Buffers of one attention call, sized as GPT allocates them.
struct AttentionBuffers {
  kernels::AttentionShape s;
  View2D qkv, out, dout, dqkv;
  View1D qkvh, att, y, dy, dqkvh, datt;
  explicit AttentionBuffers(const kernels::AttentionShape& shape) : s(shape) {
    const std::size_t n = static_cast<std::size_t>(s.batch) * s.seq_len, C = s.channels, T = s.seq_len;
    qkv = View2D("qkv", n, 3 * C);
    out = View2D("out", n, C);
    dout = View2D("dout", n, C);
    dqkv = View2D("dqkv", n, 3 * C);
    qkvh = View1D("qkvh", 3 * n * C);
    att = View1D("att", static_cast<std::size_t>(s.batch) * s.heads * T * T);
    y = View1D("y", n * C);
    dy = View1D("dy", n * C);
    dqkvh = View1D("dqkvh", 3 * n * C);
    datt = View1D("datt", T * T);
    randomize(flat(qkv), 1, 1);
    randomize(flat(dout), 2);
  }
  void forward() { kernels::attention_forward(out, qkvh, att, y, qkv, s); }
  void backward() { kernels::attention_backward(dqkv, dy, dqkvh, datt, dout, qkvh, att, s); }
};

double forward_flops(const kernels::AttentionShape& s) {
  return 4.0 * s.batch * static_cast<double>(s.seq_len) * s.seq_len * s.channels;
}

void BM_attention_forward(benchmark::State& state, kernels::AttentionShape s) {
  AttentionBuffers buf(s);
  for (auto _ : state) time_iteration(state, [&] { buf.forward(); });
  set_flops(state, forward_flops(s));
}

void BM_attention_backward(benchmark::State& state, kernels::AttentionShape s) {
  AttentionBuffers buf(s);
  buf.forward();  // backward reads the saved q, k, v and probabilities
  for (auto _ : state) time_iteration(state, [&] { buf.backward(); });
  set_flops(state, 2 * forward_flops(s));
}

bool register_all() {
  for (const Deck& d : kDecks) {
    const kernels::AttentionShape s{kBatch, kSeqLen, d.channels, d.heads};
    const std::string shape = "/B:" + std::to_string(s.batch) + "/T:" + std::to_string(s.seq_len) +
                              "/C:" + std::to_string(s.channels) + "/H:" + std::to_string(s.heads);
    benchmark::RegisterBenchmark(("attention_forward/" + std::string(d.name) + shape).c_str(), BM_attention_forward, s)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention_backward/" + std::string(d.name) + shape).c_str(), BM_attention_backward,
                                 s)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}

const bool registered = register_all();

}  // namespace
