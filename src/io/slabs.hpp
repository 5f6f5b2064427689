// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Internal to io/: the slab order. The blocks a rank lists, grouped by
// tensor, checked, and turned into runs of rows in file order; the checks
// that need every rank (the same tensors everywhere, each element owned once)
// and the layout-free digests of the owned blocks.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.hpp"

namespace ndmini::io::detail {

std::uint64_t product(const std::vector<std::uint64_t>& dims);

// The layout-free digest of one block (io::element_digest row by row).
std::uint64_t block_digest(const TensorSlab& t);

// `length` elements from global linear index `start`, at `data` in host memory.
struct Run {
  std::uint64_t start = 0;
  std::uint64_t length = 0;
  float* data = nullptr;
};

// One tensor as this rank sees it: the entries it listed under one name,
// grouped. Every rank has the same Tensors (name, shape) in the same order;
// only the blocks differ.
struct Tensor {
  std::string name;  // as this rank spelled it, for messages
  std::string path;  // "/model/..."
  std::vector<std::uint64_t> shape;
  std::vector<const TensorSlab*> owned;  // non-empty, not replica: digest and coverage
  std::vector<const TensorSlab*> moved;  // what this call transfers: owned on save, every non-empty block on load
  std::vector<Run> runs;                 // rows of `moved` in file order, neighbours merged
};

// Validation and the checks that need every rank: the same set of tensors
// (and `extra`, e.g. a hash of the checkpoint info), and owned blocks that
// together cover each tensor once. Replica blocks are moved only when loading.
// Collective over comm; throws Error on every rank.
std::vector<Tensor> agreed_order(MPI_Comm comm, const std::vector<TensorSlab>& tensors, std::uint64_t extra,
                                 bool loading);

// Each tensor's digest over the owned blocks of all ranks. Collective over comm.
std::vector<std::uint64_t> summed_digests(MPI_Comm comm, const std::vector<std::uint64_t>& mine);

// [first byte, end) of a tensor's runs in the file, its raw data at `offset`.
std::pair<std::uint64_t, std::uint64_t> byte_span(const Tensor& t, std::uint64_t offset);

inline int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

}  // namespace ndmini::io::detail
