// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/compat.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini::kernels {
namespace {

using Range = Kokkos::RangePolicy<ExecSpace>;
using TeamPolicy = Kokkos::TeamPolicy<ExecSpace>;
using Member = TeamPolicy::member_type;

// Rows (forward: query rows; backward: key rows) per tile of the causal
// staircase. Smaller tiles compute less of the masked triangle but make
// smaller, less efficient GEMMs; on one core at hs = 64, T = 256
// (bench/bench_attention.cpp) 32 was faster than 64 and no slower than 16.
// On a GPU a tile's batched product must fill the device: 128 rows, where a
// tile wastes under 7% of a T = 1024 diagonal block on masked products.
constexpr int kHostTileRows = 32;
constexpr int kDeviceTileRows = 128;
// Tile width where every key is visible (no staircase): bounds the scratch
// of the full blocks of the ring and of non-causal attention.
constexpr int kMaxTileRows = 128;

// The device form of the row kernels: each team thread takes one row, whose
// kLanes vector lanes (a warp on a GPU) walk it, so neighbouring lanes touch
// neighbouring floats; kTeamRows rows per team. On a CPU the same code runs
// with one-thread, one-lane teams (the Serial backend allows no more).
constexpr int kTeamRows = kDeviceMemory ? 8 : 1;
constexpr int kLanes = kDeviceMemory ? 32 : 1;

TeamPolicy row_teams(std::size_t rows) {
  return TeamPolicy(static_cast<int>((rows + kTeamRows - 1) / kTeamRows), kTeamRows, kLanes);
}

AttentionKernelForm g_form = AttentionKernelForm::automatic;

bool device_form() {
  return g_form == AttentionKernelForm::device || (g_form == AttentionKernelForm::automatic && kDeviceMemory);
}

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
  if (blk.tile_rows > 0) return std::min(blk.tile_rows, kMaxTileRows);
  return device_form() ? kDeviceTileRows : kHostTileRows;
}

// Heads whose products go in one batch: on a GPU all of them (one launch per
// product of a tile, whatever B x H), as many as the scratch holds; on a CPU
// core one, so a head's S tile stays in cache between its products.
int batch_cap(int heads) { return device_form() ? std::max(heads, 1) : 1; }
int heads_per_batch(int heads, std::size_t scratch, std::size_t per_head) {
  const std::size_t fit = per_head > 0 ? scratch / per_head : static_cast<std::size_t>(heads);
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(batch_cap(heads), fit)));
}

ConstSlice2D rows_of(const ConstHeadRows& x, int head, int row0, int rows, int width) {
  return ConstSlice2D(x.data + head * x.head_stride + static_cast<std::size_t>(row0) * width, rows, width);
}
Slice2D rows_of(const HeadRows& x, int head, int row0, int rows, int width) {
  return Slice2D(x.data + head * x.head_stride + static_cast<std::size_t>(row0) * width, rows, width);
}
ConstBf16Slice2D rows_of(const ConstBf16HeadRows& x, int head, int row0, int rows, int width) {
  return ConstBf16Slice2D(x.data + head * x.head_stride + static_cast<std::size_t>(row0) * width, rows, width);
}
// The same heads from `head` on: the operand of a batch.
ConstHeadRows from_head(const ConstHeadRows& x, int head) {
  return {x.data + head * x.head_stride, x.head_stride, x.rows};
}
HeadRows from_head(const HeadRows& x, int head) { return {x.data + head * x.head_stride, x.head_stride, x.rows}; }

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
    throw Error("attention block: scratch holds " + std::to_string(scratch.extent(0)) + " floats, one head needs " +
                std::to_string(need) + " (attention_block_scratch_size)");
}

