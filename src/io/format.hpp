// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The on-disk format of one checkpoint folder (format_version 2). Everything
// here runs in ONE process (rank 0 of a job, or the `ndmini ckpt` tools): HDF5
// is only ever used serially, for metadata, and writes only to a temporary
// file (FileBuilder); the ranks move the raw data themselves (io/save.cpp, io/load.cpp).
//
// checkpoint.h5   HDF5 file (superblock v2, libver 1.8..1.10 structures).
//   Root attributes: format_version (2), step, consumed_tokens, seed,
//   config (the resolved deck), layout (the mesh that wrote it), data_source,
//   data_path, data_bytes, data_digest (where the training tokens came from).
//   One dataset per tensor (/model/<name>, /optimizer/exp_avg/<name>,
//   /optimizer/exp_avg_sq/<name>): the GLOBAL tensor, float32 little-endian,
//   CONTIGUOUS layout allocated at creation (no chunks, no filters), raw data
//   4 KiB-aligned, so each rank reads and writes its rows at plain offsets.
//   Each dataset has a `digest` attribute: io::element_digest of the tensor,
//   which any split of the tensor reproduces exactly.
// manifest.txt    written after the file is complete and synced:
//     ndmini-checkpoint-manifest 2
//     file checkpoint.h5
//     size <bytes of checkpoint.h5>
//     metadata <hash of every byte outside the datasets' raw data, in file order>
//     extent <offset> <bytes> <dataset path>      (one per dataset, by offset)
//     manifest <hash of the lines above>
//   A reader checks it BEFORE HDF5 parses the file: damaged metadata could
//   crash, hang or silently mislead the HDF5 library, while damaged raw data
//   is caught by the per-tensor digests after reading. So nothing re-reads
//   the raw data just to check it, at save or load.
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"

namespace ndmini::io::format {

inline constexpr int kVersion = 2;
inline constexpr const char* kFileName = "checkpoint.h5";
inline constexpr const char* kManifestName = "manifest.txt";
// What a corrupted checkpoint's message advises.
inline constexpr const char* kResumeHint = "resume from an earlier step with --resume STEP";

struct TensorEntry {
  std::string path;  // dataset path, "/model/h/0/mlp/c_fc/weight"
  std::vector<std::uint64_t> shape;
  std::uint64_t offset = 0;  // of the raw data in checkpoint.h5
  std::uint64_t digest = 0;  // element_digest of the whole tensor
  std::uint64_t elements() const;
  std::uint64_t bytes() const { return 4 * elements(); }
};

// What a verified checkpoint holds.
struct Index {
  CheckpointInfo info;
  std::uint64_t file_bytes = 0;
  std::vector<TensorEntry> tensors;  // by path
};

// ---- writing (each call throws Error naming the file)

// The HDF5 file of a checkpoint under construction. HDF5 writes it into a
// sparse temporary file (in /dev/shm where it exists: memory), never onto
// the checkpoint's file system: a full disk there then fails only our own
// writes, which report and undo cleanly, never an HDF5 close (on HDF5 1.10 a
// failed H5Fclose leaves a dangling file id that crashes MPI_Finalize).
class FileBuilder {
 public:
  // The root attributes and every dataset allocated (contiguous, 4 KiB
  // aligned), digests 0; fills in the tensors' offsets.
  FileBuilder(const CheckpointInfo& info, std::vector<TensorEntry>& tensors);
  ~FileBuilder();
  FileBuilder(const FileBuilder&) = delete;
  FileBuilder& operator=(const FileBuilder&) = delete;

  // The file's size: its end of allocation.
  std::uint64_t size() const { return size_; }
  // Creates `file` (it must not exist) with size() bytes, their disk blocks
  // reserved (fallocate) where the file system can, so that a disk filled
  // later by others cannot fail the writes into it.
  void create_target(const std::string& file) const;
  // Stores the digests (entries in the constructor's order), completes the
  // HDF5 file, writes every byte of it outside the raw data into `file`
  // (whose raw data the ranks wrote) and syncs it.
  void finish(const std::vector<TensorEntry>& tensors, const std::string& file);

 private:
  int fd_ = -1;           // the temporary file
  std::string path_;      // its name, removed at destruction
  std::int64_t h5_ = -1;  // the open HDF5 file (hid_t)
  std::uint64_t size_ = 0;
};

// Writes and syncs <dir>/manifest.txt for the finished, synced file.
void write_manifest(const std::string& dir, const std::vector<TensorEntry>& tensors);

// ---- reading

// Checks <dir>/manifest.txt against checkpoint.h5 (size, manifest hash,
// extents, every byte outside the raw data) before HDF5 opens the file, then
// reads the attributes and the tensor list and checks each dataset against the
// manifest (type, layout, shape, place). Throws Error: "checkpoint '<file>' is
// corrupted ..." with the reason and kResumeHint.
Index read_index(const std::string& dir);

// "[768, 2304]", for messages.
std::string shape_text(const std::vector<std::uint64_t>& shape);

// Writes `text` to `path` and syncs it before returning.
void write_synced(const std::string& path, const std::string& text);
// fsync of a file or folder.
void sync_path(const std::string& path, bool directory);

}  // namespace ndmini::io::format
