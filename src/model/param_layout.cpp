// SPDX-License-Identifier: BSD-3-Clause
#include "model/param_layout.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ndmini {
namespace {

// The parameter seen as a matrix (a 1-D tensor is a column).
struct MatrixShape {
  std::int64_t rows_local, cols_local, rows_global, cols_global;
  std::int64_t rows_per_section_local, rows_per_section_global, col_offset;
  bool two_d;
};

MatrixShape shape_of(const ParamInfo& p, int tp_rank) {
  MatrixShape m{};
  m.two_d = p.shape.size() == 2;
  m.rows_local = p.shape[0];
  m.cols_local = m.two_d ? p.shape[1] : 1;
  m.rows_global = p.global_shape[0];
  m.cols_global = m.two_d ? p.global_shape[1] : 1;
  m.rows_per_section_local = m.rows_local / p.sections;
  m.rows_per_section_global = m.rows_global / p.sections;
  m.col_offset = p.split == TpSplit::cols ? tp_rank * m.cols_local : 0;
  return m;
}

// Global row of local row i.
std::int64_t global_row(const ParamInfo& p, const MatrixShape& m, int tp_rank, std::int64_t i) {
  if (p.split == TpSplit::experts) return p.first_expert + i;  // [E, rows]: a row per expert
  if (p.split != TpSplit::rows) return i;
  const std::int64_t section = i / m.rows_per_section_local, within = i % m.rows_per_section_local;
  return section * m.rows_per_section_global + tp_rank * m.rows_per_section_local + within;
}

}  // namespace

namespace {

// The rows of one expert at most per block: the 2-D blocks of this rank's
// experts [E/ep rows, cols] cut where an expert ends, at the global expert index.
std::vector<GlobalBlock> expert_blocks(const ParamInfo& p, std::size_t begin, std::size_t end) {
  if (p.split != TpSplit::experts || p.shape[1] != p.global_shape[1] || p.shape[2] != p.global_shape[2])
    throw InternalError(p.name + ": a 3-D tensor must hold whole experts");
  const std::uint64_t El = p.shape[0], R = p.shape[1], C = p.shape[2];
  ParamInfo flat = p;
  flat.split = TpSplit::replicated;
  flat.shape = flat.global_shape = {static_cast<std::int64_t>(El * R), static_cast<std::int64_t>(C)};
  std::vector<GlobalBlock> out;
  for (const GlobalBlock& b : global_blocks(flat, 0, begin, end)) {
    std::uint64_t row = b.offset[0], left = b.count[0];
    std::size_t local = b.local_begin;
    while (left > 0) {
      const std::uint64_t e = row / R, r = row % R, n = std::min(left, R - r);
      out.push_back({{p.first_expert + e, r, b.offset[1]}, {1, n, b.count[1]}, local});
      row += n;
      left -= n;
      local += n * C;
    }
  }
  return out;
}

}  // namespace

std::vector<GlobalBlock> global_blocks(const ParamInfo& p, int tp_rank, std::size_t begin, std::size_t end) {
  if (p.shape.size() == 3) return expert_blocks(p, begin, end);
  const MatrixShape m = shape_of(p, tp_rank);
  std::vector<GlobalBlock> blocks;
  auto emit = [&](std::int64_t row, std::int64_t nrows, std::int64_t col, std::int64_t ncols, std::size_t local) {
    GlobalBlock b;
    b.local_begin = local;
    const std::uint64_t g = global_row(p, m, tp_rank, row);
    if (m.two_d) {
      b.offset = {g, static_cast<std::uint64_t>(m.col_offset + col)};
      b.count = {static_cast<std::uint64_t>(nrows), static_cast<std::uint64_t>(ncols)};
    } else {
      b.offset = {g};
      b.count = {static_cast<std::uint64_t>(nrows)};
    }
    blocks.push_back(std::move(b));
  };
  std::size_t pos = begin;
  while (pos < end) {
    const std::int64_t row = pos / m.cols_local, col = pos % m.cols_local;
    const std::size_t left = end - pos;
    if (col != 0 || left < static_cast<std::size_t>(m.cols_local)) {
      // A partial row.
      const std::int64_t ncols = std::min<std::int64_t>(m.cols_local - col, left);
      emit(row, 1, col, ncols, pos);
      pos += ncols;
    } else {
      // Whole rows, up to the end of the range or of the q/k/v section.
      const std::int64_t section_end = (row / m.rows_per_section_local + 1) * m.rows_per_section_local;
      const std::int64_t nrows = std::min<std::int64_t>(left / m.cols_local, section_end - row);
      emit(row, nrows, 0, m.cols_local, pos);
      pos += nrows * m.cols_local;
    }
  }
  return blocks;
}

BlockRows block_rows(const ParamInfo& p, const GlobalBlock& b) {
  const std::vector<std::int64_t>& g = p.global_shape;
  BlockRows r;
  if (g.size() == 1) {
    r.first = b.offset[0];
    r.rows = b.count[0];
    r.cols = r.stride = r.local_cols = 1;
    return r;
  }
  // Row-major: every dimension but the last counts rows; a block's leading
  // counts are 1 but for one (global_blocks), so its rows are `stride` apart.
  r.rows = 1;
  for (std::size_t d = 0; d < g.size(); ++d) {
    r.first = r.first * static_cast<std::uint64_t>(g[d]) + b.offset[d];
    if (d + 1 < g.size()) r.rows *= b.count[d];
  }
  r.cols = b.count.back();
  r.stride = static_cast<std::uint64_t>(g.back());
  r.local_cols = static_cast<std::uint64_t>(p.shape.back());
  return r;
}

}  // namespace ndmini
