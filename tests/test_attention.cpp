// SPDX-License-Identifier: BSD-3-Clause
// Block attention (kernels/attention.hpp) against a naive double-precision
// attention, and the one-rank ContextParallelAttention against central
// finite differences; grouped-query attention against multi-head attention
// on its kv heads repeated, and against finite differences.
//
// The reference computes, per query row, the softmax over every visible key
// of every K/V block at once (no blocks, no online merge, no tiles) and its
// textbook gradient. Shapes are odd (head size 5 or 3, rows not multiples of
// the kernel's 32-row tiles, which tile_rows = 7 shrinks further), so no
// divisibility luck hides an indexing error.
//
// Bounds: the kernel runs in float32 with a polynomial exp (relative error
// below 2e-7); sums run over at most ~300 keys, so float rounding gives
// norm-relative errors of ~1e-7 to 1e-6 (measured values are printed). The
// bound kBlockTol = 2e-5 sits well above that and far below what a real
// error makes: a wrong mask, a dropped term or one mis-merged block moves
// the result by percents (the negative control below shows it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/attention.hpp"
#include "layers/context_parallel.hpp"
#include "numeric_check.hpp"

using namespace ndmini;
using namespace ndmini::test;
namespace kn = ndmini::kernels;

namespace {

constexpr double kBlockTol = 2e-5;
const double kNegInf = -std::numeric_limits<double>::infinity();

// Both forms of the kernels run on a CPU: the host form, and the GPU's
// (coalesced row kernels, every head in one batched product, 128-row tiles),
// so the form a GPU runs is checked here too.
const kn::AttentionKernelForm kForms[] = {kn::AttentionKernelForm::host, kn::AttentionKernelForm::device};
const char* form_name(kn::AttentionKernelForm f) {
  return f == kn::AttentionKernelForm::device ? "device form" : "host form";
}
// Selects a form for one scope (scratch sizes follow the form: make them inside).
struct FormScope {
  explicit FormScope(kn::AttentionKernelForm f) { kn::set_attention_kernel_form(f); }
  ~FormScope() { kn::set_attention_kernel_form(kn::AttentionKernelForm::automatic); }
  FormScope(const FormScope&) = delete;
  FormScope& operator=(const FormScope&) = delete;
};

// Host vectors of uniform values, head-major [heads, rows, width].
std::vector<double> uniform(std::size_t n, std::uint64_t seed, double lo = -1.5, double hi = 1.5) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = lo + (hi - lo) * static_cast<double>(rng::bits(seed, i) >> 40) / 16777216.0;
  return v;
}
// Rounds to float as the device copy does, so reference and kernel see the same inputs.
std::vector<double> as_float(std::vector<double> v) {
  for (auto& x : v) x = static_cast<real>(x);
  return v;
}
View1D device(const std::vector<double>& v) {
  View1D d("d", v.size());
  upload(d, v);
  return d;
}

// One K/V block of the reference and the kernel: head-major [heads, rows, hs].
struct KvBlock {
  std::vector<double> k, v;
  int rows, pos0;
};

struct Geometry {
  int heads, hs, nq, q_pos0;
  bool causal;
};

// The naive attention of q [heads, nq, hs] against all blocks at once, and
// its gradient for dout.
struct Reference {
  std::vector<double> o, lse, dq;
  std::vector<std::vector<double>> dk, dv;
};
Reference reference(const Geometry& g, const std::vector<double>& q, const std::vector<KvBlock>& blocks,
                    const std::vector<double>& dout) {
  const int H = g.heads, hs = g.hs, nq = g.nq;
  const double scale = 1 / std::sqrt(static_cast<double>(hs));
  Reference r;
  r.o.assign(static_cast<std::size_t>(H) * nq * hs, 0);
  r.lse.assign(static_cast<std::size_t>(H) * nq, kNegInf);
  r.dq.assign(r.o.size(), 0);
  for (const auto& b : blocks) {
    r.dk.emplace_back(b.k.size(), 0);
    r.dv.emplace_back(b.v.size(), 0);
  }
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < nq; ++i) {
      const double* qi = &q[(static_cast<std::size_t>(h) * nq + i) * hs];
      const double* doi = &dout[(static_cast<std::size_t>(h) * nq + i) * hs];
      struct Key {
        int block, j;
        double s;
      };
      std::vector<Key> keys;
      for (int bi = 0; bi < static_cast<int>(blocks.size()); ++bi) {
        const KvBlock& b = blocks[bi];
        for (int j = 0; j < b.rows; ++j) {
          if (g.causal && b.pos0 + j > g.q_pos0 + i) continue;
          const double* kj = &b.k[(static_cast<std::size_t>(h) * b.rows + j) * hs];
          double s = 0;
          for (int d = 0; d < hs; ++d) s += qi[d] * kj[d];
          keys.push_back({bi, j, s * scale});
        }
      }
      if (keys.empty()) continue;
      double m = kNegInf, sum = 0;
      for (const auto& key : keys) m = std::max(m, key.s);
      for (const auto& key : keys) sum += std::exp(key.s - m);
      const double lse = m + std::log(sum);
      r.lse[static_cast<std::size_t>(h) * nq + i] = lse;
      double* oi = &r.o[(static_cast<std::size_t>(h) * nq + i) * hs];
      std::vector<double> p(keys.size()), dp(keys.size());
      double D = 0;
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const KvBlock& b = blocks[keys[n].block];
        const double* vj = &b.v[(static_cast<std::size_t>(h) * b.rows + keys[n].j) * hs];
        p[n] = std::exp(keys[n].s - lse);
        dp[n] = 0;
        for (int d = 0; d < hs; ++d) {
          oi[d] += p[n] * vj[d];
          dp[n] += doi[d] * vj[d];
        }
        D += p[n] * dp[n];
      }
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const KvBlock& b = blocks[keys[n].block];
        const std::size_t row = (static_cast<std::size_t>(h) * b.rows + keys[n].j) * hs;
        const double ds = p[n] * (dp[n] - D) * scale;
        for (int d = 0; d < hs; ++d) {
          r.dq[(static_cast<std::size_t>(h) * nq + i) * hs + d] += ds * b.k[row + d];
          r.dk[keys[n].block][row + d] += ds * qi[d];
          r.dv[keys[n].block][row + d] += p[n] * doi[d];
        }
      }
    }
  return r;
}

