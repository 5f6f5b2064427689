// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/attention.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/compat.hpp"
#include "core/error.hpp"

namespace ndmini::kernels {
namespace {

using Range = Kokkos::RangePolicy<ExecSpace>;

// Rows (forward: query rows; backward: key rows) per tile of the causal
// staircase. Smaller tiles compute less of the masked triangle but make
// smaller, less efficient GEMMs; on one core at hs = 64, T = 256
// (bench/bench_attention.cpp) 32 was faster than 64 and no slower than 16.
constexpr int kTileRows = 32;
// Tile width where every key is visible (no staircase): bounds the scratch
// of the full blocks of the ring and of non-causal attention.
constexpr int kMaxTileRows = 128;

// One tile: query rows [row0, row0 + rows) against keys [col0, col0 + cols).
struct Tile {
  int row0, rows, col0, cols;
};

// The forward walks query tiles: rows before the first visible key are
// skipped, rows of the staircase go tile_rows at a time against the key
// prefix their last row sees, rows that see every key kMaxTileRows at a
// time. A tile holds every visible key of its rows, as the merge needs.
// Row r sees keys j <= r + delta. Host code, like the cursor below.
class QueryTiles {
 public:
  QueryTiles(int nq, int nk, int delta, bool causal, int tile_rows)
      : nq_(nq),
        nk_(nk),
        delta_(delta),
        causal_(causal),
        tile_rows_(tile_rows),
        row_(causal ? std::max(0, -delta) : 0) {}
  bool next(Tile& t) {
    if (row_ >= nq_) return false;
    t = Tile{row_, 0, 0, nk_};
    if (!causal_ || row_ + delta_ >= nk_ - 1) {
      t.rows = std::min(kMaxTileRows, nq_ - row_);
    } else {
      t.rows = std::min(tile_rows_, nq_ - row_);
      t.cols = std::min(row_ + t.rows + delta_, nk_);
    }
    row_ += t.rows;
    return true;
  }

 private:
  int nq_, nk_, delta_;
  bool causal_;
  int tile_rows_, row_;
};

// The backward walks key tiles, each against the query rows that see any of
// its keys (a suffix of the rows): then dK and dV, two of the three
// gradient products, sum over the long query dimension instead of a tile's
// few rows. Keys visible to every row go kMaxTileRows at a time.
class KeyTiles {
 public:
  KeyTiles(int nq, int nk, int delta, bool causal, int tile_rows)
      : nq_(nq), nk_(nk), delta_(delta), causal_(causal), tile_rows_(tile_rows) {}
  bool next(Tile& t) {
    if (col_ >= nk_) return false;
    const int first_row = causal_ ? std::max(0, col_ - delta_) : 0;  // the first row that sees key col_
    if (first_row >= nq_) return false;                              // nor any later key
    t = Tile{first_row, nq_ - first_row, col_, 0};
    if (!causal_) {
      t.cols = std::min(kMaxTileRows, nk_ - col_);
    } else if (col_ <= delta_) {  // row 0 sees key col_: keys up to delta are visible to every row
      t.cols = std::min({kMaxTileRows, nk_ - col_, delta_ + 1 - col_});
    } else {
      t.cols = std::min(tile_rows_, nk_ - col_);
    }
    col_ += t.cols;
    return true;
  }

