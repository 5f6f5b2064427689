// SPDX-License-Identifier: BSD-3-Clause
// Parallel sharded checkpoints: the save protocol.
//
// Save, phase by phase (each ends with an agreement over the communicator, so
// an error on any rank stops every rank before the next collective call):
//   create  rank 0: temporary folder, free-space check, the HDF5 file with
//           every dataset allocated (io/format), its disk space reserved;
//           the datasets' offsets are broadcast
//   write   every rank writes its owned blocks at those offsets through its
//           own MPI-IO handle (independent writes: no collective inside the
//           MPI library or HDF5 can wait for a rank that failed), starts
//           their writeback and computes their layout-free digests meanwhile
//   close   every rank syncs and closes its handle; rank 0 stores the summed
//           digests in the file, syncs it and writes the manifest
//   rename  rank 0: the temporary folder becomes step_N (the commit)
//   latest  rank 0: the `latest` marker is replaced atomically
// then rank 0 prunes. On failure rank 0 removes what the save created and
// puts back what it moved, so `latest` and the older checkpoints are as before.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <system_error>
#include <thread>

#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "io/checkpoint.hpp"
#include "io/digest.hpp"
#include "io/folder.hpp"
#include "io/format.hpp"
#include "io/raw_file.hpp"
#include "io/slabs.hpp"

namespace ndmini::io {
namespace {

namespace fs = std::filesystem;
using namespace detail;
using format::kFileName;

// What rank 0 has changed in the folder so far, to undo it on failure.
struct Rollback {
  fs::path root;
  std::int64_t step = 0;
  std::int64_t previous = -1;   // the step `latest` named before (-1: none)
  bool renamed = false;         // tmp is now step_N
  bool replaced = false;        // an older step_N was moved to .step_N.old
  bool latest_written = false;  // `latest` names step_N
  bool prev_linked = false;     // the old marker is kept as latest.prev

  // Undoing needs no new disk blocks (a full disk is a likely cause): renames
  // and removals only. Should putting `latest` back fail, the new checkpoint,
  // complete and named by it, stays.
  void undo() const noexcept {
    std::error_code ec;
    fs::remove_all(root / tmp_dirname(step), ec);
    fs::remove(root / marker_tmp_name(), ec);
    if (!latest_written) fs::remove(root / marker_prev_name(), ec);
    bool restored = true;
    if (latest_written) {
      ec.clear();
      if (previous < 0) {
        fs::remove(root / kLatestName, ec);
      } else if (prev_linked) {
        fs::rename(root / marker_prev_name(), root / kLatestName, ec);
      } else {  // a file system without hard links: write it again
        try {
          format::write_synced((root / marker_tmp_name()).string(), std::to_string(previous) + "\n");
          fs::rename(root / marker_tmp_name(), root / kLatestName, ec);
        } catch (const std::exception&) {
          ec = std::make_error_code(std::errc::io_error);
        }
      }
      restored = !ec;
    }
    if (!restored) return;
    if (renamed) fs::remove_all(root / checkpoint_dirname(step), ec);
    if (replaced) fs::rename(root / old_dirname(step), root / checkpoint_dirname(step), ec);
  }
};

void hash_field(StreamHash& h, std::int64_t v) { h.update(&v, sizeof v); }
void hash_field(StreamHash& h, std::uint64_t v) { h.update(&v, sizeof v); }
// With the NUL, so "ab" + "c" differs from "a" + "bc".
void hash_field(StreamHash& h, const std::string& s) { h.update(s.c_str(), s.size() + 1); }

// Every field of the info, and `keep`: the ranks must agree on all of them.
// Compared between the ranks of one save, never stored.
std::uint64_t info_hash(const CheckpointInfo& info, int keep) {
  StreamHash h;
  for_each_field(info, [&](const char*, const auto& value) { hash_field(h, value); });
  hash_field(h, std::int64_t{keep});
  return h.finish();
}

// One save, carried from phase to phase.
struct Save {
  Save(MPI_Comm comm_, const std::string& root_dir, const CheckpointInfo& info_, const SaveOptions& options_)
      : comm(comm_),
        rank(comm_rank(comm_)),
        info(info_),
        options(options_),
        root(root_dir),
        tmp(root / tmp_dirname(info_.step)),
        file((tmp / kFileName).string()),
        rollback{root, info_.step} {}