// The kernel side of one test: q, dout and the running (O, LSE) on the
// device, each K/V block with its gradient accumulators.
struct Kernel {
  Geometry g;
  int tile_rows;
  View1D q, o, lse, dout, delta, dq, scratch;
  std::vector<View1D> k, v, dk, dv;
  Kernel(const Geometry& geometry, const std::vector<double>& hq, const std::vector<KvBlock>& blocks,
         const std::vector<double>& hdout, int tiles)
      : g(geometry), tile_rows(tiles) {
    q = device(hq);
    dout = device(hdout);
    o = View1D("o", hq.size());
    lse = View1D("lse", static_cast<std::size_t>(g.heads) * g.nq);
    delta = View1D("delta", lse.size());
    dq = View1D("dq", hq.size());
    int max_rows = 0;
    for (const auto& b : blocks) {
      k.push_back(device(b.k));
      v.push_back(device(b.v));
      dk.push_back(View1D("dk", b.k.size()));
      dv.push_back(View1D("dv", b.v.size()));
      max_rows = std::max(max_rows, b.rows);
    }
    scratch = View1D("scratch", kn::attention_block_scratch_size(g.nq, max_rows, g.heads));
  }
  kn::HeadRows rows(const View1D& x, int n, int width) const {
    return {x.data(), static_cast<std::size_t>(n) * width, n};
  }
  kn::AttentionBlock geometry(const KvBlock& b) const { return {g.heads, g.hs, g.q_pos0, b.pos0, g.causal, tile_rows}; }
  // The merge identity: O = 0, LSE = -inf.
  void reset() {
    Kokkos::deep_copy(o, real(0));
    Kokkos::deep_copy(lse, -std::numeric_limits<real>::infinity());
  }
  bool forward(const std::vector<KvBlock>& blocks, int b) {
    return kn::attention_block_forward(rows(o, g.nq, g.hs), rows(lse, g.nq, 1), rows(q, g.nq, g.hs),
                                       rows(k[b], blocks[b].rows, g.hs), rows(v[b], blocks[b].rows, g.hs),
                                       geometry(blocks[b]), scratch);
  }
  // D = rowsum(dO * O) of the merged forward, computed on the host in double.
  void set_delta() {
    const auto ho = host(o), hd = host(dout);
    std::vector<double> d(lse.size(), 0);
    for (std::size_t r = 0; r < d.size(); ++r)
      for (int c = 0; c < g.hs; ++c) d[r] += ho[r * g.hs + c] * hd[r * g.hs + c];
    upload(delta, d);
  }
  bool backward(const std::vector<KvBlock>& blocks, int b) {
    return kn::attention_block_backward(
        rows(dq, g.nq, g.hs), rows(dk[b], blocks[b].rows, g.hs), rows(dv[b], blocks[b].rows, g.hs), rows(q, g.nq, g.hs),
        rows(k[b], blocks[b].rows, g.hs), rows(v[b], blocks[b].rows, g.hs), rows(dout, g.nq, g.hs), rows(lse, g.nq, 1),
        rows(delta, g.nq, 1), geometry(blocks[b]), scratch);
  }
};

std::vector<KvBlock> make_blocks(const Geometry& g, const std::vector<std::pair<int, int>>& rows_pos, int seed) {
  std::vector<KvBlock> blocks;
  for (const auto& [rows, pos0] : rows_pos) {
    const std::size_t n = static_cast<std::size_t>(g.heads) * rows * g.hs;
    blocks.push_back({as_float(uniform(n, seed++)), as_float(uniform(n, seed++)), rows, pos0});
  }
  return blocks;
}

// LSE rows: -inf exactly where the reference has no visible key, else close.
void expect_lse(const std::vector<double>& ref, const std::vector<double>& got) {
  std::vector<double> r, o;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << "row " << i << " sees no key: LSE must stay -inf";
    } else {
      r.push_back(ref[i]);
      o.push_back(got[i]);
    }
  }
  if (!r.empty()) expect_close("block lse", r, o, kBlockTol);
}