// Where the head rows of the parts of qkvh sit token-major. Head-major row r
// counts over q ([B, H, T] rows), then k, then v ([B, KV, T] rows each), so
// its floats are at r * hs; token-major, it is row (b, t) of a matrix
// `width` floats wide, from column (q: 0, k: C, v: C + KV hs) + head * hs.
struct HeadRowMap {
  int T, H, KV, hs, C, width;
  std::size_t q_rows, kv_rows;
  HeadRowMap(const AttentionShape& s, int token_width)
      : T(s.seq_len),
        H(s.heads),
        KV(s.kv()),
        hs(s.head_size()),
        C(s.channels),
        width(token_width),
        q_rows(s.rows_size()),
        kv_rows(s.kv_rows_size()) {}
  KOKKOS_INLINE_FUNCTION std::size_t token_offset(std::size_t r) const {
    int heads = H, col0 = 0;
    if (r >= q_rows) {
      r -= q_rows;
      heads = KV;
      col0 = C;
      if (r >= kv_rows) {
        r -= kv_rows;
        col0 += KV * hs;
      }
    }
    const int t = r % T;
    const int h = (r / T) % heads;
    const std::size_t b = r / (static_cast<std::size_t>(T) * heads);
    return (b * T + t) * width + col0 + static_cast<std::size_t>(h) * hs;
  }
};

// Moves rows between token-major [B*T, width] and head-major: O alone
// (with_kv false, width C) or q, k and v (width (H + 2 KV) hs).
void regroup_heads(real* token_major, real* head_major, bool with_kv, const AttentionShape& s, bool to_heads) {
  const HeadRowMap map(s, with_kv ? s.qkv_width() : s.channels);
  const int hs = map.hs;
  const std::size_t rows = map.q_rows + (with_kv ? 2 * map.kv_rows : 0);
  if (device_form()) {
    // One float per thread: a head row's hs floats are neighbours on both sides.
    Kokkos::parallel_for(
        "ndmini::attention_regroup", Range(0, rows * hs), KOKKOS_LAMBDA(const std::size_t e) {
          real* tm = token_major + map.token_offset(e / hs) + e % hs;
          if (to_heads)
            head_major[e] = *tm;
          else
            *tm = head_major[e];
        });
    return;
  }
  Kokkos::parallel_for(
      "ndmini::attention_regroup", Range(0, rows), KOKKOS_LAMBDA(const std::size_t r) {
        real* tm = token_major + map.token_offset(r);
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

// The merge of one row's block softmax into (O, LSE), given the block's
// max m and exp-sum: returns LSE', the factor keep = exp(LSE - LSE') for the
// old O (unless this is the row's first block: O is then set, not scaled) and
// the factor exp(m - LSE') for P.
struct Merge {
  real lse_new, keep, p_scale;
  bool first;
};
// LSE is -inf exactly while a row has seen no key; a finite LSE is far above
// this (a literal, as device code cannot call std::numeric_limits).
constexpr real kNoKeyYet = -3.0e38f;
KOKKOS_INLINE_FUNCTION Merge merge_row(real lse_old, real m, real sum) {
  const real lse_blk = m + compat::log(sum);
  Merge r{lse_blk, 0, 0, lse_old <= kNoKeyYet};
  if (!r.first) {
    const real hi = compat::max(lse_old, lse_blk), lo = compat::min(lse_old, lse_blk);
    r.lse_new = hi + compat::log(1 + compat::exp(lo - hi));
    r.keep = compat::exp(lse_old - r.lse_new);
  }
  r.p_scale = compat::exp(m - r.lse_new);
  return r;
}

// Forward, per query row of a tile, for `n` heads of a batch: the block's
// softmax merged into (O, LSE) of each head (o: [rows, hs] per head, lse: one
// float per row). The S tiles of the heads follow each other in `s`. P is
// left in S already scaled by exp(-LSE') and O by exp(LSE - LSE'), so the
// product that follows (O += P V, beta = 1) completes the merge.
void softmax_merge_rows(real* s, HeadRows o, HeadRows lse, int n, const Tile& t, int delta, bool causal, int hs) {
  const int row0 = t.row0, rows = t.rows, keys = t.cols;  // the forward's tiles start at key 0
  const std::size_t total = static_cast<std::size_t>(n) * rows;
  real* op = o.data;
  real* lp = lse.data;
  const std::size_t o_stride = o.head_stride, l_stride = lse.head_stride;
  if (device_form()) {
    Kokkos::parallel_for(
        "ndmini::attention_block_softmax", row_teams(total), KOKKOS_LAMBDA(const Member& team) {
          const std::size_t idx = static_cast<std::size_t>(team.league_rank()) * kTeamRows + team.team_rank();
          if (idx >= total) return;
          const int g = idx / rows, row = row0 + static_cast<int>(idx % rows);
          const int visible = visible_keys(row, delta, 0, keys, causal);
          real* srow = s + idx * keys;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, visible, keys), [&](const int j) { srow[j] = 0; });
          if (visible == 0) return;  // the row sees no key of this block: O and LSE stay
          real* lh = lp + g * l_stride + row;
          const real lse_old = *lh;  // read before the reductions, which order the lanes
          real m = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, visible),
              [&](const int j, real& mx) {
                if (srow[j] > mx) mx = srow[j];
              },
              Kokkos::Max<real>(m));
          real sum = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, visible),
              [&](const int j, real& acc) {
                const real e = compat::fast_exp(srow[j] - m);
                srow[j] = e;
                acc += e;
              },
              sum);
          const Merge mg = merge_row(lse_old, m, sum);
          real* orow = op + g * o_stride + static_cast<std::size_t>(row) * hs;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hs),
                               [&](const int d) { orow[d] = mg.first ? real(0) : orow[d] * mg.keep; });
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, visible), [&](const int j) { srow[j] *= mg.p_scale; });
          Kokkos::single(Kokkos::PerThread(team), [&] { *lh = mg.lse_new; });
        });
    return;
  }
  Kokkos::parallel_for(
      "ndmini::attention_block_softmax", Range(0, total), KOKKOS_LAMBDA(const std::size_t idx) {
        const int g = idx / rows, row = row0 + static_cast<int>(idx % rows);
        const int visible = visible_keys(row, delta, 0, keys, causal);
        real* srow = s + idx * keys;
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
        real* lh = lp + g * l_stride + row;
        const Merge mg = merge_row(*lh, m, sum);
        real* orow = op + g * o_stride + static_cast<std::size_t>(row) * hs;
        if (mg.first) {
          for (int d = 0; d < hs; ++d) orow[d] = 0;  // the first block: nothing to keep
        } else {
          for (int d = 0; d < hs; ++d) orow[d] *= mg.keep;
        }
        for (int j = 0; j < visible; ++j) srow[j] *= mg.p_scale;
        *lh = mg.lse_new;
      });
}