 private:
  int nq_, nk_, delta_;
  bool causal_;
  int tile_rows_, col_ = 0;
};

// True when the causal mask hides every (query, key) pair: the last query
// row sees no key.
bool fully_masked(int nq, int nk, int delta, bool causal) {
  return nq <= 0 || nk <= 0 || (causal && nq - 1 + delta < 0);
}

int tile_rows_of(const AttentionBlock& blk) {
  return blk.tile_rows > 0 ? std::min(blk.tile_rows, kMaxTileRows) : kTileRows;
}

ConstSlice2D rows_of(const ConstHeadRows& x, int head, int row0, int rows, int width) {
  return ConstSlice2D(x.data + head * x.head_stride + static_cast<std::size_t>(row0) * width, rows, width);
}
Slice2D rows_of(const HeadRows& x, int head, int row0, int rows, int width) {
  return Slice2D(x.data + head * x.head_stride + static_cast<std::size_t>(row0) * width, rows, width);
}

// Floats of scratch: the forward's one query tile, the backward's S and dP
// of one key tile.
std::size_t forward_scratch(int nq, int nk) {
  return static_cast<std::size_t>(std::max(0, std::min(nq, kMaxTileRows))) * std::max(0, nk);
}
std::size_t backward_scratch(int nq, int nk) {
  return 2 * static_cast<std::size_t>(std::max(0, nq)) * std::max(0, std::min(nk, kMaxTileRows));
}

void check_block(const AttentionBlock& blk, Slice1D scratch, int nq, int nk, bool backward) {
  if (blk.heads <= 0 || blk.head_size <= 0) throw Error("attention block: heads and head_size must be positive");
  const std::size_t need = backward ? backward_scratch(nq, nk) : forward_scratch(nq, nk);
  if (scratch.extent(0) < need)  // the message is built only on failure: this runs per block pair
    throw Error("attention block: scratch holds " + std::to_string(scratch.extent(0)) + " floats, the block needs " +
                std::to_string(need) + " (attention_block_scratch_size)");
}

// Moves rows between token-major [B*T, n*C] and head-major [n, B, H, T, hs].
void regroup_heads(real* token_major, real* head_major, int n, const AttentionShape& s, bool to_heads) {
  const int B = s.batch, T = s.seq_len, C = s.channels, H = s.heads, hs = C / H;
  const std::size_t rows = static_cast<std::size_t>(n) * B * H * T;
  Kokkos::parallel_for(
      "ndmini::attention_regroup", Range(0, rows), KOKKOS_LAMBDA(const std::size_t r) {
        const int t = r % T;
        const int h = (r / T) % H;
        const int b = (r / (static_cast<std::size_t>(T) * H)) % B;
        const int which = r / (static_cast<std::size_t>(T) * H * B);
        real* tm = token_major + (static_cast<std::size_t>(b) * T + t) * (n * C) + which * C + h * hs;
        real* hm = head_major + r * hs;
        if (to_heads) {
          for (int d = 0; d < hs; ++d) hm[d] = tm[d];
        } else {
          for (int d = 0; d < hs; ++d) tm[d] = hm[d];
        }
      });
}

// Keys visible to query row `row` in a tile of keys [col0, col0 + cols): a prefix of them.
KOKKOS_INLINE_FUNCTION int visible_keys(int row, int delta, int col0, int cols, bool causal) {
  return causal ? compat::min(compat::max(row + delta + 1 - col0, 0), cols) : cols;
}

// Forward, per query row of a tile: the block's softmax merged into (O, LSE)
// of one head (oh: [rows, hs], lh: one float per row). P is left in S
// already scaled by exp(-LSE') and O by exp(LSE - LSE'), so the GEMM that
// follows (O += P V, beta = 1) completes the merge with no further pass.
void softmax_merge_rows(Slice2D S, real* oh, real* lh, const Tile& t, int delta, bool causal, int hs) {
  real* s = S.data();
  const int row0 = t.row0, keys = t.cols;  // the forward's tiles start at key 0
  const real neg_inf = -std::numeric_limits<real>::infinity();
  Kokkos::parallel_for(
      "ndmini::attention_block_softmax", Range(0, t.rows), KOKKOS_LAMBDA(const int i) {
        const int row = row0 + i;
        const int visible = visible_keys(row, delta, 0, keys, causal);
        real* srow = s + static_cast<std::size_t>(i) * keys;
        for (int j = visible; j < keys; ++j) srow[j] = 0;
        if (visible == 0) return;  // the row sees no key of this block: O and LSE stay
        real m = srow[0];
        NDMINI_SIMD_REDUCTION(max : m)
        for (int j = 1; j < visible; ++j) m = compat::max(m, srow[j]);
        real sum = 0;
        NDMINI_SIMD_REDUCTION(+ : sum)
        for (int j = 0; j < visible; ++j) {
          srow[j] = compat::fast_exp(srow[j] - m);
          sum += srow[j];
        }
        const real lse_blk = m + compat::log(sum);
        const real lse_old = lh[row];
        real* orow = oh + static_cast<std::size_t>(row) * hs;
        real lse_new = lse_blk;
        if (lse_old == neg_inf) {
          for (int d = 0; d < hs; ++d) orow[d] = 0;  // the first block: nothing to keep
        } else {
          const real hi = compat::max(lse_old, lse_blk), lo = compat::min(lse_old, lse_blk);
          lse_new = hi + compat::log(1 + compat::exp(lo - hi));
          const real keep = compat::exp(lse_old - lse_new);
          for (int d = 0; d < hs; ++d) orow[d] *= keep;
        }
        const real f = compat::exp(m - lse_new);
        for (int j = 0; j < visible; ++j) srow[j] *= f;
        lh[row] = lse_new;
      });
}

// Backward, per query row of a tile: P = exp(S - LSE) into S and
// dS = P (dP - D) / sqrt(hs) into dP in one pass; masked entries become
// exact zeros so the products that follow need no mask.
void softmax_backward_rows(Slice2D S, Slice2D dP, const real* lh, const real* dh, const Tile& t, int delta, bool causal,
                           real scale) {
  real* s = S.data();
  real* dp = dP.data();
  const int row0 = t.row0, col0 = t.col0, keys = t.cols;
  Kokkos::parallel_for(
      "ndmini::attention_block_softmax_bwd", Range(0, t.rows), KOKKOS_LAMBDA(const int i) {
        const int row = row0 + i;
        const int visible = visible_keys(row, delta, col0, keys, causal);
        real* srow = s + static_cast<std::size_t>(i) * keys;
        real* drow = dp + static_cast<std::size_t>(i) * keys;
        const real l = lh[row], dd = dh[row];
        for (int j = 0; j < visible; ++j) {
          const real p = compat::fast_exp(srow[j] - l);
          srow[j] = p;
          drow[j] = p * (drow[j] - dd) * scale;
        }
        for (int j = visible; j < keys; ++j) srow[j] = drow[j] = 0;
      });
}

// The backward prologue with O either token-major [B*T, C] or head-major.
void backward_prologue(Slice1D dout_heads, Slice1D delta, Slice1D dqkvh, int zero_parts, ConstSlice2D dout,
                       const real* o, bool o_head_major, const AttentionShape& s) {
  const int T = s.seq_len, C = s.channels, H = s.heads, hs = C / H;
  const std::size_t part = s.part_size();
  if (!(dout_heads.extent(0) >= part && delta.extent(0) >= s.rows_size() &&
        dqkvh.extent(0) >= static_cast<std::size_t>(zero_parts) * part))
    throw Error("attention_backward_prologue: a buffer is smaller than the shape needs");
  const real* dy = dout.data();
  real* doh = dout_heads.data();
  real* dd = delta.data();
  real* dq = dqkvh.data();
  Kokkos::parallel_for(
      "ndmini::attention_bwd_prologue", Range(0, s.rows_size()), KOKKOS_LAMBDA(const std::size_t r) {
        const int t = r % T;
        const int h = (r / T) % H;
        const int b = r / (static_cast<std::size_t>(T) * H);
        const std::size_t tm = (static_cast<std::size_t>(b) * T + t) * C + h * hs;
        const real* dyr = dy + tm;
        const real* orow = o + (o_head_major ? r * hs : tm);
        real* dor = doh + r * hs;
        real sum = 0;
        NDMINI_SIMD_REDUCTION(+ : sum)
        for (int d = 0; d < hs; ++d) {
          dor[d] = dyr[d];
          sum += dyr[d] * orow[d];
        }
        dd[r] = sum;
        for (int p = 0; p < zero_parts; ++p) {
          real* z = dq + p * part + r * hs;
          for (int d = 0; d < hs; ++d) z[d] = 0;
        }
      });
}

}  // namespace

std::size_t attention_block_scratch_size(int q_rows, int k_rows) {
  return std::max(forward_scratch(q_rows, k_rows), backward_scratch(q_rows, k_rows));
}

bool attention_block_forward(HeadRows o, HeadRows lse, ConstHeadRows q, ConstHeadRows k, ConstHeadRows v,
                             const AttentionBlock& blk, Slice1D scratch) {
  const int nq = q.rows, nk = k.rows, hs = blk.head_size, delta = blk.q_pos0 - blk.k_pos0;
  if (fully_masked(nq, nk, delta, blk.causal)) return false;
  check_block(blk, scratch, nq, nk, false);
  const real scale = static_cast<real>(1 / std::sqrt(static_cast<double>(hs)));
  for (int h = 0; h < blk.heads; ++h) {
    Tile t;
    for (QueryTiles tiles(nq, nk, delta, blk.causal, tile_rows_of(blk)); tiles.next(t);) {
      const Slice2D S(scratch.data(), t.rows, t.cols);
      // S = Q K^T / sqrt(hs) over the visible key prefix only.
      KokkosBlas::gemm("N", "T", scale, rows_of(q, h, t.row0, t.rows, hs), rows_of(k, h, 0, t.cols, hs), real(0), S);
      softmax_merge_rows(S, o.data + h * o.head_stride, lse.data + h * lse.head_stride, t, delta, blk.causal, hs);
      KokkosBlas::gemm("N", "N", real(1), ConstSlice2D(S), rows_of(v, h, 0, t.cols, hs), real(1),
                       rows_of(o, h, t.row0, t.rows, hs));
    }
  }
  return true;
}

bool attention_block_backward(HeadRows dq, HeadRows dk, HeadRows dv, ConstHeadRows q, ConstHeadRows k, ConstHeadRows v,
                              ConstHeadRows dout, ConstHeadRows lse, ConstHeadRows delta, const AttentionBlock& blk,
                              Slice1D scratch) {
  const int nq = q.rows, nk = k.rows, hs = blk.head_size, dpos = blk.q_pos0 - blk.k_pos0;
  if (fully_masked(nq, nk, dpos, blk.causal)) return false;
  check_block(blk, scratch, nq, nk, true);
  const real scale = static_cast<real>(1 / std::sqrt(static_cast<double>(hs)));
  real* dp = scratch.data() + scratch.extent(0) / 2;
  for (int h = 0; h < blk.heads; ++h) {
    Tile t;
    for (KeyTiles tiles(nq, nk, dpos, blk.causal, tile_rows_of(blk)); tiles.next(t);) {
      const Slice2D S(scratch.data(), t.rows, t.cols), dP(dp, t.rows, t.cols);
      const ConstSlice2D Qs = rows_of(q, h, t.row0, t.rows, hs), dOs = rows_of(dout, h, t.row0, t.rows, hs);
      const ConstSlice2D Kt = rows_of(k, h, t.col0, t.cols, hs);
      KokkosBlas::gemm("N", "T", scale, Qs, Kt, real(0), S);
      KokkosBlas::gemm("N", "T", real(1), dOs, rows_of(v, h, t.col0, t.cols, hs), real(0), dP);
      softmax_backward_rows(S, dP, lse.data + h * lse.head_stride, delta.data + h * delta.head_stride, t, dpos,
                            blk.causal, scale);
      KokkosBlas::gemm("T", "N", real(1), ConstSlice2D(S), dOs, real(1), rows_of(dv, h, t.col0, t.cols, hs));
      KokkosBlas::gemm("T", "N", real(1), ConstSlice2D(dP), Qs, real(1), rows_of(dk, h, t.col0, t.cols, hs));
      KokkosBlas::gemm("N", "N", real(1), ConstSlice2D(dP), Kt, real(1), rows_of(dq, h, t.row0, t.rows, hs));
    }
  }
  return true;
}

// ---- layout passes ------------------------------------------------------------------

void attention_split_qkv(Slice1D qkvh, Slice1D o, Slice1D lse, ConstSlice2D qkv, const AttentionShape& s) {
  const int B = s.batch, T = s.seq_len, C = s.channels, H = s.heads, hs = C / H;
  const std::size_t part = s.part_size();
  if (!(qkvh.extent(0) >= 3 * part && o.extent(0) >= part && lse.extent(0) >= s.rows_size() &&
        qkv.extent(0) == static_cast<std::size_t>(B) * T && qkv.extent(1) == static_cast<std::size_t>(3) * C))
    throw Error("attention_split_qkv: a buffer does not match the shape");
  const real* in = qkv.data();
  real* qh = qkvh.data();
  real* op = o.data();
  real* lp = lse.data();
  const real neg_inf = -std::numeric_limits<real>::infinity();
  // One pass per head row of q: its q, k and v rows move together, and the
  // merge identity of that row is written on the way.
  Kokkos::parallel_for(
      "ndmini::attention_split_qkv", Range(0, s.rows_size()), KOKKOS_LAMBDA(const std::size_t r) {
        const int t = r % T;
        const int h = (r / T) % H;
        const int b = r / (static_cast<std::size_t>(T) * H);
        const real* tm = in + (static_cast<std::size_t>(b) * T + t) * (3 * C) + h * hs;
        for (int which = 0; which < 3; ++which) {
          real* hm = qh + which * part + r * hs;
          for (int d = 0; d < hs; ++d) hm[d] = tm[which * C + d];
        }
        real* orow = op + r * hs;
        for (int d = 0; d < hs; ++d) orow[d] = 0;
        lp[r] = neg_inf;
      });
}

void attention_merge_heads(Slice2D out, ConstSlice1D o, const AttentionShape& s) {
  regroup_heads(out.data(), const_cast<real*>(o.data()), 1, s, false);
}

void attention_backward_prologue(Slice1D dout_heads, Slice1D delta, Slice1D dqkvh, int zero_parts, ConstSlice2D dout,
                                 ConstSlice2D out, const AttentionShape& s) {
  backward_prologue(dout_heads, delta, dqkvh, zero_parts, dout, out.data(), false, s);
}

void attention_merge_qkv(Slice2D dqkv, ConstSlice1D dqkvh, const AttentionShape& s) {
  regroup_heads(dqkv.data(), const_cast<real*>(dqkvh.data()), 3, s, false);
}

}  // namespace ndmini::kernels