// Forward and backward of q against `blocks`, merged in `order`, against the
// reference. scratch_heads > 0: a scratch for that many heads only (the
// device form then batches that many at a time).
void check_blocks(const Geometry& g, const std::vector<KvBlock>& blocks, const std::vector<int>& order, int tile_rows,
                  int scratch_heads = 0) {
  const std::size_t nq_elems = static_cast<std::size_t>(g.heads) * g.nq * g.hs;
  const auto hq = as_float(uniform(nq_elems, 11)), hdout = as_float(uniform(nq_elems, 12, -1, 1));
  const Reference ref = reference(g, hq, blocks, hdout);
  Kernel kern(g, hq, blocks, hdout, tile_rows);
  if (scratch_heads > 0) {
    int max_rows = 0;
    for (const auto& b : blocks) max_rows = std::max(max_rows, b.rows);
    kern.scratch = View1D("scratch", kn::attention_block_scratch_size(g.nq, max_rows, scratch_heads));
  }
  kern.reset();
  for (int b : order) kern.forward(blocks, b);
  expect_close("block forward O", ref.o, host(kern.o), kBlockTol);
  expect_lse(ref.lse, host(kern.lse));
  // Gradient buffers start non-zero: the kernel accumulates.
  const auto dq0 = uniform(nq_elems, 21);
  upload(kern.dq, dq0);
  std::vector<std::vector<double>> dk0, dv0;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    dk0.push_back(uniform(blocks[b].k.size(), 22 + b));
    dv0.push_back(uniform(blocks[b].v.size(), 32 + b));
    upload(kern.dk[b], dk0[b]);
    upload(kern.dv[b], dv0[b]);
  }
  kern.set_delta();
  for (int b : order) kern.backward(blocks, b);
  expect_close("block backward dQ", ref.dq, minus(host(kern.dq), dq0), kBlockTol);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    expect_close("block backward dK", ref.dk[b], minus(host(kern.dk[b]), dk0[b]), kBlockTol);
    expect_close("block backward dV", ref.dv[b], minus(host(kern.dv[b]), dv0[b]), kBlockTol);
  }
}

std::string describe(const Geometry& g, const std::vector<KvBlock>& blocks, int tile_rows) {
  std::string s = "heads " + std::to_string(g.heads) + " hs " + std::to_string(g.hs) + " q rows " +
                  std::to_string(g.nq) + " at " + std::to_string(g.q_pos0) + (g.causal ? " causal" : " full") +
                  " tile_rows " + std::to_string(tile_rows) + "; k blocks";
  for (const auto& b : blocks) s += " " + std::to_string(b.rows) + "@" + std::to_string(b.pos0);
  return s;
}

}  // namespace

// ---- the block kernel ---------------------------------------------------------------

TEST(BlockAttention, OneBlockMatchesReference) {
  // (q rows, q position, k rows, k position): a diagonal block, an
  // off-diagonal block with a staircase, one whose first rows see no key,
  // one every key of which is visible, and one the mask hides for all but
  // its last rows.
  struct Case {
    int nq, q_pos0, nk, k_pos0;
  };
  for (const auto form : kForms) {
    const FormScope scope(form);
    for (const Case c : {Case{150, 100, 150, 100}, Case{150, 50, 140, 20}, Case{150, 0, 140, 40}, Case{70, 500, 140, 0},
                         Case{7, 0, 11, 0}, Case{9, 3, 11, 10}})
      for (bool causal : {true, false})
        for (int tile_rows : {0, 7}) {
          const Geometry g{3, 5, c.nq, c.q_pos0, causal};
          const auto blocks = make_blocks(g, {{c.nk, c.k_pos0}}, 100);
          SCOPED_TRACE(describe(g, blocks, tile_rows) + ", " + form_name(form));
          check_blocks(g, blocks, {0}, tile_rows);
        }
  }
}

TEST(BlockAttention, DeviceFormBatchesAsManyHeadsAsTheScratchHolds) {
  // Five heads with scratch for two: batches of 2, 2 and 1 heads; and for
  // one head: the per-head loop. Each must match the reference.
  const FormScope scope(kn::AttentionKernelForm::device);
  for (int scratch_heads : {1, 2, 5})
    for (bool causal : {true, false}) {
      const Geometry g{5, 3, 40, 30, causal};
      const auto blocks = make_blocks(g, {{50, 0}, {20, 50}}, 500);
      SCOPED_TRACE(describe(g, blocks, 0) + ", scratch for " + std::to_string(scratch_heads) + " heads");
      check_blocks(g, blocks, {1, 0}, 0, scratch_heads);
    }
}