// Backward, per query row of a tile, for `n` heads of a batch: P = exp(S -
// LSE) into S and dS = P (dP - D) / sqrt(hs) into dP in one pass; masked
// entries become exact zeros so the products that follow need no mask.
void softmax_backward_rows(real* s, real* dp, ConstHeadRows lse, ConstHeadRows delta, int n, const Tile& t, int dpos,
                           bool causal, real scale) {
  const int row0 = t.row0, rows = t.rows, col0 = t.col0, keys = t.cols;
  const std::size_t total = static_cast<std::size_t>(n) * rows;
  const real* lp = lse.data;
  const real* dd = delta.data;
  const std::size_t l_stride = lse.head_stride, d_stride = delta.head_stride;
  if (device_form()) {
    // Elementwise: one float of S and dP per thread.
    Kokkos::parallel_for(
        "ndmini::attention_block_softmax_bwd", Range(0, total * keys), KOKKOS_LAMBDA(const std::size_t e) {
          const std::size_t idx = e / keys;
          const int j = e % keys;
          const int g = idx / rows, row = row0 + static_cast<int>(idx % rows);
          if (j < visible_keys(row, dpos, col0, keys, causal)) {
            const real p = compat::fast_exp(s[e] - lp[g * l_stride + row]);
            s[e] = p;
            dp[e] = p * (dp[e] - dd[g * d_stride + row]) * scale;
          } else {
            s[e] = dp[e] = 0;
          }
        });
    return;
  }
  Kokkos::parallel_for(
      "ndmini::attention_block_softmax_bwd", Range(0, total), KOKKOS_LAMBDA(const std::size_t idx) {
        const int g = idx / rows, row = row0 + static_cast<int>(idx % rows);
        const int visible = visible_keys(row, dpos, col0, keys, causal);
        real* srow = s + idx * keys;
        real* drow = dp + idx * keys;
        const real l = lp[g * l_stride + row], dv = dd[g * d_stride + row];
        for (int j = 0; j < visible; ++j) {
          const real p = compat::fast_exp(srow[j] - l);
          srow[j] = p;
          drow[j] = p * (drow[j] - dv) * scale;
        }
        for (int j = visible; j < keys; ++j) srow[j] = drow[j] = 0;
      });
}