  MPI_Comm comm;
  int rank;
  const CheckpointInfo info;  // copies: an async save outlives its caller's
  const SaveOptions options;
  fs::path root;
  fs::path tmp;      // the folder being written, renamed to step_N on commit
  std::string file;  // the HDF5 file in tmp
  std::vector<Tensor> order;
  std::vector<format::TensorEntry> entries;      // the index, in `order`
  std::unique_ptr<format::FileBuilder> builder;  // rank 0: the HDF5 metadata, in memory until complete
  std::unique_ptr<RawFile> raw;                  // this rank's handle while it writes
  std::vector<std::uint64_t> digests;            // this rank's part of each tensor's digest
  SaveTimes times;
  Rollback rollback;
};

// A bad argument on any rank stops every rank before anything is touched.
void check_arguments(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info, int keep) {
  agree_on_errors(comm, [&] {
    require(!root_dir.empty(), "checkpoint.dir is empty; set it to a folder");
    require(info.step >= 0, "checkpoint step " + std::to_string(info.step) + " is negative");
    require(keep >= 1, "checkpoint.keep = " + std::to_string(keep) + " must be at least 1");
  });
}

// One phase: its rank-local work (after the fault hook) on every rank, then
// the agreement. A failure is named by phase and rank.
void run_phase(Save& s, SavePhase p, double* seconds, const std::function<void()>& body) {
  const auto t0 = Clock::now();
  agree_on_errors(s.comm, [&] {
    try {
      if (s.options.hook) s.options.hook(p, s.info.step, s.file);
      body();
    } catch (const std::exception& e) {
      throw Error(std::string("phase '") + name_of(p) + "' on rank " + std::to_string(s.rank) + ": " + e.what());
    }
  });
  if (seconds) *seconds += seconds_since(t0);
}

// create: rank 0 lays out the file (every dataset allocated, its space
// reserved) so that every rank can write at the broadcast offsets.
void create_file(Save& s) {
  s.entries.resize(s.order.size());
  for (std::size_t i = 0; i < s.order.size(); ++i) s.entries[i] = {s.order[i].path, s.order[i].shape, 0, 0};
  run_phase(s, SavePhase::create, &s.times.create, [&] {
    if (s.rank != 0) return;
    fs::create_directories(s.root);
    read_latest(s.root);    // a damaged marker stops the save here, not after it
    fs::remove_all(s.tmp);  // left by a save that died
    std::uint64_t data_bytes = 0;
    for (const auto& e : s.entries) data_bytes += e.bytes();
    require_free_space(s.root, needed_bytes(data_bytes, s.entries.size()),
                       "to save checkpoint step " + std::to_string(s.info.step));
    fs::create_directory(s.tmp);
    s.builder = std::make_unique<format::FileBuilder>(s.info, s.entries);
    s.builder->create_target(s.file);
  });
  std::vector<std::uint64_t> offsets(s.entries.size());
  for (std::size_t i = 0; i < s.entries.size(); ++i) offsets[i] = s.entries[i].offset;
  mpi_broadcast(offsets.data(), static_cast<int>(offsets.size()), MPI_UINT64_T, 0, s.comm, "the datasets' offsets");
  for (std::size_t i = 0; i < s.entries.size(); ++i) s.entries[i].offset = offsets[i];
}

// This rank's blocks into the page cache, each tensor's writeback started
// and its digest computed meanwhile. Rank-local; `posix`: through pwrite, no
// MPI call (an async save's background thread).
void write_blocks(Save& s, bool posix) {
  s.digests.assign(s.order.size(), 0);
  const bool writes = std::any_of(s.order.begin(), s.order.end(), [](const Tensor& t) { return !t.runs.empty(); });
  if (!writes) return;
  s.raw = std::make_unique<RawFile>(s.file, true, posix);
  for (std::size_t i = 0; i < s.order.size(); ++i) {
    const Tensor& t = s.order[i];
    for (const Run& r : t.runs) s.raw->write(s.entries[i].offset + 4 * r.start, r.data, 4 * r.length);
    const auto span = byte_span(t, s.entries[i].offset);
    s.raw->start_writeback(span.first, span.second - span.first);
    const auto t0 = Clock::now();
    for (const TensorSlab* b : t.owned) s.digests[i] += block_digest(*b);
    s.times.digest += seconds_since(t0);
  }
}

// This rank's data durable: the handle synced and closed.
void flush_blocks(Save& s) {
  const auto t0 = Clock::now();
  if (s.raw) s.raw->close(true);
  s.raw.reset();
  s.times.flush = seconds_since(t0);
}

// The per-tensor digests summed over the ranks into the index.
void sum_digests(Save& s) {
  const auto sums = summed_digests(s.comm, s.digests);
  for (std::size_t i = 0; i < s.entries.size(); ++i) s.entries[i].digest = sums[i];
}

// write: the data into the page cache and its writeback started, the digests
// computed meanwhile; then summed over the ranks into the index.
void write_slabs(Save& s) {
  run_phase(s, SavePhase::write, &s.times.write, [&] { write_blocks(s, false); });
  sum_digests(s);
}

// rank 0: the digests into the HDF5 metadata, copied into the file, and the manifest.
void write_metadata(Save& s) {
  if (s.rank != 0) return;
  const auto t1 = Clock::now();
  s.builder->finish(s.entries, s.file);
  s.builder.reset();
  format::write_manifest(s.tmp.string(), s.entries);
  s.times.metadata = seconds_since(t1);
}

// close: every rank's data durable; rank 0 completes the metadata (the
// digests) and writes the manifest.
void close_file(Save& s) {
  run_phase(s, SavePhase::close, nullptr, [&] {
    flush_blocks(s);
    write_metadata(s);
  });
}

// rename: the commit. The temporary folder becomes step_N.
void rename_folder(Save& s) {
  run_phase(s, SavePhase::rename, nullptr, [&] {
    if (s.rank != 0) return;
    format::sync_path(s.tmp.string(), true);
    const fs::path final_dir = s.root / checkpoint_dirname(s.info.step);
    // Saving a step that already exists (a run resumed from an earlier
    // step): rename() cannot replace a non-empty folder, so move it aside.
    fs::remove_all(s.root / old_dirname(s.info.step));
    if (fs::exists(final_dir)) {
      fs::rename(final_dir, s.root / old_dirname(s.info.step));
      s.rollback.replaced = true;
    }
    fs::rename(s.tmp, final_dir);
    s.rollback.renamed = true;
    format::sync_path(s.root.string(), true);
  });
}

// latest: the marker names step_N, replaced atomically.
void write_latest(Save& s) {
  run_phase(s, SavePhase::latest, nullptr, [&] {
    if (s.rank != 0) return;
    const fs::path marker_tmp = s.root / marker_tmp_name(), marker_prev = s.root / marker_prev_name();
    format::write_synced(marker_tmp.string(), std::to_string(s.info.step) + "\n");
    // The old marker stays reachable (a hard link) until the save is
    // agreed, so undoing is a rename, which needs no free space.
    fs::remove(marker_prev);
    std::error_code no_link;
    if (s.rollback.previous >= 0) fs::create_hard_link(s.root / kLatestName, marker_prev, no_link);
    s.rollback.prev_linked = s.rollback.previous >= 0 && !no_link;
    fs::rename(marker_tmp, s.root / kLatestName);
    s.rollback.latest_written = true;
    format::sync_path(s.root.string(), true);
  });
}

// A phase failed (on every rank: errors are agreed): rank 0 undoes what the
// save did, and every rank throws one error that says what state is left.
[[noreturn]] void roll_back(Save& s, const Error& e) {
  long long state[3] = {s.rollback.previous, -1, 0};  // previous, latest now, debris left
  if (s.rank == 0) {
    s.rollback.undo();
    std::error_code ec;
    state[1] = read_latest_quietly(s.root);
    state[2] = fs::exists(s.tmp, ec) ? 1 : 0;
  }
  mpi_broadcast(state, 3, MPI_LONG_LONG, 0, s.comm, "the failed save's rollback");
  const std::int64_t step = s.info.step;
  std::string after;
  if (state[0] >= 0 && state[1] == state[0])
    after = "; the previous checkpoint is intact: 'latest' still names step " + std::to_string(state[0]);
  else if (state[0] < 0 && state[1] < 0)
    after = "; no checkpoint was written before this one";
  else if (state[1] == step)
    after = "; the save could not be undone, but it was complete: 'latest' names step " + std::to_string(step);
  else
    after = "; check what 'latest' in '" + s.root.string() + "' names";
  if (state[2]) after += " (the partial folder '" + s.tmp.string() + "' could not be removed: delete it)";
  throw Error("saving checkpoint step " + std::to_string(step) + " to '" + s.root.string() + "' failed in " + e.what() +
              after);
}

// After the commit: the replaced step and the old marker go, and all but the
// newest `keep` checkpoints. A failure here leaves the new checkpoint valid.
void prune_folder(Save& s, int keep, PruneMode mode) {
  const auto t0 = Clock::now();
  agree_on_errors(s.comm, [&] {
    if (s.rank != 0) return;
    try {
      std::error_code ec;
      fs::remove_all(s.root / old_dirname(s.info.step), ec);
      fs::remove(s.root / marker_prev_name(), ec);
      prune(s.root, s.info.step, keep, mode);
    } catch (const std::exception& e) {
      throw Error("checkpoint step " + std::to_string(s.info.step) + " was saved, but removing old checkpoints in '" +
                  s.root.string() + "' failed: " + e.what());
    }
  });
  s.times.prune = seconds_since(t0);
}

// Each phase's time, the slowest rank's: what the save waited for.
SaveTimes slowest_times(MPI_Comm comm, SaveTimes times) {
  double* fields[] = {&times.create,   &times.write,  &times.digest, &times.flush,
                      &times.metadata, &times.commit, &times.prune,  &times.total};
  constexpr int kFields = sizeof fields / sizeof fields[0];
  double values[kFields];
  for (int i = 0; i < kFields; ++i) values[i] = *fields[i];
  mpi_all_reduce(MPI_IN_PLACE, values, kFields, MPI_DOUBLE, MPI_MAX, comm, "the save's phase times");
  for (int i = 0; i < kFields; ++i) *fields[i] = values[i];
  return times;
}

// What every save does first: the arguments checked, the tensor order agreed,
// what `latest` names now noted (rank 0: to put back, and to name, if the
// save fails), and the file laid out (create).
void prepare(Save& s, const std::vector<TensorSlab>& tensors, int keep) {
  check_arguments(s.comm, s.root.string(), s.info, keep);
  s.order = agreed_order(s.comm, tensors, info_hash(s.info, keep), false);
  if (s.rank == 0) s.rollback.previous = read_latest_quietly(s.root);
  try {
    create_file(s);
  } catch (const Error& e) {
    roll_back(s, e);
  }
}

// rename and latest: the commit.
void commit(Save& s) {
  const auto t_commit = Clock::now();
  rename_folder(s);
  write_latest(s);
  s.times.commit = seconds_since(t_commit);
}

// After the commit (or its rollback): old checkpoints pruned, the times.
void conclude(Save& s, int keep, Clock::time_point t_start, PruneMode mode = PruneMode::remove) {
  prune_folder(s, keep, mode);
  s.times.total = seconds_since(t_start);
  if (s.options.times) *s.options.times = slowest_times(s.comm, s.times);
}

}  // namespace

void save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info,
                     const std::vector<TensorSlab>& tensors, int keep, const SaveOptions& options) {
  const auto t_start = Clock::now();
  Save s(comm, root_dir, info, options);
  prepare(s, tensors, keep);
  try {
    write_slabs(s);
    close_file(s);
    commit(s);
  } catch (const Error& e) {
    roll_back(s, e);
  }
  conclude(s, keep, t_start);
}