TEST(BlockAttention, FullyMaskedPairTouchesNothing) {
  // Every key after every query: the kernel returns false at once and every
  // buffer keeps its bits.
  const Geometry g{2, 3, 20, 0, true};
  const auto blocks = make_blocks(g, {{13, 20}}, 200);
  const std::size_t n = static_cast<std::size_t>(g.heads) * g.nq * g.hs;
  Kernel kern(g, uniform(n, 1), blocks, uniform(n, 2), 0);
  upload(kern.o, uniform(n, 3));
  upload(kern.lse, uniform(kern.lse.size(), 4));
  upload(kern.delta, uniform(kern.delta.size(), 5));
  upload(kern.dq, uniform(n, 6));
  upload(kern.dk[0], uniform(kern.dk[0].size(), 7));
  upload(kern.dv[0], uniform(kern.dv[0].size(), 8));
  const auto o0 = host(kern.o), l0 = host(kern.lse), q0 = host(kern.dq), k0 = host(kern.dk[0]), v0 = host(kern.dv[0]);
  EXPECT_FALSE(kern.forward(blocks, 0));
  EXPECT_FALSE(kern.backward(blocks, 0));
  EXPECT_EQ(host(kern.o), o0);
  EXPECT_EQ(host(kern.lse), l0);
  EXPECT_EQ(host(kern.dq), q0);
  EXPECT_EQ(host(kern.dk[0]), k0);
  EXPECT_EQ(host(kern.dv[0]), v0);
  // One position earlier and the last query row sees the first key: work to do.
  const auto shifted = make_blocks(g, {{13, 19}}, 200);
  Kernel kern2(g, uniform(n, 1), shifted, uniform(n, 2), 0);
  kern2.reset();
  EXPECT_TRUE(kern2.forward(shifted, 0));
}

TEST(BlockAttention, MergeInAnyOrderMatchesReference) {
  // Three K/V blocks around a q block at positions 50..109: the first fully
  // visible, the second a staircase, the third visible only to the last rows.
  for (const auto form : kForms) {
    const FormScope scope(form);
    for (bool causal : {true, false}) {
      const Geometry g{3, 5, 60, 50, causal};
      const auto blocks = make_blocks(g, {{40, 0}, {33, 40}, {50, 73}}, 300);
      for (const std::vector<int>& order : {std::vector<int>{0, 1, 2}, {2, 1, 0}, {1, 2, 0}})
        for (int tile_rows : {0, 7}) {
          SCOPED_TRACE(describe(g, blocks, tile_rows) + " order " + std::to_string(order[0]) +
                       std::to_string(order[1]) + std::to_string(order[2]) + ", " + form_name(form));
          check_blocks(g, blocks, order, tile_rows);
        }
    }
  }
}

TEST(BlockAttention, NegativeControlAWrongMergeFails) {
  // The bound can fail: leaving one of three blocks out of the merge (a ring
  // step lost) moves O far beyond kBlockTol.
  const Geometry g{3, 5, 60, 50, true};
  const auto blocks = make_blocks(g, {{40, 0}, {33, 40}, {50, 73}}, 300);
  const std::size_t n = static_cast<std::size_t>(g.heads) * g.nq * g.hs;
  const auto hq = as_float(uniform(n, 11));
  const Reference ref = reference(g, hq, blocks, uniform(n, 12));
  Kernel kern(g, hq, blocks, uniform(n, 12), 0);
  kern.reset();
  kern.forward(blocks, 0);
  kern.forward(blocks, 2);
  const double e = rel_err(ref.o, host(kern.o));
  std::printf("  [neg] block 1 left out: rel err %.3e (must exceed %.0e)\n", e, kBlockTol);
  EXPECT_GT(e, 100 * kBlockTol);
}

TEST(BlockAttention, RefusesTooSmallScratch) {
  const Geometry g{2, 3, 20, 0, true};
  const auto blocks = make_blocks(g, {{13, 0}}, 400);
  const std::size_t n = static_cast<std::size_t>(g.heads) * g.nq * g.hs;
  Kernel kern(g, uniform(n, 1), blocks, uniform(n, 2), 0);
  kern.scratch = View1D("small", kn::attention_block_scratch_size(g.nq, 13) - 1);  // one head's share, less one
  kern.reset();
  EXPECT_THROW(kern.backward(blocks, 0), Error);
}

// ---- the one-rank ContextParallelAttention --------------------------------------------

