// SPDX-License-Identifier: BSD-3-Clause
#include "mesh/dims.hpp"

#include <algorithm>
#include <utility>

namespace ndmini {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::pp:
      return "pp";
    case Axis::dp_replicate:
      return "dp_replicate";
    case Axis::dp_shard:
      return "dp_shard";
    case Axis::cp:
      return "cp";
    case Axis::tp:
      return "tp";
  }
  return "?";
}

std::string axis_names(const AxisSet& axes) {
  std::string out;
  for (Axis a : kAxes) {
    if (!axes[static_cast<int>(a)]) continue;
    if (!out.empty()) out += " x ";
    out += axis_name(a);
  }
  return out;
}

ParallelDims ParallelDims::from_degrees(const std::array<int, kNumAxes>& d) {
  ParallelDims dims;
  dims.pp = d[0];
  dims.dp_replicate = d[1];
  dims.dp_shard = d[2];
  dims.cp = d[3];
  dims.tp = d[4];
  return dims;
}

int ParallelDims::degree_of(Axis a) const { return degrees()[static_cast<int>(a)]; }

int ParallelDims::size() const {
  int p = 1;
  for (int d : degrees()) p *= d;
  return p;
}

int ParallelDims::span(const AxisSet& axes) const {
  const auto d = degrees();
  int p = 1;
  for (int i = 0; i < kNumAxes; ++i)
    if (axes[i]) p *= d[i];
  return p;
}

std::array<int, kNumAxes> ParallelDims::coords_of(int rank) const {
  // Row-major over pp, dp_replicate, dp_shard, cp, tp: the last axis varies fastest,
  // matching MPI_Cart_coords on a no-reorder Cartesian communicator.
  const auto d = degrees();
  std::array<int, kNumAxes> c{};
  for (int i = kNumAxes - 1; i >= 0; --i) {
    c[i] = rank % d[i];
    rank /= d[i];
  }
  return c;
}

int ParallelDims::rank_of(const std::array<int, kNumAxes>& coords) const {
  const auto d = degrees();
  int r = 0;
  for (int i = 0; i < kNumAxes; ++i) r = r * d[i] + coords[i];
  return r;
}

int ParallelDims::expert_host_index(int rank) const {
  const auto c = coords_of(rank);
  return (c[static_cast<int>(Axis::dp_shard)] * cp + c[static_cast<int>(Axis::cp)]) * tp +
         c[static_cast<int>(Axis::tp)];
}

namespace {

// The ranks grouped by `key` (one group per key, the groups in the order of
// their lowest rank, each in rank order).
template <class Key>
std::vector<std::vector<int>> group_by(int world, Key key) {
  std::vector<std::pair<long long, std::vector<int>>> groups;
  for (int r = 0; r < world; ++r) {
    const long long k = key(r);
    auto it = std::find_if(groups.begin(), groups.end(), [k](const auto& g) { return g.first == k; });
    if (it == groups.end()) {
      groups.push_back({k, {}});
      it = groups.end() - 1;
    }
    it->second.push_back(r);
  }
  std::vector<std::vector<int>> out;
  for (auto& g : groups) out.push_back(std::move(g.second));
  return out;
}

}  // namespace

std::vector<std::vector<int>> ParallelDims::expert_groups() const {
  // The ranks of one (pp, dp_replicate) block of dp_shard x cp x tp are
  // consecutive; ep of them in a row form a group.
  const int host = span(kExpertHostAxes);
  return group_by(size(), [&](int r) { return static_cast<long long>(r / host) * host + expert_host_index(r) / ep; });
}

std::vector<std::vector<int>> ParallelDims::expert_fsdp_groups() const {
  const int host = span(kExpertHostAxes);
  return group_by(size(), [&](int r) { return static_cast<long long>(r / host) * host + ep_rank(r); });
}

std::string ParallelDims::str() const {
  std::string out;
  for (Axis a : kAxes) {
    if (!out.empty()) out += ' ';
    out += std::string(axis_name(a)) + "=" + std::to_string(degree_of(a));
  }
  return out;
}

}  // namespace ndmini
