// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Parallel sharded HDF5 checkpoints (DESIGN section 4).
//
// One checkpoint is <root>/step_NNNNNNNN/ holding one HDF5 file written
// collectively by every rank of `comm` through MPI-IO. Every tensor is stored
// as its GLOBAL dataset; each rank writes and reads only its own blocks, so a
// checkpoint written by one layout loads into any other. A rank's blocks of
// one tensor are moved in ONE collective transfer whatever their number (the
// union of their hyperslabs), so a layout costs no extra collective calls.
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ndmini::io {

// One block of one global float32 tensor that a rank holds: the row-major
// block [offset, offset + count) of a tensor of shape global_shape, in host
// memory (product(count) floats at data).
//
// A rank may list the same name several times, one entry per block (a
// tensor-parallel rank's rows of q, k and v in c_attn; the partial and full
// rows of a flat FSDP shard). Its blocks of one tensor must not overlap. An
// entry with count all zero (or empty) holds nothing; a rank that holds nothing
// of a tensor passes one such entry, so that every rank names the same set of
// tensors (names and shapes) and takes part in the collective calls.
//
// Ownership: across all ranks, the non-replica blocks of each tensor must
// cover it exactly once. A block the rank holds but does not own (a
// data-parallel replica, a LayerNorm weight replicated over tensor-parallel
// ranks other than 0) is marked replica: save does not write it (as if its
// count were zero); load reads it (every rank needs its data) but leaves it out
// of the coverage check and of the digest comparison.
struct TensorSlab {
  std::string name;  // dataset path, e.g. "model/h/3/mlp/c_fc/weight"
  std::vector<std::uint64_t> global_shape;
  std::vector<std::uint64_t> offset;
  std::vector<std::uint64_t> count;
  float* data = nullptr;  // product(count) floats
  bool replica = false;   // a copy owned by another rank: read on load, never written
};

// Root attributes of a checkpoint. Data cursor, LR schedule and RNG are pure
// functions of (seed, step) in ndmini, so these are all resumption needs.
struct CheckpointInfo {
  std::int64_t step = 0;             // optimizer steps completed
  std::int64_t consumed_tokens = 0;  // tokens trained on so far
  std::uint64_t seed = 0;
  std::string config;  // the deck as TOML text
  std::string layout;  // the degrees that wrote it, e.g. "pp=1 dp_replicate=1 dp_shard=1 cp=1 tp=1"
};

inline constexpr int kFormatVersion = 1;

// Writes the checkpoint of info.step under root_dir (created if missing):
// into a temporary name, renamed into place only once every rank has finished
// and the file is closed and synced; then the `latest` marker is replaced
// atomically and all but the newest `keep` checkpoints are removed.
// Collective over comm. Throws ndmini::Error on every rank if any rank fails
// (no hang, no half-written checkpoint under a final name).
void save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info,
                     const std::vector<TensorSlab>& tensors, int keep);

// Step named by the `latest` marker, or nullopt when root_dir holds none.
// Collective over comm (rank 0 reads, everyone gets the answer).
std::optional<std::int64_t> latest_step(MPI_Comm comm, const std::string& root_dir);

// Reads the checkpoint of `step` (or of `latest` when step is nullopt) into
// the given slabs (replica blocks included) and returns its root attributes.
// Verifies integrity first (digests over the non-replica blocks);
// a missing, truncated or corrupted checkpoint, or a missing tensor or shape
// mismatch, throws ndmini::Error on every rank naming the file and the fix.
CheckpointInfo load_checkpoint(MPI_Comm comm, const std::string& root_dir, std::optional<std::int64_t> step,
                               const std::vector<TensorSlab>& tensors);

// "step_00000042"
std::string checkpoint_dirname(std::int64_t step);

namespace detail {
// The whole-file hash that a checkpoint's manifest.txt records (as 16 hex
// digits). Exposed for tests that forge a manifest to reach the checks behind
// it (Fletcher32, per-tensor digests).
std::uint64_t file_digest(const std::string& path);
}  // namespace detail

}  // namespace ndmini::io
