// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Parallel sharded HDF5 checkpoints.
//
// One checkpoint is <root>/step_NNNNNNNN/ holding checkpoint.h5 and
// manifest.txt. Every tensor is stored as its GLOBAL dataset (contiguous
// float32); each rank writes (MPI-IO) and reads (pread) only its own blocks, so
// a checkpoint written by one layout loads into any other. The on-disk format
// is described in io/format.hpp.
//
// Failure model: every save and load runs as a sequence of phases, and the
// ranks agree on the outcome of each phase before any rank starts the next
// collective call. An I/O error on any rank (a full disk, a failed sync or
// rename) therefore reaches every rank as the same ndmini::Error, naming the
// file and the phase, within one phase; no rank is left waiting.
//
// Where it lives: io/save.cpp and io/load.cpp (the protocols), io/folder.cpp
// (the folder's policy: latest, keep-K, debris, free space, the lock),
// io/slabs.cpp (slab order, the checks across ranks, digests),
// io/raw_file.hpp (MPI-IO and pread), io/format.hpp (the HDF5 file, the manifest).
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"

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
// tensors (names and shapes).
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

// Where the training data came from, so that a resumed run can tell whether
// it continues on the same tokens.
struct DataRecord {
  std::string kind;         // "synthetic", "text" or "tokens"
  std::string path;         // the file as the deck named it (empty for synthetic)
  std::uint64_t bytes = 0;  // its size
  std::string digest;       // hash of its first MiB (16 hex digits; empty for synthetic)
};

// Root attributes of a checkpoint. Data cursor, LR schedule and RNG are pure
// functions of (seed, step) in ndmini, so these are all resumption needs.
struct CheckpointInfo {
  std::int64_t step = 0;             // optimizer steps completed
  std::int64_t consumed_tokens = 0;  // tokens trained on so far
  std::uint64_t seed = 0;
  std::string config;  // the deck as TOML text
  std::string layout;  // the degrees that wrote it, e.g. "pp=1 dp_replicate=1 dp_shard=1 cp=1 tp=1"
  DataRecord data;
};

// The one list of CheckpointInfo's fields: calls f(name, field) for each, in
// the order of the HDF5 root attributes, `name` being the attribute's. Hash,
// broadcast, the HDF5 file and `ndmini ckpt info` all walk this list, so a
// new field cannot be forgotten by one of them. Fields are std::int64_t,
// std::uint64_t or std::string; Info is CheckpointInfo, const or not.
template <class Info, class F>
void for_each_field(Info& info, F&& f) {
  f("step", info.step);
  f("consumed_tokens", info.consumed_tokens);
  f("seed", info.seed);
  f("config", info.config);
  f("layout", info.layout);
  f("data_source", info.data.kind);
  f("data_path", info.data.path);
  f("data_bytes", info.data.bytes);
  f("data_digest", info.data.digest);
}

// The phases of a save, in order: ndmini::SavePhase (config/config.hpp),
// whose names are those of the deck's fault.phase and of the error messages.

// Seconds spent in each part of a save (the slowest rank's), for benchmarks.
struct SaveTimes {
  double create = 0;    // folder, free-space check, HDF5 metadata, space reservation
  double write = 0;     // raw data through MPI-IO (into the page cache, writeback started)
  double digest = 0;    // layout-free digests of the owned blocks (inside `write`, overlapping writeback)
  double flush = 0;     // MPI_File_sync: the data on disk
  double metadata = 0;  // digests into the HDF5 file, its sync, the manifest
  double commit = 0;    // rename, `latest`, folder syncs
  double prune = 0;     // removing checkpoints beyond `keep`
  double total = 0;     // an AsyncSave's: from its construction to the end of finish()
};

struct SaveOptions {
  // Called on every rank at the start of each phase's rank-local work, with the
  // phase, the step being saved and the checkpoint file; what it throws fails
  // that phase on that rank like a real I/O error would (fault injection).
  std::function<void(SavePhase, std::int64_t step, const std::string& file)> hook;
  SaveTimes* times = nullptr;  // filled on every rank when not null
};

// Writes the checkpoint of info.step under root_dir (created if missing):
// into a temporary folder, renamed into place only once every rank's data and
// the metadata are synced; then the `latest` marker is replaced atomically and
// all but the newest `keep` checkpoints are removed. Collective over comm.
// Throws ndmini::Error on every rank if any rank fails in any phase; the
// temporary folder is then removed, `latest` and the previous checkpoints are
// left as they were.
void save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info,
                     const std::vector<TensorSlab>& tensors, int keep, const SaveOptions& options = {});