namespace {

// Buffers of one ContextParallelAttention on one rank.
struct OneRank {
  kn::AttentionShape s;
  ContextParallelAttention attn;
  View2D qkv, out, dqkv, R;
  View1D qkvh, lse;
  Bf16View1D qkvh_bf16;
  bool bf16;
  OneRank(const kn::AttentionShape& shape, bool causal, bool mixed = false)
      : s(shape), attn(nullptr, shape, shape.seq_len, causal, mixed), bf16(mixed) {
    const std::size_t N = static_cast<std::size_t>(s.batch) * s.seq_len, C = s.channels, W = s.qkv_width();
    qkv = View2D("qkv", N, W);
    out = View2D("out", N, C);
    dqkv = View2D("dqkv", N, W);
    R = View2D("R", N, C);
    if (bf16)
      qkvh_bf16 = Bf16View1D("qkvh_bf16", ContextParallelAttention::qkvh_size(s));
    else
      qkvh = View1D("qkvh", ContextParallelAttention::qkvh_size(s));
    lse = View1D("lse", ContextParallelAttention::lse_size(s));
  }
  void forward() { attn.forward(out, qkv, {qkvh, lse, qkvh_bf16}); }
  void backward() { attn.backward(dqkv, R, out, {qkvh, lse, qkvh_bf16}); }
};

// Each value rounded to the nearest bf16.
std::vector<double> rounded_to_bf16(std::vector<double> x) {
  for (double& v : x) v = static_cast<float>(bf16(static_cast<float>(v)));
  return x;
}

// Token-major naive attention: out [B*T, C] from qkv [B*T, 3C].
std::vector<double> reference_tokens(const std::vector<double>& qkv, const kn::AttentionShape& s, bool causal) {
  const int B = s.batch, T = s.seq_len, C = s.channels, H = s.heads, hs = s.head_size();
  std::vector<double> out(static_cast<std::size_t>(B) * T * C, 0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const int last = causal ? t : T - 1;
        std::vector<double> p(last + 1);
        double mx = kNegInf, sum = 0;
        for (int j = 0; j <= last; ++j) {
          double sc = 0;
          for (int d = 0; d < hs; ++d)
            sc += qkv[(b * T + t) * 3 * C + h * hs + d] * qkv[(b * T + j) * 3 * C + C + h * hs + d];
          p[j] = sc / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int d = 0; d < hs; ++d) {
          double o = 0;
          for (int j = 0; j <= last; ++j) o += p[j] / sum * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + d];
          out[(b * T + t) * C + h * hs + d] = o;
        }
      }
  return out;
}

// Grouped-query attention as multi-head attention: the MHA shape of `s`, and
// its qkv [B*T, 3C] with kv head g's k and v repeated for each of its r query
// heads g r .. g r + r - 1.
kn::AttentionShape as_mha(kn::AttentionShape s) {
  s.kv_heads = 0;
  return s;
}
std::vector<double> repeat_kv(const std::vector<double>& qkv, const kn::AttentionShape& s) {
  const int C = s.channels, hs = s.head_size(), r = s.group(), W = s.qkv_width(), KVC = s.kv_channels();
  const std::size_t N = static_cast<std::size_t>(s.batch) * s.seq_len;
  std::vector<double> mha(N * 3 * C);
  for (std::size_t n = 0; n < N; ++n)
    for (int h = 0; h < s.heads; ++h)
      for (int d = 0; d < hs; ++d) {
        const int kvc = (h / r) * hs + d;  // column of kv head h / r within k (and v)
        mha[n * 3 * C + h * hs + d] = qkv[n * W + h * hs + d];
        mha[n * 3 * C + C + h * hs + d] = qkv[n * W + C + kvc];
        mha[n * 3 * C + 2 * C + h * hs + d] = qkv[n * W + C + KVC + kvc];
      }
  return mha;
}
// The gradient of the MHA form folded back: dq as is, dk and dv of kv head g
// the sum over its r copies.
std::vector<double> fold_kv(const std::vector<double>& dmha, const kn::AttentionShape& s) {
  const int C = s.channels, hs = s.head_size(), r = s.group(), W = s.qkv_width(), KVC = s.kv_channels();
  const std::size_t N = static_cast<std::size_t>(s.batch) * s.seq_len;
  std::vector<double> g(N * W, 0);
  for (std::size_t n = 0; n < N; ++n)
    for (int h = 0; h < s.heads; ++h)
      for (int d = 0; d < hs; ++d) {
        const int kvc = (h / r) * hs + d;
        g[n * W + h * hs + d] = dmha[n * 3 * C + h * hs + d];
        g[n * W + C + kvc] += dmha[n * 3 * C + C + h * hs + d];
        g[n * W + C + KVC + kvc] += dmha[n * 3 * C + 2 * C + h * hs + d];
      }
  return g;
}

std::string describe(const kn::AttentionShape& s) {
  return "B " + std::to_string(s.batch) + " T " + std::to_string(s.seq_len) + " C " + std::to_string(s.channels) +
         " H " + std::to_string(s.heads) + " KV " + std::to_string(s.kv());
}

// Grouped-query shapes: r = 2 with B = 2 (batch and group offsets), r = 3
// with T crossing the host's 32-row and the device's 128-row tiles, and
// multi-query (KV = 1) with two kv heads' worth of groups folded together.
const kn::AttentionShape kGqaShapes[] = {{2, 37, 12, 4, 2}, {1, 150, 12, 6, 2}, {2, 5, 15, 3, 1}};

}  // namespace

TEST(ContextParallelAttention, OneRankForwardMatchesReference) {
  // B = 2 checks the batch offsets; T = 37 crosses the 32-row tiles (and
  // T = 150 the device form's 128-row tiles).
  for (const auto form : kForms) {
    const FormScope scope(form);
    for (const kn::AttentionShape shape : {kn::AttentionShape{2, 37, 15, 3}, kn::AttentionShape{1, 150, 8, 2}})
      for (bool causal : {true, false}) {
        OneRank a(shape, causal);
        fill_uniform(a.qkv, 41, -1.5, 1.5);
        Kokkos::deep_copy(a.out, real(7.5));  // overwritten
        a.forward();
        SCOPED_TRACE(std::string(causal ? "causal" : "full") + " T " + std::to_string(shape.seq_len) + ", " +
                     form_name(form));
        expect_close("one-rank attention out", reference_tokens(host(a.qkv), a.s, causal), host(a.out));
      }
  }
}