// Where query row r = (b, h, t) of the backward's prologue zeroes a row of
// dqkvh's part p (0: dq, 1: dk, 2: dv): its own dq row, and when h is the
// first query head of its kv head g, row (b, g, t) of dk or dv, so that every
// row is zeroed once.
struct GradRowZeroing {
  int T, KV, group, hs;
  std::size_t k_offset, v_offset;
  KOKKOS_INLINE_FUNCTION bool operator()(int p, std::size_t r, int b, int h, int t, std::size_t& at) const {
    if (p == 0) {
      at = r * hs;
      return true;
    }
    if (h % group != 0) return false;
    at = (p == 1 ? k_offset : v_offset) + ((static_cast<std::size_t>(b) * KV + h / group) * T + t) * hs;
    return true;
  }
};

// The backward prologue with O either token-major [B*T, C] or head-major;
// dO heads in fp32 or (mixed precision) rounded to bf16.
template <class Heads>
void backward_prologue(Heads dout_heads, Slice1D delta, Slice1D dqkvh, int zero_parts, ConstSlice2D dout, const real* o,
                       bool o_head_major, const AttentionShape& s) {
  using T_out = typename Heads::non_const_value_type;
  const int T = s.seq_len, C = s.channels, H = s.heads, hs = C / H, KV = s.kv();
  const std::size_t part = s.part_size(), rows = s.rows_size();
  if (zero_parts < 0 || zero_parts > 3) throw Error("attention_backward_prologue: zero_parts must be 0 to 3");
  const std::size_t part_ends[4] = {0, part, s.v_offset(), s.qkvh_size()};
  const std::size_t zeroed = part_ends[zero_parts];
  if (!(dout_heads.extent(0) >= part && delta.extent(0) >= rows && dqkvh.extent(0) >= zeroed))
    throw Error("attention_backward_prologue: a buffer is smaller than the shape needs");
  const real* dy = dout.data();
  T_out* doh = dout_heads.data();
  real* dd = delta.data();
  real* dq = dqkvh.data();
  const GradRowZeroing zero_row{T, KV, s.group(), hs, s.k_offset(), s.v_offset()};
  if (device_form()) {
    Kokkos::parallel_for(
        "ndmini::attention_bwd_prologue", row_teams(rows), KOKKOS_LAMBDA(const Member& team) {
          const std::size_t r = static_cast<std::size_t>(team.league_rank()) * kTeamRows + team.team_rank();
          if (r >= rows) return;
          const int t = r % T;
          const int h = (r / T) % H;
          const int b = r / (static_cast<std::size_t>(T) * H);
          const std::size_t tm = (static_cast<std::size_t>(b) * T + t) * C + h * hs;
          const real* dyr = dy + tm;
          const real* orow = o + (o_head_major ? r * hs : tm);
          T_out* dor = doh + r * hs;
          real sum = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, hs),
              [&](const int d, real& acc) {
                dor[d] = T_out(dyr[d]);
                acc += dyr[d] * orow[d];
              },
              sum);
          Kokkos::single(Kokkos::PerThread(team), [&] { dd[r] = sum; });
          for (int p = 0; p < zero_parts; ++p) {
            std::size_t at = 0;
            if (!zero_row(p, r, b, h, t, at)) continue;
            real* z = dq + at;
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hs), [&](const int d) { z[d] = 0; });
          }
        });
    return;
  }
  Kokkos::parallel_for(
      "ndmini::attention_bwd_prologue", Range(0, rows), KOKKOS_LAMBDA(const std::size_t r) {
        const int t = r % T;
        const int h = (r / T) % H;
        const int b = r / (static_cast<std::size_t>(T) * H);
        const std::size_t tm = (static_cast<std::size_t>(b) * T + t) * C + h * hs;
        const real* dyr = dy + tm;
        const real* orow = o + (o_head_major ? r * hs : tm);
        T_out* dor = doh + r * hs;
        real sum = 0;
        NDMINI_SIMD_REDUCTION(+ : sum)
        for (int d = 0; d < hs; ++d) {
          dor[d] = T_out(dyr[d]);
          sum += dyr[d] * orow[d];
        }
        dd[r] = sum;
        for (int p = 0; p < zero_parts; ++p) {
          std::size_t at = 0;
          if (!zero_row(p, r, b, h, t, at)) continue;
          real* z = dq + at;
          for (int d = 0; d < hs; ++d) z[d] = 0;
        }
      });
}

}  // namespace

