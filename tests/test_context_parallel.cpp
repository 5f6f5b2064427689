// SPDX-License-Identifier: BSD-3-Clause
// Ring attention over every rank (cp = 2 or 4 under mpiexec -n 2 / 4)
// against plain one-rank attention on the whole sequence, forward and
// backward, causal and not, multi-head and grouped-query (the ring's bytes
// from the cp Communicator's counters against the kv heads' formula).
//
// Every rank builds the same global inputs, runs the one-rank attention on
// the whole sequence (itself checked against a double reference and finite
// differences in test_attention.cpp), and compares the rows it holds under
// the cp chunk layout with what the ring gives it.
//
// Bound: kRingTol = 1e-5, norm-relative, over all ranks' rows together and
// over each rank's own. Both sides are float32 with the same kernels; they
// differ only in the order the LSE merge and the GEMM sums add up (blocks of
// c keys in ring order instead of one pass), which moves results by float
// rounding, ~1e-7 to 1e-6 (measured values are printed). The negative
// controls show what a real error does: a K/V block that one rank altered,
// or rows compared at the wrong positions, miss by orders of magnitude.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "layers/context_parallel.hpp"
#include "numeric_check.hpp"

using namespace ndmini;
using namespace ndmini::test;
namespace kn = ndmini::kernels;

namespace {

constexpr double kRingTol = 1e-5;
// Under bf16 the ring and one rank round P (and dS) in different tiles, with
// different running maxima, and the ring sums dK/dV in bf16 on the wire:
// measured up to 2.0e-3 (out) and 3.6e-3 (dqkv, cp = 4) on 2 and 4 ranks.
constexpr double kRingTolBf16 = 6e-3;

struct Attention {
  kn::AttentionShape s;
  ContextParallelAttention attn;
  View2D qkv, out, dout, dqkv;
  View1D qkvh, lse;
  Bf16View1D qkvh_bf16;
  Attention(Communicator* comm, const kn::AttentionShape& local, int seq_len, bool causal, bool bf16 = false)
      : s(local), attn(comm, local, seq_len, causal, bf16) {
    const std::size_t N = static_cast<std::size_t>(s.batch) * s.seq_len, C = s.channels, W = s.qkv_width();
    qkv = View2D("qkv", N, W);
    out = View2D("out", N, C);
    dout = View2D("dout", N, C);
    dqkv = View2D("dqkv", N, W);
    if (bf16)
      qkvh_bf16 = Bf16View1D("qkvh_bf16", ContextParallelAttention::qkvh_size(s));
    else
      qkvh = View1D("qkvh", ContextParallelAttention::qkvh_size(s));
    lse = View1D("lse", ContextParallelAttention::lse_size(s));
  }
  void forward() { attn.forward(out, qkv, {qkvh, lse, qkvh_bf16}); }
  void backward() { attn.backward(dqkv, dout, out, {qkvh, lse, qkvh_bf16}); }
};

// Rows of a global [B*T, width] matrix that a rank holds: row (b, t) of the
// local [B*T/cp, width] matrix is global row (b, position(t)).
std::vector<double> local_rows(const std::vector<double>& global, int width, int batch, int seq_len,
                               const CpLayout& layout) {
  const int Tl = layout.local_len();
  std::vector<double> out;
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < Tl; ++t) {
      const std::size_t g = (static_cast<std::size_t>(b) * seq_len + layout.position(t)) * width;
      out.insert(out.end(), global.begin() + g, global.begin() + g + width);
    }
  return out;
}

// Norm-relative error over every rank's rows together.
double global_rel_err(const std::vector<double>& ref, const std::vector<double>& got) {
  double sums[2] = {0, 0};
  for (std::size_t i = 0; i < ref.size(); ++i) {
    sums[0] += (ref[i] - got[i]) * (ref[i] - got[i]);
    sums[1] += ref[i] * ref[i];
  }
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return std::sqrt(sums[0] / sums[1]);
}

double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

int rank0() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r == 0;
}

// The error of `got` against the reference rows, over all ranks and the worst single rank.
struct Errors {
  double global, worst_rank;
};
Errors compare(const std::vector<double>& ref, const std::vector<double>& got) {
  return {global_rel_err(ref, got), max_over_ranks(rel_err(ref, got))};
}

class RingAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = std::make_unique<Communicator>(MPI_COMM_WORLD, "cp");
    if (comm_->size() < 2) GTEST_SKIP() << "ring attention needs mpiexec -n 2 or more";
  }
  std::unique_ptr<Communicator> comm_;
};

// One case: the global problem, its one-rank answer, and this rank's ring.
struct Case {
  kn::AttentionShape global;
  bool causal, bf16;
  std::vector<double> qkv, dout;  // global inputs, identical on every rank
  std::vector<double> out, dqkv;  // the one-rank answer
  Case(const kn::AttentionShape& g, bool is_causal, bool mixed = false) : global(g), causal(is_causal), bf16(mixed) {
    Attention one(nullptr, g, g.seq_len, causal, bf16);
    fill_uniform(one.qkv, 51, -1.5, 1.5);
    fill_uniform(one.dout, 52, -1, 1);
    one.forward();
    one.backward();
    qkv = host(one.qkv);
    dout = host(one.dout);
    out = host(one.out);
    dqkv = host(one.dqkv);
  }
  std::string name() const {
    return "B " + std::to_string(global.batch) + " T " + std::to_string(global.seq_len) + " C " +
           std::to_string(global.channels) + " H " + std::to_string(global.heads) +
           (global.kv() != global.heads ? " KV " + std::to_string(global.kv()) : std::string()) +
           (causal ? " causal" : " full") + (bf16 ? " bf16" : "");
  }
};

}  // namespace

TEST_F(RingAttention, MatchesOneRankAttention) {
  const int cp = comm_->size();
  // c = 3: tiny chunks; c = 37: chunks that cross the kernel's 32-row tiles.
  // bf16: one rank under bf16 is the reference. kv_heads 0: multi-head;
  // then grouped-query attention (r = 2, with B = 2) and multi-query (r = 4).
  for (bool bf16 : {false, true})
    for (const auto& [batch, c, channels, heads, kv_heads] : {std::tuple{2, 3, 12, 3, 0}, std::tuple{1, 37, 10, 2, 0},
                                                              std::tuple{2, 3, 12, 4, 2}, std::tuple{1, 37, 16, 4, 1}})
      for (bool causal : {true, false}) {
        const kn::AttentionShape global{batch, 2 * cp * c, channels, heads, kv_heads};
        const int W = global.qkv_width();
        const Case ref(global, causal, bf16);
        const double tol = bf16 ? kRingTolBf16 : kRingTol;
        SCOPED_TRACE(ref.name());
        const CpLayout layout = make_cp_layout(global.seq_len, cp, comm_->rank());
        kn::AttentionShape local = global;
        local.seq_len = layout.local_len();
        Attention ring(comm_.get(), local, global.seq_len, causal, bf16);
        upload(ring.qkv, local_rows(ref.qkv, W, batch, global.seq_len, layout));
        upload(ring.dout, local_rows(ref.dout, channels, batch, global.seq_len, layout));
        comm_->reset_stats();
        ring.forward();
        const CommStats fwd = comm_->stats();
        Kokkos::deep_copy(ring.dqkv, real(7.5));  // overwritten, not accumulated
        comm_->reset_stats();
        ring.backward();
        const CommStats bwd = comm_->stats();

        const Errors eo = compare(local_rows(ref.out, channels, batch, global.seq_len, layout), host(ring.out));
        const Errors eg = compare(local_rows(ref.dqkv, W, batch, global.seq_len, layout), host(ring.dqkv));
        if (rank0())
          std::printf(
              "  [ring cp=%d] %-30s out rel err %.3e (worst rank %.3e), dqkv %.3e (worst rank %.3e); bound %.0e\n", cp,
              ref.name().c_str(), eo.global, eo.worst_rank, eg.global, eg.worst_rank, tol);
        EXPECT_LT(eo.worst_rank, tol) << "forward";
        EXPECT_LT(eg.worst_rank, tol) << "backward";

        // The exchanges, each one batched call that sends and receives a block
        // of K and V (or of dK and dV): forward cp-1 K/V hops; backward one
        // call per step (cp-1 K/V hops, cp-1 dK/dV hops) and the final hop of
        // the dK/dV sums home. Under bf16 both travel in bf16 (half the bytes).
        // A message holds k and v of the KV kv heads only: B x KV x T/cp x hs
        // values each, MHA's message (H heads) over r = H / KV.
        const std::int64_t value_bytes = bf16 ? 2 : sizeof(real);
        const std::int64_t kv_bytes =
            2 * static_cast<std::int64_t>(batch) * global.kv() * layout.local_len() * global.head_size() * value_bytes;
        const std::int64_t mha_kv_bytes =
            2 * static_cast<std::int64_t>(batch) * layout.local_len() * channels * value_bytes;
        EXPECT_EQ(kv_bytes * global.group(), mha_kv_bytes);
        const std::int64_t dkv_bytes = kv_bytes;
        EXPECT_EQ(fwd.calls, cp - 1);
        EXPECT_EQ(fwd.bytes, (cp - 1) * 2 * kv_bytes);
        EXPECT_EQ(bwd.calls, cp + 1);
        EXPECT_EQ(bwd.bytes, (cp - 1) * 2 * kv_bytes + cp * 2 * dkv_bytes);
      }
}