TEST(ContextParallelAttention, OneRankBf16MatchesReferenceOnRoundedInputs) {
  // Under bf16 q, k, v are rounded once and P (forward), P and dS
  // (backward) once per tile before their products; everything else is fp32.
  // Against the double reference on the rounded q, k, v the output is off
  // by P's rounding only (measured rel err ~1e-3); against the reference on
  // the fp32 inputs, the input rounding adds its share.
  for (const auto form : kForms) {
    const FormScope scope(form);
    const kn::AttentionShape shape{2, 37, 16, 2};
    OneRank mixed(shape, true, true), full(shape, true);
    fill_uniform(mixed.qkv, 43, -1.5, 1.5);
    Kokkos::deep_copy(full.qkv, mixed.qkv);
    mixed.forward();
    full.forward();
    SCOPED_TRACE(form_name(form));
    const std::vector<double> want = reference_tokens(rounded_to_bf16(host(mixed.qkv)), mixed.s, true);
    expect_close("bf16 attention out", want, host(mixed.out), 4e-3);
    // For scale: the fp32 path on the unrounded inputs, against the same reference.
    const double e_full = rel_err(want, host(full.out)), e_mixed = rel_err(want, host(mixed.out));
    std::printf("  [bf16] out rel err: bf16 path %.2e, fp32 path %.2e\n", e_mixed, e_full);
    EXPECT_GT(e_mixed, 0) << "the bf16 path rounds P: it cannot equal the reference exactly";
    // Backward: the bf16 gradients against the fp32 path's on the same data.
    fill_uniform(mixed.R, 44, -1, 1);
    Kokkos::deep_copy(full.R, mixed.R);
    mixed.backward();
    full.backward();
    expect_close("bf16 attention dqkv vs fp32", host(full.dqkv), host(mixed.dqkv), 1e-2);
  }
}

TEST(ContextParallelAttention, OneRankIsCausal) {
  OneRank a({2, 5, 15, 3}, true);
  const int T = a.s.seq_len, C = a.s.channels;
  fill_uniform(a.qkv, 42, -1.5, 1.5);
  a.forward();
  const auto before = host(a.out);
  // Change token t0's k and v in sequence 0: outputs at t < t0 (and all of
  // sequence 1) must not move at all.
  const int t0 = 3;
  auto q = host(a.qkv);
  for (int c = C; c < 3 * C; ++c) q[t0 * 3 * C + c] += 0.75;
  upload(a.qkv, q);
  a.forward();
  const auto after = host(a.out);
  for (int row = 0; row < 2 * T; ++row)
    for (int c = 0; c < C; ++c)
      if (!(row >= t0 && row < T)) EXPECT_EQ(before[row * C + c], after[row * C + c]) << "row " << row << " col " << c;
  double moved = 0;
  for (int c = 0; c < C; ++c) moved += std::abs(after[t0 * C + c] - before[t0 * C + c]);
  EXPECT_GT(moved, 1e-3) << "the perturbed token's own output should change";
}

TEST(ContextParallelAttention, OneRankBackwardMatchesFiniteDifferences) {
  // T = 70 crosses the backward's key tiles (32) and the forward's query tiles.
  for (const auto form : kForms)
    for (const kn::AttentionShape shape :
         {kn::AttentionShape{2, 5, 15, 3}, kn::AttentionShape{1, 7, 12, 4}, kn::AttentionShape{1, 70, 6, 2}})
      for (bool causal : {true, false}) {
        const FormScope scope(form);
        OneRank a(shape, causal);
        SCOPED_TRACE("B " + std::to_string(shape.batch) + " T " + std::to_string(shape.seq_len) + " C " +
                     std::to_string(shape.channels) + " H " + std::to_string(shape.heads) +
                     (causal ? " causal" : " full") + ", " + form_name(form));
        fill_uniform(a.qkv, 43, -1.5, 1.5);
        fill_uniform(a.R, 44, -1, 1);
        const auto hR = host(a.R);
        auto L = [&] {
          a.forward();
          return dot(host(a.out), hR);
        };
        L();
        Kokkos::deep_copy(a.dqkv, real(7.5));  // dqkv is overwritten, not accumulated
        a.backward();
        const auto an = host(a.dqkv);
        const std::size_t C = shape.channels;
        const auto idx = indices(a.qkv.size(), 1200);
        const auto fd = central_diff(a.qkv, idx, L);
        // Separately for q, k and v columns, so an error in one cannot hide in the others.
        const char* names[3] = {"attention dq", "attention dk", "attention dv"};
        for (std::size_t which = 0; which < 3; ++which) {
          std::vector<double> f, g;
          for (std::size_t n = 0; n < idx.size(); ++n)
            if ((idx[n] % (3 * C)) / C == which) {
              f.push_back(fd[n]);
              g.push_back(an[idx[n]]);
            }
          ASSERT_FALSE(f.empty());
          expect_grad(names[which], f, g);
        }
      }
}

