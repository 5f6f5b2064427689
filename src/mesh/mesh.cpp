// SPDX-License-Identifier: BSD-3-Clause
#include "mesh/mesh.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"

namespace ndmini {

namespace detail {
namespace {

// The groups of ranks that share every coordinate outside `keep`, each in
// rank order, the groups ordered by their lowest rank: exactly the rank sets
// MPI_Cart_sub(keep) builds on a no-reorder Cartesian communicator.
std::vector<std::vector<int>> groups_of(const ParallelDims& shape, const AxisSet& keep) {
  std::map<std::array<int, kNumAxes>, std::size_t> index;
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < shape.size(); ++r) {
    auto key = shape.coords_of(r);
    for (int i = 0; i < kNumAxes; ++i)
      if (keep[i]) key[i] = 0;
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, groups.size()).first;
      groups.emplace_back();
    }
    groups[it->second].push_back(r);
  }
  return groups;
}

// "[0 1] [2 3] ..."; long lists are cut so the mesh of a big job stays readable.
std::string format_groups(const std::vector<std::vector<int>>& groups) {
  constexpr std::size_t kMaxGroups = 16, kMaxMembers = 16;
  std::string out;
  for (std::size_t g = 0; g < groups.size() && g < kMaxGroups; ++g) {
    if (g) out += ' ';
    out += '[';
    const auto& grp = groups[g];
    for (std::size_t i = 0; i < grp.size() && i < kMaxMembers; ++i) {
      if (i) out += ' ';
      out += std::to_string(grp[i]);
    }
    if (grp.size() > kMaxMembers) out += " ... " + std::to_string(grp.back());
    out += ']';
  }
  if (groups.size() > kMaxGroups) out += " ... (" + std::to_string(groups.size()) + " groups)";
  return out;
}

// The deck key of an axis, for messages: "parallel.tp".
std::string key_of(Axis a) { return std::string("parallel.") + axis_name(a); }

}  // namespace
}  // namespace detail

ParallelDims resolve_mesh(const ParallelConfig& p, int world) {
  using std::to_string;
  require(world >= 1, "the job must have at least one rank, got " + to_string(world));
  std::array<int, kNumAxes> degree = {p.pp, p.dp_replicate, p.dp_shard, p.cp, p.tp};

  // At most one axis may take "what is left": two would make the split ambiguous.
  int wild = -1;
  for (Axis a : kAxes) {
    const int i = static_cast<int>(a);
    if (degree[i] != -1) continue;
    require(wild < 0, std::string(detail::key_of(static_cast<Axis>(wild))) + " and " + detail::key_of(a) +
                          " are both -1; at most one degree may be -1 (what is left of the world), set the other");
    wild = i;
  }
  for (Axis a : kAxes) {
    const int i = static_cast<int>(a);
    require(degree[i] == -1 || degree[i] >= 1,
            std::string(detail::key_of(a)) + " = " + to_string(degree[i]) + " must be -1 or at least 1");
  }

  // The degrees, written in the deck's order so the user recognises them; `skip`: an axis left out.
  const auto degrees_text = [&degree](int skip) {
    std::string expr;
    for (Axis a : {Axis::dp_replicate, Axis::dp_shard, Axis::tp, Axis::cp, Axis::pp}) {
      if (static_cast<int>(a) == skip) continue;
      if (!expr.empty()) expr += " x ";
      expr += std::string(axis_name(a)) + "=" + to_string(degree[static_cast<int>(a)]);
    }
    return expr;
  };
  const auto ranks = [](long long n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); };
  // 64-bit: a deck may hold degrees whose product overflows an int.
  const auto product_without = [&degree](int skip) {
    long long product = 1;
    for (int i = 0; i < kNumAxes; ++i)
      if (i != skip) product *= degree[i];
    return product;
  };

  if (wild >= 0) {
    const long long others = product_without(wild);
    const auto key = std::string(detail::key_of(static_cast<Axis>(wild)));
    const bool the_default = static_cast<Axis>(wild) == Axis::dp_shard;
    require(world % others == 0,
            key + " = -1" + (the_default ? " (the default)" : "") + " cannot be resolved: the other degrees (" +
                degrees_text(wild) + ") multiply to " + to_string(others) + ", which does not divide the " +
                to_string(world) + " ranks of the job; change the degrees or launch a multiple of " + ranks(others) +
                " (mpiexec -n " + to_string(others) + ")");
    degree[wild] = static_cast<int>(world / others);
  }

  const long long product = product_without(-1);
  if (product != world) {
    // Every degree was set: dp_shard = -1 would fill the world where the others divide it.
    const int shard = static_cast<int>(Axis::dp_shard);
    const long long others = product_without(shard);
    const std::string fill = world % others == 0 ? ", or set parallel.dp_shard = -1 (--set parallel.dp_shard=-1) "
                                                   "to fill the job with FSDP (dp_shard = " +
                                                       to_string(world / others) + ")"
                                                 : "";
    throw Error("parallel: " + degrees_text(-1) + " = " + ranks(product) + ", but the job has " + to_string(world) +
                "; change the degrees or launch " + ranks(product) + " (mpiexec -n " + to_string(product) + ")" + fill);
  }
  ParallelDims dims = ParallelDims::from_degrees(degree);
  dims.sequence_parallel = p.sequence_parallel;
  dims.virtual_stages = p.virtual_stages;
  // The expert groups are ep consecutive ranks of dp_shard x cp x tp: ep must divide it.
  require(p.ep >= 1, "parallel.ep = " + to_string(p.ep) + " must be at least 1");
  const int host = dims.span(kExpertHostAxes);
  require(host % p.ep == 0, "parallel.ep = " + to_string(p.ep) +
                                " does not divide dp_shard x cp x tp = " + to_string(dims.dp_shard) + " x " +
                                to_string(dims.cp) + " x " + to_string(dims.tp) + " = " + to_string(host) +
                                " (the expert groups are ep consecutive ranks of it); choose an ep that divides it, "
                                "or more ranks on those axes");
  dims.ep = p.ep;
  return dims;
}