// ---------------------------------------------------------------- async

struct AsyncSave::State {
  State(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info, const SaveOptions& options, int keep_)
      : save(comm, root_dir, info, options), keep(keep_) {}
  Save save;
  int keep;
  Clock::time_point start = Clock::now();
  std::thread writer;
  std::atomic<bool> written{false};  // the writer is done (successfully or not)
  std::string error;                 // the writer's failure, read after it is joined
  bool finished = false;
  // After the commit, rank 0: removes the checkpoints the prune set aside.
  std::thread remover;
  std::string remover_error;
};

AsyncSave::AsyncSave(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info,
                     const std::vector<TensorSlab>& tensors, int keep, const SaveOptions& options)
    : s_(std::make_unique<State>(comm, root_dir, info, options, keep)) {
  prepare(s_->save, tensors, keep);
  State* st = s_.get();
  // The background thread: rank-local work only (pwrite, sync_file_range,
  // fsync, the digests), never MPI; its outcome is agreed in finish().
  st->writer = std::thread([st] {
    Save& s = st->save;
    SavePhase phase = SavePhase::write;
    try {
      const auto t0 = Clock::now();
      if (s.options.hook) s.options.hook(phase, s.info.step, s.file);
      write_blocks(s, true);
      s.times.write = seconds_since(t0);
      phase = SavePhase::close;
      flush_blocks(s);
    } catch (const std::exception& e) {
      st->error = std::string("phase '") + name_of(phase) + "' on rank " + std::to_string(s.rank) + ": " + e.what();
    }
    st->written.store(true);
  });
}