void set_attention_kernel_form(AttentionKernelForm form) { g_form = form; }

std::size_t attention_block_scratch_size(int q_rows, int k_rows, int heads) {
  return static_cast<std::size_t>(batch_cap(heads)) *
         std::max(forward_scratch(q_rows, k_rows), backward_scratch(q_rows, k_rows));
}

namespace {

// The strided-batched product of fp32 or of bf16 operands (fp32 C).
void batched(const char* ta, const char* tb, real alpha, ConstSlice2D a, std::size_t sa, ConstSlice2D b, std::size_t sb,
             real beta, Slice2D c, std::size_t sc, int n) {
  gemm_strided_batched(ta, tb, alpha, a, sa, b, sb, beta, c, sc, n);
}
void batched(const char* ta, const char* tb, real alpha, ConstBf16Slice2D a, std::size_t sa, ConstBf16Slice2D b,
             std::size_t sb, real beta, Slice2D c, std::size_t sc, int n) {
  gemm_bf16_strided_batched(ta, tb, alpha, a, sa, b, sb, beta, c, sc, n);
}

// A tile of P or dS (n heads of `tile` values from s) as the operand of a
// product: the fp32 values themselves, or (mixed precision) their bf16
// rounding, written to b.
ConstSlice2D tile_operand(const real* s, int rows, int cols, std::size_t count, real* /*fp32: none*/) {
  (void)count;
  return ConstSlice2D(s, rows, cols);
}
ConstBf16Slice2D tile_operand(const real* s, int rows, int cols, std::size_t count, bf16* b) {
  round_to_bf16(Bf16Slice1D(b, count), ConstSlice1D(s, count));
  return ConstBf16Slice2D(b, rows, cols);
}

// The element type of the operands of Rows (ConstHeadRows or ConstBf16HeadRows).
template <class Rows>
using OperandType = std::remove_const_t<std::remove_pointer_t<decltype(Rows::data)>>;

template <class Rows>
bool block_forward(HeadRows o, HeadRows lse, Rows q, Rows k, Rows v, const AttentionBlock& blk, Slice1D scratch,
                   OperandType<Rows>* rounded) {
  const int nq = q.rows, nk = k.rows, hs = blk.head_size, delta = blk.q_pos0 - blk.k_pos0;
  if (fully_masked(nq, nk, delta, blk.causal)) return false;
  check_block(blk, scratch, nq, nk, false);
  const real scale = static_cast<real>(1 / std::sqrt(static_cast<double>(hs)));
  const int group = heads_per_batch(blk.heads, scratch.extent(0), forward_scratch(nq, nk));
  real* s = scratch.data();
  for (int h0 = 0; h0 < blk.heads; h0 += group) {
    const int n = std::min(group, blk.heads - h0);
    Tile t;
    for (QueryTiles tiles(nq, nk, delta, blk.causal, tile_rows_of(blk)); tiles.next(t);) {
      // One S tile per head, one after another.
      const std::size_t tile = static_cast<std::size_t>(t.rows) * t.cols;
      const Slice2D S(s, t.rows, t.cols);
      // S = Q K^T / sqrt(hs) over the visible key prefix only.
      batched("N", "T", scale, rows_of(q, h0, t.row0, t.rows, hs), q.head_stride, rows_of(k, h0, 0, t.cols, hs),
              k.head_stride, real(0), S, tile, n);
      softmax_merge_rows(s, from_head(o, h0), from_head(lse, h0), n, t, delta, blk.causal, hs);
      batched("N", "N", real(1), tile_operand(s, t.rows, t.cols, n * tile, rounded), tile,
              rows_of(v, h0, 0, t.cols, hs), v.head_stride, real(1), rows_of(o, h0, t.row0, t.rows, hs), o.head_stride,
              n);
    }
  }
  return true;
}

template <class Rows>
bool block_backward(HeadRows dq, HeadRows dk, HeadRows dv, Rows q, Rows k, Rows v, Rows dout, ConstHeadRows lse,
                    ConstHeadRows delta, const AttentionBlock& blk, Slice1D scratch, OperandType<Rows>* rounded) {
  const int nq = q.rows, nk = k.rows, hs = blk.head_size, dpos = blk.q_pos0 - blk.k_pos0;
  if (fully_masked(nq, nk, dpos, blk.causal)) return false;
  check_block(blk, scratch, nq, nk, true);
  const real scale = static_cast<real>(1 / std::sqrt(static_cast<double>(hs)));
  const std::size_t per_head = backward_scratch(nq, nk);
  const int group = heads_per_batch(blk.heads, scratch.extent(0), per_head);
  // The S tiles of a batch's heads, then their dP tiles.
  real* s = scratch.data();
  real* dp = s + static_cast<std::size_t>(group) * (per_head / 2);
  // Mixed precision: P and dS rounded to bf16 at the same offsets.
  OperandType<Rows>* rounded_dp = rounded != nullptr ? rounded + (dp - s) : nullptr;
  for (int h0 = 0; h0 < blk.heads; h0 += group) {
    const int n = std::min(group, blk.heads - h0);
    Tile t;
    for (KeyTiles tiles(nq, nk, dpos, blk.causal, tile_rows_of(blk)); tiles.next(t);) {
      const std::size_t tile = static_cast<std::size_t>(t.rows) * t.cols;
      const Slice2D S(s, t.rows, t.cols), dP(dp, t.rows, t.cols);
      const auto Qs = rows_of(q, h0, t.row0, t.rows, hs), dOs = rows_of(dout, h0, t.row0, t.rows, hs);
      const auto Kt = rows_of(k, h0, t.col0, t.cols, hs);
      batched("N", "T", scale, Qs, q.head_stride, Kt, k.head_stride, real(0), S, tile, n);
      batched("N", "T", real(1), dOs, dout.head_stride, rows_of(v, h0, t.col0, t.cols, hs), v.head_stride, real(0), dP,
              tile, n);
      softmax_backward_rows(s, dp, from_head(lse, h0), from_head(delta, h0), n, t, dpos, blk.causal, scale);
      const auto P = tile_operand(s, t.rows, t.cols, n * tile, rounded);
      const auto dS = tile_operand(dp, t.rows, t.cols, n * tile, rounded_dp);
      batched("T", "N", real(1), P, tile, dOs, dout.head_stride, real(1), rows_of(dv, h0, t.col0, t.cols, hs),
              dv.head_stride, n);
      batched("T", "N", real(1), dS, tile, Qs, q.head_stride, real(1), rows_of(dk, h0, t.col0, t.cols, hs),
              dk.head_stride, n);
      batched("N", "N", real(1), dS, tile, Kt, k.head_stride, real(1), rows_of(dq, h0, t.row0, t.rows, hs),
              dq.head_stride, n);
    }
  }
  return true;
}

void check_rounded_scratch(const Slice1D& scratch, const Bf16Slice1D& scratch_bf16) {
  if (scratch_bf16.extent(0) < scratch.extent(0))
    throw Error("attention block: the bf16 scratch must hold as many values as the fp32 scratch");
}

}  // namespace