std::string describe_filled_degree(const ParallelConfig& p, const ParallelDims& dims) {
  const std::array<int, kNumAxes> given = {p.pp, p.dp_replicate, p.dp_shard, p.cp, p.tp};
  for (Axis a : kAxes) {
    if (given[static_cast<int>(a)] != -1) continue;
    const int n = dims.degree_of(a);
    const bool the_default = a == Axis::dp_shard;
    return std::string(detail::key_of(a)) + " = -1" + (the_default ? " (the default)" : "") +
           " fills the world: " + axis_name(a) + " = " + std::to_string(n) + " of " + std::to_string(dims.size()) +
           (dims.size() == 1 ? " rank" : " ranks") + (the_default ? "; set the degrees to choose another layout" : "");
  }
  return "";
}

std::string describe_mesh(const ParallelDims& shape, bool details) {
  std::string out = "mesh " + shape.str() + " (" + std::to_string(shape.size()) + " ranks)\n";
  if (!details) return out;
  char line[128];
  out += "rank  pp dp_replicate dp_shard cp tp\n";
  // Every rank up to 64; beyond that the first ones show the pattern and the order gives the rest.
  constexpr int kMaxRows = 64, kHeadRows = 16;
  const int n = shape.size();
  const int rows = n <= kMaxRows ? n : kHeadRows;
  for (int r = 0; r < rows; ++r) {
    const auto c = shape.coords_of(r);
    std::snprintf(line, sizeof line, "%4d  %2d %12d %8d %2d %2d\n", r, c[0], c[1], c[2], c[3], c[4]);
    out += line;
  }
  if (rows < n)
    out += "...   (" + std::to_string(n - rows) + " more; tp varies fastest, then cp, dp_shard, dp_replicate, pp)\n";
  for (Axis a : kAxes) {
    if (shape.degree_of(a) <= 1) continue;
    AxisSet keep{};
    keep[static_cast<int>(a)] = true;
    out += std::string(axis_name(a)) + " groups: " + detail::format_groups(detail::groups_of(shape, keep)) + "\n";
  }
  if (shape.fsdp() > 1)
    out += "fsdp groups (" + axis_names(kFsdpAxes) +
           "): " + detail::format_groups(detail::groups_of(shape, kFsdpAxes)) + "\n";
  if (shape.ep > 1) {
    out += "expert groups (ep = " + std::to_string(shape.ep) + " consecutive ranks of " + axis_names(kExpertHostAxes) +
           "): " + detail::format_groups(shape.expert_groups()) + "\n";
    out += "expert fsdp groups (the rest of " + axis_names(kExpertHostAxes) + ", " +
           std::to_string(shape.expert_fsdp()) +
           " ranks; replicated over dp_replicate): " + detail::format_groups(shape.expert_fsdp_groups()) + "\n";
  }
  if (shape.degree_of(Axis::pp) > 1) {
    // The first and the last stage of each pipeline: every group of pp ranks, its two ends.
    AxisSet keep{};
    keep[static_cast<int>(Axis::pp)] = true;
    auto groups = detail::groups_of(shape, keep);
    for (auto& g : groups) g = {g.front(), g.back()};
    out += "pipeline ends (first and last stage): " + detail::format_groups(groups) + "\n";
  }
  // Which ranks each reduction spans: the one place a reader can check it.
  out += "loss summed over " + axis_names(kBatchAxes) + " (" + std::to_string(shape.batch()) +
         " ranks); gradient norm over " + axis_names(kNormAxes) + " (" + std::to_string(shape.norm()) + " ranks)\n";
  return out;
}