TEST_F(RingAttention, NegativeControlsFail) {
  const int cp = comm_->size();
  const kn::AttentionShape global{2, 2 * cp * 3, 12, 3};
  const Case ref(global, true);
  const CpLayout layout = make_cp_layout(global.seq_len, cp, comm_->rank());
  kn::AttentionShape local = global;
  local.seq_len = layout.local_len();
  const int C = global.channels;

  // 1. The last rank's keys altered before the ring: under the causal mask
  //    every rank's late chunk (2cp-1-r >= cp) sees chunk cp-1, which that
  //    rank holds, so every rank's comparison must fail.
  {
    Attention ring(comm_.get(), local, global.seq_len, true);
    auto qkv = local_rows(ref.qkv, 3 * C, global.batch, global.seq_len, layout);
    if (comm_->rank() == cp - 1)
      for (std::size_t row = 0; row < qkv.size() / (3 * C); ++row)
        for (int c = C; c < 2 * C; ++c) qkv[row * 3 * C + c] += 0.25;
    upload(ring.qkv, qkv);
    ring.forward();
    double e = rel_err(local_rows(ref.out, C, global.batch, global.seq_len, layout), host(ring.out));
    MPI_Allreduce(MPI_IN_PLACE, &e, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    if (rank0()) std::printf("  [neg] rank %d's keys altered: smallest rank error %.3e\n", cp - 1, e);
    EXPECT_GT(e, 100 * kRingTol);
  }
  // 2. The right ring output compared at a contiguous split's positions
  //    (rank r holding rows [r T/cp, (r+1) T/cp)) instead of the chunk layout.
  {
    Attention ring(comm_.get(), local, global.seq_len, true);
    upload(ring.qkv, local_rows(ref.qkv, 3 * C, global.batch, global.seq_len, layout));
    ring.forward();
    const int Tl = layout.local_len(), r = comm_->rank();
    std::vector<double> wrong;
    for (int b = 0; b < global.batch; ++b)
      for (int t = 0; t < Tl; ++t)
        for (int c = 0; c < C; ++c)
          wrong.push_back(ref.out[(static_cast<std::size_t>(b) * global.seq_len + r * Tl + t) * C + c]);
    const double e = global_rel_err(wrong, host(ring.out));
    if (rank0()) std::printf("  [neg] contiguous split's positions: rel err %.3e\n", e);
    EXPECT_GT(e, 100 * kRingTol);
  }
}

TEST_F(RingAttention, RefusesAMismatchedLocalShape) {
  const int cp = comm_->size();
  // T/cp rows per rank, not T.
  EXPECT_THROW(ContextParallelAttention(comm_.get(), kn::AttentionShape{1, 4 * cp, 6, 2}, 4 * cp), Error);
  // T not divisible by 2 cp.
  EXPECT_THROW(ContextParallelAttention(comm_.get(), kn::AttentionShape{1, 3, 6, 2}, 3 * cp), Error);
}