bool attention_block_forward(HeadRows o, HeadRows lse, ConstHeadRows q, ConstHeadRows k, ConstHeadRows v,
                             const AttentionBlock& blk, Slice1D scratch) {
  return block_forward<ConstHeadRows>(o, lse, q, k, v, blk, scratch, nullptr);
}

bool attention_block_forward(HeadRows o, HeadRows lse, ConstBf16HeadRows q, ConstBf16HeadRows k, ConstBf16HeadRows v,
                             const AttentionBlock& blk, Slice1D scratch, Bf16Slice1D scratch_bf16) {
  check_rounded_scratch(scratch, scratch_bf16);
  return block_forward<ConstBf16HeadRows>(o, lse, q, k, v, blk, scratch, scratch_bf16.data());
}

bool attention_block_backward(HeadRows dq, HeadRows dk, HeadRows dv, ConstHeadRows q, ConstHeadRows k, ConstHeadRows v,
                              ConstHeadRows dout, ConstHeadRows lse, ConstHeadRows delta, const AttentionBlock& blk,
                              Slice1D scratch) {
  return block_backward<ConstHeadRows>(dq, dk, dv, q, k, v, dout, lse, delta, blk, scratch, nullptr);
}

bool attention_block_backward(HeadRows dq, HeadRows dk, HeadRows dv, ConstBf16HeadRows q, ConstBf16HeadRows k,
                              ConstBf16HeadRows v, ConstBf16HeadRows dout, ConstHeadRows lse, ConstHeadRows delta,
                              const AttentionBlock& blk, Slice1D scratch, Bf16Slice1D scratch_bf16) {
  check_rounded_scratch(scratch, scratch_bf16);
  return block_backward<ConstBf16HeadRows>(dq, dk, dv, q, k, v, dout, lse, delta, blk, scratch, scratch_bf16.data());
}