namespace {

MPI_Comm cart_sub(MPI_Comm cart, const std::array<bool, kNumAxes>& keep) {
  int remain[kNumAxes];
  for (int i = 0; i < kNumAxes; ++i) remain[i] = keep[i] ? 1 : 0;
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Cart_sub(cart, remain, &sub);
  return sub;
}

}  // namespace

Mesh::Mesh(const ParallelDims& shape, MPI_Comm world) : dims_(shape) {
  axis_.fill(MPI_COMM_NULL);  // MPI_COMM_NULL is not 0 in every MPI
  int world_size = 0;
  MPI_Comm_size(world, &world_size);
  // Same answer on every rank, so every rank throws alike and none hangs.
  require(shape.size() == world_size, "mesh " + shape.str() + " needs " + std::to_string(shape.size()) +
                                          " ranks, but the communicator has " + std::to_string(world_size));

  int dims[kNumAxes], periods[kNumAxes] = {0, 0, 0, 0, 0};
  for (int i = 0; i < kNumAxes; ++i) dims[i] = shape.degrees()[i];
  // reorder = 0: keep world ranks, so tp lands on consecutive ranks (one node under srun's block placement).
  MPI_Cart_create(world, kNumAxes, dims, periods, 0, &cart_);
  MPI_Comm_rank(cart_, &rank_);
  coords_ = dims_.coords_of(rank_);

  for (Axis a : kAxes) {
    std::array<bool, kNumAxes> keep{};
    keep[static_cast<int>(a)] = true;
    axis_[static_cast<int>(a)] = cart_sub(cart_, keep);
  }
  fsdp_ = cart_sub(cart_, kFsdpAxes);
  batch_ = cart_sub(cart_, kBatchAxes);
  norm_ = cart_sub(cart_, kNormAxes);
  // The two ends of each pipeline, one group per set of other coordinates;
  // the rank index inside it is the stage order (first, then last).
  const int pp = degree(Axis::pp), stage = coord(Axis::pp);
  if (pp > 1) {
    std::array<int, kNumAxes> key = coords_;
    key[static_cast<int>(Axis::pp)] = 0;
    const bool end = stage == 0 || stage == pp - 1;
    MPI_Comm_split(cart_, end ? dims_.rank_of(key) : MPI_UNDEFINED, stage, &ends_);
  }
  // The expert groups are no Cartesian sub-grid (ep consecutive ranks of
  // dp_shard x cp x tp): split by group, ordered by ep rank. The expert fsdp
  // groups (the ranks of one (pp, dp_replicate) block with the same ep rank)
  // neither. Colours as ParallelDims::expert_groups and expert_fsdp_groups key them.
  const int host = dims_.span(kExpertHostAxes), block = rank_ / host * host;
  if (dims_.ep > 1)
    MPI_Comm_split(cart_, block + dims_.expert_host_index(rank_) / dims_.ep, dims_.ep_rank(rank_), &expert_);
  MPI_Comm_split(cart_, block + dims_.ep_rank(rank_), rank_, &expert_fsdp_);

  // Node awareness: a node is named by the lowest world rank on it; every
  // rank's node is kept on `world` (node_of_ranks), so a mesh built again on
  // it asks MPI nothing: the same answer on every rank, without a collective.
  const std::vector<int>& node = node_of_ranks(world);
  ranks_per_node_ = static_cast<int>(std::count(node.begin(), node.end(), node[static_cast<std::size_t>(rank_)]));

  // Over the whole mesh: rank 0's own group may sit on one node while another spans two.
  for (int k = 0; k < 2; ++k) {
    const Axis a = k == 0 ? Axis::tp : Axis::cp;
    bool any = false;
    for (int r = 0; r < dims_.size(); ++r) {
      std::array<int, kNumAxes> first = dims_.coords_of(r);  // the first rank of r's group
      first[static_cast<int>(a)] = 0;
      any = any || node[static_cast<std::size_t>(r)] != node[static_cast<std::size_t>(dims_.rank_of(first))];
    }
    spans_nodes_[k] = any;
    if (spans_nodes_[k] && rank_ == 0) {
      const char* name = k == 0 ? "tp" : "cp";
      std::fprintf(stderr,
                   "warning: %s groups span nodes: %s traffic will cross the network; put %s on consecutive ranks "
                   "of one node (%d ranks per node here, %s = %d)\n",
                   name, name, name, ranks_per_node_, name, degree(a));
      std::fflush(stderr);
    }
  }
}

Mesh::~Mesh() {
  // A Mesh that outlives MPI_Finalize (a static, a leaked test fixture) must not call into MPI.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  auto release = [](MPI_Comm& c) {
    if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
  };
  release(expert_fsdp_);
  release(expert_);
  release(ends_);
  release(norm_);
  release(batch_);
  release(fsdp_);
  for (auto& c : axis_) release(c);
  release(cart_);
}

}  // namespace ndmini