AsyncSave::~AsyncSave() {
  // Not finished (an error elsewhere ends the run): the data may still be
  // being written; wait for it, commit nothing. The temporary folder is
  // debris the next writer of the folder removes.
  if (!s_) return;
  if (s_->writer.joinable()) s_->writer.join();
  if (s_->remover.joinable()) s_->remover.join();
  if (!s_->remover_error.empty())
    std::fprintf(stderr, "ndmini: warning: removing old checkpoints after saving step %lld: %s; delete them\n",
                 static_cast<long long>(s_->save.info.step), s_->remover_error.c_str());
}

std::int64_t AsyncSave::step() const { return s_->save.info.step; }

bool AsyncSave::written_everywhere() {
  int written = s_->written.load() ? 1 : 0;
  mpi_all_reduce(MPI_IN_PLACE, &written, 1, MPI_INT, MPI_MIN, s_->save.comm, "the async save's progress");
  return written == 1;
}

double AsyncSave::finish() {
  require(!s_->finished, "AsyncSave::finish called twice");
  s_->finished = true;
  Save& s = s_->save;
  const auto t0 = Clock::now();
  s_->writer.join();
  const double waited = seconds_since(t0);
  try {
    agree(s.comm, s_->error);
    sum_digests(s);
    run_phase(s, SavePhase::close, nullptr, [&] { write_metadata(s); });
    commit(s);
  } catch (const Error& e) {
    roll_back(s, e);
  }
  // The dropped checkpoints are renamed aside here and removed by a thread
  // of rank 0 while training goes on: freeing a checkpoint's blocks takes
  // about as long as copying the state (the destructor waits for it).
  conclude(s, s_->keep, s_->start, PruneMode::set_aside);
  if (s.rank == 0) {
    State* st = s_.get();
    st->remover = std::thread([st] { st->remover_error = remove_set_aside(st->save.root); });
  }
  return waited;
}

}  // namespace ndmini::io