// ---- grouped-query attention ------------------------------------------------------

// GQA forward and backward against MHA on the kv heads repeated r times,
// its dk and dv summed over the copies; max_out and max_grad bound the
// norm-relative errors.
namespace {
void check_gqa_against_mha(bool bf16, double max_out, double max_grad) {
  for (const auto form : kForms)
    for (const kn::AttentionShape shape : kGqaShapes)
      for (bool causal : {true, false}) {
        const FormScope scope(form);
        SCOPED_TRACE(describe(shape) + (causal ? " causal" : " full") + (bf16 ? " bf16" : "") + ", " + form_name(form));
        OneRank gqa(shape, causal, bf16), mha(as_mha(shape), causal, bf16);
        ASSERT_EQ(gqa.qkv.extent(1), static_cast<std::size_t>(shape.channels + 2 * shape.kv() * shape.head_size()));
        fill_uniform(gqa.qkv, 61, -1.5, 1.5);
        fill_uniform(gqa.R, 62, -1, 1);
        upload(mha.qkv, repeat_kv(host(gqa.qkv), shape));
        Kokkos::deep_copy(mha.R, gqa.R);
        gqa.forward();
        mha.forward();
        Kokkos::deep_copy(gqa.dqkv, real(7.5));  // overwritten, not accumulated
        gqa.backward();
        mha.backward();
        const double e_out = rel_err(host(mha.out), host(gqa.out));
        const double e_grad = rel_err(fold_kv(host(mha.dqkv), shape), host(gqa.dqkv));
        std::printf("  [gqa] %s%s%s, %s: out rel err %.2e, dqkv %.2e\n", describe(shape).c_str(),
                    causal ? " causal" : " full", bf16 ? " bf16" : "", form_name(form), e_out, e_grad);
        EXPECT_LT(e_out, max_out);
        EXPECT_LT(e_grad, max_grad);
      }
}
}  // namespace

// GQA runs the same per-head products as MHA on the repeated kv heads; only
// the sum of a kv head's r shares differs in order (in double here, in
// float there), so the bounds are float rounding: 1e-6 (out), 1e-5 (dqkv).
TEST(GroupedQueryAttention, EqualsMultiHeadWithKvHeadsRepeated) { check_gqa_against_mha(false, 1e-6, 1e-5); }

// Under bf16 both round q, k, v (the same values) and P, dS per tile of the
// same shapes: the same bounds hold.
TEST(GroupedQueryAttention, Bf16EqualsMultiHeadWithKvHeadsRepeated) { check_gqa_against_mha(true, 1e-6, 1e-5); }

TEST(GroupedQueryAttention, OneRankBackwardMatchesFiniteDifferences) {
  for (const auto form : kForms)
    for (const kn::AttentionShape shape :
         {kn::AttentionShape{2, 5, 12, 4, 2}, kn::AttentionShape{1, 7, 12, 6, 2}, kn::AttentionShape{1, 40, 6, 3, 1}})
      for (bool causal : {true, false}) {
        const FormScope scope(form);
        OneRank a(shape, causal);
        SCOPED_TRACE(describe(shape) + (causal ? " causal" : " full") + ", " + form_name(form));
        fill_uniform(a.qkv, 63, -1.5, 1.5);
        fill_uniform(a.R, 64, -1, 1);
        const auto hR = host(a.R);
        auto L = [&] {
          a.forward();
          return dot(host(a.out), hR);
        };
        L();
        a.backward();
        const auto an = host(a.dqkv);
        const std::size_t C = shape.channels, KVC = shape.kv_channels(), W = shape.qkv_width();
        const auto idx = indices(a.qkv.size(), 1200);
        const auto fd = central_diff(a.qkv, idx, L);
        // Separately for the q, k and v columns (k and v KV heads wide).
        const char* names[3] = {"gqa attention dq", "gqa attention dk", "gqa attention dv"};
        for (std::size_t which = 0; which < 3; ++which) {
          std::vector<double> f, g;
          for (std::size_t n = 0; n < idx.size(); ++n) {
            const std::size_t col = idx[n] % W;
            if ((col < C ? 0 : col < C + KVC ? 1 : 2) == which) {
              f.push_back(fd[n]);
              g.push_back(an[idx[n]]);
            }
          }
          ASSERT_FALSE(f.empty());
          expect_grad(names[which], f, g);
        }
      }
}

// kv_heads = heads spelled out is today's attention, bit for bit.
namespace {
void check_spelled_out_kv_heads(bool bf16) {
  for (const auto form : kForms) {
    const FormScope scope(form);
    const kn::AttentionShape mha{2, 37, 15, 3}, spelled{2, 37, 15, 3, 3};
    OneRank a(mha, true, bf16), b(spelled, true, bf16);
    fill_uniform(a.qkv, 65, -1.5, 1.5);
    fill_uniform(a.R, 66, -1, 1);
    Kokkos::deep_copy(b.qkv, a.qkv);
    Kokkos::deep_copy(b.R, a.R);
    a.forward();
    b.forward();
    a.backward();
    b.backward();
    EXPECT_EQ(host(a.out), host(b.out)) << form_name(form);
    EXPECT_EQ(host(a.dqkv), host(b.dqkv)) << form_name(form);
  }
}
}  // namespace
TEST(GroupedQueryAttention, KvHeadsEqualToHeadsIsMultiHeadBitwise) { check_spelled_out_kv_heads(false); }
TEST(GroupedQueryAttention, Bf16KvHeadsEqualToHeadsIsMultiHeadBitwise) { check_spelled_out_kv_heads(true); }

