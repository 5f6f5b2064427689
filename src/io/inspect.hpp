// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// `ndmini ckpt info` and `ndmini ckpt verify`: one checkpoint examined by one
// process, without a job (no MPI calls).
#include <cstdint>
#include <string>
#include <vector>

namespace ndmini::io {

// The checkpoint folder that `path` names: a step folder, the checkpoint.h5
// inside one, or a checkpoint.dir (the step its `latest` names). Throws Error
// saying what a valid path looks like.
std::string resolve_checkpoint(const std::string& path);

// Step, tokens, seed, the layout that wrote it, data provenance, every tensor
// (shape, bytes, digest) and the deck, as text. The manifest and the metadata
// are verified first (not the raw data: that is `verify`).
std::string describe_checkpoint(const std::string& dir);

struct VerifyReport {
  std::vector<std::string> problems;  // empty: every check passed
  std::uint64_t tensors = 0, bytes = 0;
};
// Every check a load makes, for the whole file: the manifest (size, metadata
// hash, extents), the HDF5 structure against it, and every tensor's digest
// recomputed from its raw data.
VerifyReport verify_checkpoint(const std::string& dir);

}  // namespace ndmini::io
