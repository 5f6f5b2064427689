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
#include <exception>
#include <filesystem>
#include <memory>
#include <system_error>

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

}  // namespace

void save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info,
                     const std::vector<TensorSlab>& tensors, int keep, const SaveOptions& options) {
  const auto t_start = Clock::now();
  const int rank = comm_rank(comm);
  agree_on_errors(comm, [&] {
    require(!root_dir.empty(), "checkpoint.dir is empty; set it to a folder");
    require(info.step >= 0, "checkpoint step " + std::to_string(info.step) + " is negative");
    require(keep >= 1, "checkpoint.keep = " + std::to_string(keep) + " must be at least 1");
  });
  const auto order = agreed_order(comm, tensors, info_hash(info, keep), false);

  const fs::path root(root_dir);
  const fs::path tmp = root / tmp_dirname(info.step);
  const std::string file = (tmp / kFileName).string();
  SaveTimes times;
  Rollback rollback{root, info.step};
  // What `latest` names now (rank 0): to put back, and to name, if the save fails.
  if (rank == 0) rollback.previous = read_latest_quietly(root);

  // One phase: its rank-local work (after the fault hook) on every rank, then
  // the agreement. A failure is named by phase and rank.
  auto phase = [&](SavePhase p, double* seconds, const std::function<void()>& body) {
    const auto t0 = Clock::now();
    agree_on_errors(comm, [&] {
      try {
        if (options.hook) options.hook(p, info.step, file);
        body();
      } catch (const std::exception& e) {
        throw Error(std::string("phase '") + name_of(p) + "' on rank " + std::to_string(rank) + ": " + e.what());
      }
    });
    if (seconds) *seconds += seconds_since(t0);
  };

  try {
    // create
    std::vector<format::TensorEntry> entries(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) entries[i] = {order[i].path, order[i].shape, 0, 0};
    std::unique_ptr<format::FileBuilder> builder;  // rank 0: the HDF5 metadata, in memory until complete
    phase(SavePhase::create, &times.create, [&] {
      if (rank != 0) return;
      fs::create_directories(root);
      read_latest(root);    // a damaged marker stops the save here, not after it
      fs::remove_all(tmp);  // left by a save that died
      std::uint64_t data_bytes = 0;
      for (const auto& e : entries) data_bytes += e.bytes();
      require_free_space(root, needed_bytes(data_bytes, entries.size()),
                         "to save checkpoint step " + std::to_string(info.step));
      fs::create_directory(tmp);
      builder = std::make_unique<format::FileBuilder>(info, entries);
      builder->create_target(file);
    });
    {
      std::vector<std::uint64_t> offsets(entries.size());
      for (std::size_t i = 0; i < entries.size(); ++i) offsets[i] = entries[i].offset;
      mpi_broadcast(offsets.data(), static_cast<int>(offsets.size()), MPI_UINT64_T, 0, comm, "the datasets' offsets");
      for (std::size_t i = 0; i < entries.size(); ++i) entries[i].offset = offsets[i];
    }

    // write: data into the page cache, writeback started, digests meanwhile
    std::unique_ptr<RawFile> raw;
    std::vector<std::uint64_t> digests(order.size(), 0);
    double digest_seconds = 0;
    phase(SavePhase::write, &times.write, [&] {
      const bool writes = std::any_of(order.begin(), order.end(), [](const Tensor& t) { return !t.runs.empty(); });
      if (!writes) return;
      raw = std::make_unique<RawFile>(file, true);
      for (std::size_t i = 0; i < order.size(); ++i) {
        const Tensor& t = order[i];
        for (const Run& r : t.runs) raw->write(entries[i].offset + 4 * r.start, r.data, 4 * r.length);
        const auto span = byte_span(t, entries[i].offset);
        raw->start_writeback(span.first, span.second - span.first);
        const auto t0 = Clock::now();
        for (const TensorSlab* b : t.owned) digests[i] += block_digest(*b);
        digest_seconds += seconds_since(t0);
      }
    });
    times.digest = digest_seconds;
    const auto sums = summed_digests(comm, digests);
    for (std::size_t i = 0; i < entries.size(); ++i) entries[i].digest = sums[i];

    // close: every rank's data durable; rank 0 completes the metadata
    phase(SavePhase::close, nullptr, [&] {
      const auto t0 = Clock::now();
      if (raw) raw->close(true);
      raw.reset();
      times.flush = seconds_since(t0);
      if (rank != 0) return;
      const auto t1 = Clock::now();
      builder->finish(entries, file);
      builder.reset();
      format::write_manifest(tmp.string(), entries);
      times.metadata = seconds_since(t1);
    });

    // rename: the commit
    const auto t_commit = Clock::now();
    phase(SavePhase::rename, nullptr, [&] {
      if (rank != 0) return;
      format::sync_path(tmp.string(), true);
      const fs::path final_dir = root / checkpoint_dirname(info.step);
      // Saving a step that already exists (a run resumed from an earlier
      // step): rename() cannot replace a non-empty folder, so move it aside.
      fs::remove_all(root / old_dirname(info.step));
      if (fs::exists(final_dir)) {
        fs::rename(final_dir, root / old_dirname(info.step));
        rollback.replaced = true;
      }
      fs::rename(tmp, final_dir);
      rollback.renamed = true;
      format::sync_path(root.string(), true);
    });

    // latest
    phase(SavePhase::latest, nullptr, [&] {
      if (rank != 0) return;
      const fs::path marker_tmp = root / marker_tmp_name(), marker_prev = root / marker_prev_name();
      format::write_synced(marker_tmp.string(), std::to_string(info.step) + "\n");
      // The old marker stays reachable (a hard link) until the save is
      // agreed, so undoing is a rename, which needs no free space.
      fs::remove(marker_prev);
      std::error_code no_link;
      if (rollback.previous >= 0) fs::create_hard_link(root / kLatestName, marker_prev, no_link);
      rollback.prev_linked = rollback.previous >= 0 && !no_link;
      fs::rename(marker_tmp, root / kLatestName);
      rollback.latest_written = true;
      format::sync_path(root.string(), true);
    });
    times.commit = seconds_since(t_commit);
  } catch (const Error& e) {
    // Every rank is here (errors are agreed). Rank 0 undoes what the save did.
    long long state[3] = {rollback.previous, -1, 0};  // previous, latest now, debris left
    if (rank == 0) {
      rollback.undo();
      std::error_code ec;
      state[1] = read_latest_quietly(root);
      state[2] = fs::exists(tmp, ec) ? 1 : 0;
    }
    mpi_broadcast(state, 3, MPI_LONG_LONG, 0, comm, "the failed save's rollback");
    std::string after;
    if (state[0] >= 0 && state[1] == state[0])
      after = "; the previous checkpoint is intact: 'latest' still names step " + std::to_string(state[0]);
    else if (state[0] < 0 && state[1] < 0)
      after = "; no checkpoint was written before this one";
    else if (state[1] == info.step)
      after = "; the save could not be undone, but it was complete: 'latest' names step " + std::to_string(info.step);
    else
      after = "; check what 'latest' in '" + root.string() + "' names";
    if (state[2]) after += " (the partial folder '" + tmp.string() + "' could not be removed: delete it)";
    throw Error("saving checkpoint step " + std::to_string(info.step) + " to '" + root.string() + "' failed in " +
                e.what() + after);
  }

  const auto t_prune = Clock::now();
  agree_on_errors(comm, [&] {
    if (rank != 0) return;
    try {
      std::error_code ec;
      fs::remove_all(root / old_dirname(info.step), ec);
      fs::remove(root / marker_prev_name(), ec);
      prune(root, info.step, keep);
    } catch (const std::exception& e) {
      throw Error("checkpoint step " + std::to_string(info.step) + " was saved, but removing old checkpoints in '" +
                  root.string() + "' failed: " + e.what());
    }
  });
  times.prune = seconds_since(t_prune);
  times.total = seconds_since(t_start);
  if (options.times) {
    double* fields[] = {&times.create,   &times.write,  &times.digest, &times.flush,
                        &times.metadata, &times.commit, &times.prune,  &times.total};
    constexpr int kFields = sizeof fields / sizeof fields[0];
    double values[kFields];
    for (int i = 0; i < kFields; ++i) values[i] = *fields[i];
    mpi_all_reduce(MPI_IN_PLACE, values, kFields, MPI_DOUBLE, MPI_MAX, comm, "the save's phase times");
    for (int i = 0; i < kFields; ++i) *fields[i] = values[i];
    *options.times = times;
  }
}

}  // namespace ndmini::io