TEST(GroupedQueryAttention, ShapeAccessors) {
  const kn::AttentionShape s{2, 5, 12, 6, 2};  // hs 2, r 3
  EXPECT_EQ(s.kv(), 2);
  EXPECT_EQ(s.group(), 3);
  EXPECT_EQ(s.kv_channels(), 4);
  EXPECT_EQ(s.qkv_width(), 12 + 2 * 4);
  EXPECT_EQ(s.part_size(), 2u * 5 * 12);
  EXPECT_EQ(s.kv_part_size(), 2u * 5 * 4);
  EXPECT_EQ(s.rows_size(), 2u * 6 * 5);
  EXPECT_EQ(s.kv_rows_size(), 2u * 2 * 5);
  EXPECT_EQ(s.k_offset(), s.part_size());
  EXPECT_EQ(s.v_offset(), s.part_size() + s.kv_part_size());
  EXPECT_EQ(s.qkvh_size(), s.part_size() + 2 * s.kv_part_size());
  EXPECT_EQ(ContextParallelAttention::qkvh_size(s), s.qkvh_size());
  const kn::AttentionShape m{2, 5, 12, 6};  // kv_heads 0: multi-head
  EXPECT_EQ(m.kv(), 6);
  EXPECT_EQ(m.qkv_width(), 36);
  EXPECT_EQ(m.qkvh_size(), 3 * m.part_size());
}

TEST(GroupedQueryAttention, RefusesKvHeadsNotDividingHeadsAndWrongQkvWidth) {
  EXPECT_THROW(ContextParallelAttention(nullptr, kn::AttentionShape{1, 6, 12, 6, 4}, 6), Error);
  EXPECT_THROW(ContextParallelAttention(nullptr, kn::AttentionShape{1, 6, 12, 6, -1}, 6), Error);
  OneRank a({1, 6, 12, 6, 2}, true);
  View2D mha_wide("mha_wide", 6, 36);  // 3C columns: an MHA qkv, not this GQA's C + 2 KV hs
  EXPECT_THROW(a.attn.forward(a.out, mha_wide, {a.qkvh, a.lse, {}}), Error);
}

TEST(ContextParallelAttention, RefusesWrongBuffers) {
  OneRank a({1, 6, 6, 2}, true);
  View1D short_lse("short", ContextParallelAttention::lse_size(a.s) - 1);
  EXPECT_THROW(a.attn.forward(a.out, a.qkv, {a.qkvh, short_lse, {}}), Error);
  View2D wrong("wrong", 5, 18);
  EXPECT_THROW(a.attn.forward(a.out, wrong, {a.qkvh, a.lse, {}}), Error);
}

// ---- the chunk layout ------------------------------------------------------------------

TEST(CpLayout, ChunksPairEarlyWithLate) {
  // T = 16, cp = 2, c = 4: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const CpLayout r0 = make_cp_layout(16, 2, 0), r1 = make_cp_layout(16, 2, 1);
  std::vector<int> p0, p1;
  for (int t = 0; t < 8; ++t) {
    p0.push_back(r0.position(t));
    p1.push_back(r1.position(t));
  }
  EXPECT_EQ(p0, (std::vector<int>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(p1, (std::vector<int>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(r0.local_len(), 8);
  EXPECT_EQ(r0.chunk_len(), 4);
}

TEST(CpLayout, EveryPositionOnceAndCausalWorkBalanced) {
  for (int cp : {1, 2, 3, 4}) {
    const int T = cp == 1 ? 7 : 2 * cp * 5;  // cp = 1: any T, odd included
    std::vector<int> seen(T, 0);
    std::vector<long> work;
    for (int r = 0; r < cp; ++r) {
      const CpLayout l = make_cp_layout(T, cp, r);
      long w = 0;
      for (int t = 0; t < l.local_len(); ++t) {
        ++seen[l.position(t)];
        w += l.position(t) + 1;  // keys a query sees under the causal mask
      }
      work.push_back(w);
    }
    for (int p = 0; p < T; ++p) EXPECT_EQ(seen[p], 1) << "cp " << cp << " position " << p;
    EXPECT_EQ(*std::min_element(work.begin(), work.end()), *std::max_element(work.begin(), work.end()))
        << "cp " << cp << ": causal work differs between ranks";
  }
}

TEST(CpLayout, RefusesSequenceNotDivisibleByTwoCp) {
  try {
    make_cp_layout(12, 4, 0);
    FAIL() << "T = 12 with cp = 4 must be refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.seq_len = 12"), std::string::npos) << what;
    EXPECT_NE(what.find("parallel.cp"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(make_cp_layout(16, 4, 3));
  EXPECT_THROW(make_cp_layout(16, 4, 4), Error);
}
