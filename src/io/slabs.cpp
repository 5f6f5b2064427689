// SPDX-License-Identifier: BSD-3-Clause
#include "io/slabs.hpp"

#include <algorithm>
#include <map>

#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"
#include "io/digest.hpp"
#include "io/format.hpp"

namespace ndmini::io::detail {
namespace {

using format::shape_text;

// A block holds nothing when its count is empty or has a zero extent.
bool is_empty(const TensorSlab& t) { return t.count.empty() || product(t.count) == 0; }

// Calls f(global linear index of the row's first element, row number in the
// block) for each row of a non-empty block (a run along the last dimension,
// contiguous in the file and in memory), in the block's row-major order.
template <class F>
void for_each_row(const TensorSlab& t, F&& f) {
  const std::size_t rank = t.global_shape.size();
  std::vector<std::uint64_t> stride(rank, 1);
  for (std::size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * t.global_shape[d];
  const std::uint64_t rows = product(t.count) / t.count[rank - 1];
  std::vector<std::uint64_t> pos(rank, 0);  // position inside the block, last dim excluded
  for (std::uint64_t r = 0; r < rows; ++r) {
    std::uint64_t start = 0;
    for (std::size_t d = 0; d < rank; ++d) start += (t.offset[d] + pos[d]) * stride[d];
    f(start, r);
    for (std::size_t d = rank - 1; d-- > 0;) {  // odometer over the outer dims
      if (++pos[d] < t.count[d]) break;
      pos[d] = 0;
    }
  }
}

std::string dataset_path(const std::string& name) { return name.front() == '/' ? name : "/" + name; }

// ------------------------------------------------------------ validation

// Checks one entry of the caller's list on its own.
void validate_slab(const TensorSlab& t) {
  const std::string tag = "checkpoint tensor '" + t.name + "'";
  require(!t.name.empty() && t.name != "/" && t.name.back() != '/' && t.name.find("//") == std::string::npos &&
              t.name.find_first_of(" \t\r\n") == std::string::npos,
          "checkpoint tensor name '" + t.name + "' is not a dataset path like 'model/h/0/attn/c_attn/weight'");
  require(!t.global_shape.empty(), tag + " has no dimensions; store a scalar as shape [1]");
  for (auto d : t.global_shape) require(d > 0, tag + " has an empty dimension in " + shape_text(t.global_shape));
  require(product(t.global_shape) < (std::uint64_t{1} << 60), tag + " is too large");
  if (is_empty(t)) return;
  require(t.offset.size() == t.global_shape.size() && t.count.size() == t.global_shape.size(),
          tag + ": offset and count need " + std::to_string(t.global_shape.size()) + " entries");
  for (std::size_t d = 0; d < t.global_shape.size(); ++d)
    require(t.offset[d] + t.count[d] <= t.global_shape[d], tag + ": block at " + shape_text(t.offset) + " of " +
                                                               shape_text(t.count) + " exceeds shape " +
                                                               shape_text(t.global_shape));
  require(t.data != nullptr, tag + ": data is null for a non-empty block");
}

// The rows of the moved blocks sorted by file position, rows that continue
// each other in the file and in memory merged into one run (a flat FSDP shard
// is one run; a column split is one run per row). Overlapping blocks are refused.
std::vector<Run> file_order_runs(const Tensor& t) {
  std::vector<Run> runs;
  for (const TensorSlab* b : t.moved) {
    const std::uint64_t row = b->count.back();
    for_each_row(*b, [&](std::uint64_t start, std::uint64_t r) { runs.push_back({start, row, b->data + r * row}); });
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
  std::vector<Run> merged;
  for (const Run& r : runs) {
    if (!merged.empty()) {
      Run& last = merged.back();
      require(last.start + last.length <= r.start,
              "checkpoint tensor '" + t.name + "': two blocks of one rank overlap (at flat element " +
                  std::to_string(r.start) + "); a rank must list each element at most once");
      if (last.start + last.length == r.start && last.data + last.length == r.data) {
        last.length += r.length;
        continue;
      }
    }
    merged.push_back(r);
  }
  return merged;
}

// Groups the entries by dataset, sorted by path, so that every rank handles
// the datasets once each, in one order, however many blocks it holds.
// Replica blocks are transferred only when loading.
std::vector<Tensor> group_blocks(const std::vector<TensorSlab>& slabs, bool loading) {
  std::map<std::string, Tensor> by_path;
  for (const TensorSlab& s : slabs) {
    validate_slab(s);
    const std::string path = dataset_path(s.name);
    Tensor& t = by_path[path];
    if (t.name.empty()) {
      t.name = s.name;
      t.path = path;
      t.shape = s.global_shape;
    }
    require(s.global_shape == t.shape, "checkpoint tensor '" + s.name + "' is listed with shapes " +
                                           shape_text(t.shape) + " and " + shape_text(s.global_shape) +
                                           "; all its blocks must name the global shape");
    if (is_empty(s)) continue;
    if (!s.replica) t.owned.push_back(&s);
    if (!s.replica || loading) t.moved.push_back(&s);
  }
  std::vector<Tensor> order;
  order.reserve(by_path.size());
  for (auto& entry : by_path) {
    Tensor& t = entry.second;
    t.runs = file_order_runs(t);
    order.push_back(std::move(t));
  }
  return order;
}

// Over the set of distinct tensors (paths and shapes), not the blocks: ranks
// hold different numbers of blocks of a tensor.
std::uint64_t fingerprint(const std::vector<Tensor>& order) {
  StreamHash h;
  for (const Tensor& t : order) {
    h.update(t.path.c_str(), t.path.size() + 1);  // with the NUL, so "ab"+"c" differs from "a"+"bc"
    for (auto d : t.shape) h.update(&d, sizeof d);
    const std::uint64_t end = ~std::uint64_t{0};
    h.update(&end, sizeof end);
  }
  return h.finish();
}

}  // namespace

std::uint64_t product(const std::vector<std::uint64_t>& dims) {
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

std::uint64_t block_digest(const TensorSlab& t) {
  if (is_empty(t)) return 0;
  const std::uint64_t row = t.count.back();
  std::uint64_t sum = 0;
  for_each_row(t, [&](std::uint64_t start, std::uint64_t r) { sum += element_digest(t.data + r * row, row, start); });
  return sum;
}

std::vector<Tensor> agreed_order(MPI_Comm comm, const std::vector<TensorSlab>& tensors, std::uint64_t extra,
                                 bool loading) {
  std::vector<Tensor> order;
  agree_on_errors(comm, [&] { order = group_blocks(tensors, loading); });
  const std::uint64_t mine = splitmix64(fingerprint(order) ^ extra);
  std::uint64_t lo = 0, hi = 0;
  mpi_all_reduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, comm, "the checkpoint's tensor set (min)");
  mpi_all_reduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, comm, "the checkpoint's tensor set (max)");
  require(lo == hi,
          "checkpoint: the ranks passed different tensor lists, shapes or checkpoint info; every "
          "rank must name the same tensors (with count 0 where it holds nothing)");
  std::vector<std::uint64_t> held(order.size(), 0), total(order.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const TensorSlab* b : order[i].owned) held[i] += product(b->count);
  mpi_all_reduce(held.data(), total.data(), static_cast<int>(held.size()), MPI_UINT64_T, MPI_SUM, comm,
                 "the checkpoint's block coverage");
  for (std::size_t i = 0; i < order.size(); ++i)
    require(total[i] == product(order[i].shape),
            "checkpoint: the ranks' non-replica blocks of tensor '" + order[i].name + "' hold " +
                std::to_string(total[i]) + " elements but its shape " + shape_text(order[i].shape) + " has " +
                std::to_string(product(order[i].shape)) +
                "; each element must belong to exactly one rank (mark the other copies replica)");
  return order;
}

std::vector<std::uint64_t> summed_digests(MPI_Comm comm, const std::vector<std::uint64_t>& mine) {
  std::vector<std::uint64_t> sums(mine.size());
  // Wraps mod 2^64, as intended.
  mpi_all_reduce(mine.data(), sums.data(), static_cast<int>(mine.size()), MPI_UINT64_T, MPI_SUM, comm,
                 "the checkpoint's digests");
  return sums;
}

std::pair<std::uint64_t, std::uint64_t> byte_span(const Tensor& t, std::uint64_t offset) {
  if (t.runs.empty()) return {offset, offset};
  return {offset + 4 * t.runs.front().start, offset + 4 * (t.runs.back().start + t.runs.back().length)};
}

}  // namespace ndmini::io::detail