// The same save with its data written by a background thread
// (checkpoint.async), while the caller goes on training. The constructor
// (collective, the calling thread) checks the arguments, agrees on the
// tensors and lays out the file (phase create), then starts the thread,
// which writes this rank's blocks with pwrite, starts their writeback,
// computes their digests and syncs them (phases write and close, rank-local).
// That thread never calls MPI: the ranks' MPI library need not be
// MPI_THREAD_MULTIPLE, and the ledger and the watchdog see every collective
// on the main thread. finish() (collective, the thread that constructed it)
// waits for the thread, agrees on its outcome, sums the digests and does the
// rest of the protocol (rank 0: metadata, manifest, rename, `latest`, prune),
// so the checkpoint is byte for byte the one save_checkpoint writes. Until
// finish() returns, `latest` names the previous checkpoint. The checkpoints
// the prune drops are renamed aside (".step_N.pruned") and removed by a
// thread of rank 0 that the destructor waits for: destroy a finished
// AsyncSave before the next save (which checks the free space). The slabs'
// memory must stay allocated and unchanged until the thread is done.
// Errors: as save_checkpoint, from the constructor or finish(), on every rank.
// Destroyed unfinished (the run failed elsewhere), it waits for the thread
// and commits nothing; the temporary folder is debris (CheckpointDirLock).
class AsyncSave {
 public:
  AsyncSave(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info,
            const std::vector<TensorSlab>& tensors, int keep, const SaveOptions& options = {});
  ~AsyncSave();
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  std::int64_t step() const;
  // Collective (one all-reduce): has every rank's thread finished writing?
  bool written_everywhere();
  // Collective: commits (see above). Returns the seconds this rank waited
  // for its thread. Call once.
  double finish();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Step named by the `latest` marker, or nullopt when root_dir holds none.
// Collective over comm (rank 0 reads, everyone gets the answer).
std::optional<std::int64_t> latest_step(MPI_Comm comm, const std::string& root_dir);

// The same, read by this process alone (the `ndmini ckpt` tools). The marker
// must be a regular file of at most 64 bytes holding a step number; any
// other throws Error naming it, ending with `fix`.
std::optional<std::int64_t> read_latest_marker(const std::string& root_dir, const std::string& fix);

// Reads the checkpoint of `step` (or of `latest` when step is nullopt) into
// the given slabs (replica blocks included) and returns its root attributes.
// Verifies the manifest before HDF5 parses the file, then every tensor's
// digest over the owned blocks; a missing, truncated or corrupted checkpoint,
// or a missing tensor or shape mismatch, throws ndmini::Error on every rank
// naming the file and the fix. Times in seconds go to *seconds when given.
CheckpointInfo load_checkpoint(MPI_Comm comm, const std::string& root_dir, std::optional<std::int64_t> step,
                               const std::vector<TensorSlab>& tensors, double* seconds = nullptr);

// "step_00000042"
std::string checkpoint_dirname(std::int64_t step);
// Its inverse: 42 for "step_00000042" (or "step_42"); nullopt for any other name.
std::optional<std::int64_t> step_of_dirname(const std::string& name);

// The one-writer guard of a checkpoint folder: rank 0 holds an advisory lock
// (flock) on <dir>/.lock from construction until destruction or process exit
// (the kernel drops it even after SIGKILL). A writer (a run that saves) takes
// it exclusively: a second job on the folder, writer or reader, is refused at
// once, naming the folder and the holder (host and pid). Readers (runs that
// only resume from it) share it, so several may load one checkpoint while no
// job writes there. A writer's construction also proves the folder usable
// before any training time is spent: it exists or can be created, is
// writable, and has room for a checkpoint of `checkpoint_bytes` (0: not
// checked); debris of saves that died (.step_*.tmp) is removed. A reader of a
// folder that does not exist takes nothing (the load reports it).
// Collective over comm; throws ndmini::Error on every rank.
enum class DirAccess { read, write };
class CheckpointDirLock {
 public:
  CheckpointDirLock(MPI_Comm comm, const std::string& dir, DirAccess access, std::uint64_t checkpoint_bytes = 0);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;  // rank 0 only
};

}  // namespace ndmini::io