// ---- layout passes ------------------------------------------------------------------

namespace {

// qkvh in fp32 or (mixed precision) rounded to bf16. Head rows of q, then
// k, then v, each copied from its place in qkv; a q row also writes the
// merge identity of its O and LSE.
template <class Heads>
void split_qkv(Heads qkvh, Slice1D o, Slice1D lse, ConstSlice2D qkv, const AttentionShape& s) {
  using T_out = typename Heads::non_const_value_type;
  const int B = s.batch, T = s.seq_len;
  const HeadRowMap map(s, s.qkv_width());
  const int hs = map.hs;
  const std::size_t part = s.part_size(), q_rows = map.q_rows, rows = q_rows + 2 * map.kv_rows;
  if (!(qkvh.extent(0) >= s.qkvh_size() && o.extent(0) >= part && lse.extent(0) >= q_rows &&
        qkv.extent(0) == static_cast<std::size_t>(B) * T && qkv.extent(1) == static_cast<std::size_t>(s.qkv_width())))
    throw Error("attention_split_qkv: a buffer does not match the shape");
  const real* in = qkv.data();
  T_out* qh = qkvh.data();
  real* op = o.data();
  real* lp = lse.data();
  const real neg_inf = -std::numeric_limits<real>::infinity();
  if (device_form()) {
    // One float per thread (coalesced on both sides).
    Kokkos::parallel_for(
        "ndmini::attention_split_qkv", Range(0, rows * hs), KOKKOS_LAMBDA(const std::size_t e) {
          const std::size_t r = e / hs;
          qh[e] = T_out(in[map.token_offset(r) + e % hs]);
          if (r < q_rows) {
            op[e] = 0;
            if (e % hs == 0) lp[r] = neg_inf;
          }
        });
    return;
  }
  Kokkos::parallel_for(
      "ndmini::attention_split_qkv", Range(0, rows), KOKKOS_LAMBDA(const std::size_t r) {
        const real* tm = in + map.token_offset(r);
        T_out* hm = qh + r * hs;
        for (int d = 0; d < hs; ++d) hm[d] = T_out(tm[d]);
        if (r < q_rows) {
          real* orow = op + r * hs;
          for (int d = 0; d < hs; ++d) orow[d] = 0;
          lp[r] = neg_inf;
        }
      });
}

}  // namespace

void attention_split_qkv(Slice1D qkvh, Slice1D o, Slice1D lse, ConstSlice2D qkv, const AttentionShape& s) {
  split_qkv(qkvh, o, lse, qkv, s);
}
void attention_split_qkv(Bf16Slice1D qkvh, Slice1D o, Slice1D lse, ConstSlice2D qkv, const AttentionShape& s) {
  split_qkv(qkvh, o, lse, qkv, s);
}

void attention_merge_heads(Slice2D out, ConstSlice1D o, const AttentionShape& s) {
  regroup_heads(out.data(), const_cast<real*>(o.data()), false, s, false);
}

void attention_backward_prologue(Slice1D dout_heads, Slice1D delta, Slice1D dqkvh, int zero_parts, ConstSlice2D dout,
                                 ConstSlice2D out, const AttentionShape& s) {
  backward_prologue(dout_heads, delta, dqkvh, zero_parts, dout, out.data(), false, s);
}
void attention_backward_prologue(Bf16Slice1D dout_heads, Slice1D delta, Slice1D dqkvh, int zero_parts,
                                 ConstSlice2D dout, ConstSlice2D out, const AttentionShape& s) {
  backward_prologue(dout_heads, delta, dqkvh, zero_parts, dout, out.data(), false, s);
}

void attention_merge_qkv(Slice2D dqkv, ConstSlice1D dqkvh, const AttentionShape& s) {
  regroup_heads(dqkv.data(), const_cast<real*>(dqkvh.data()), true, s, false);
}

}  // namespace ndmini::kernels
