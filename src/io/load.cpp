// SPDX-License-Identifier: BSD-3-Clause
// Parallel sharded checkpoints: the load protocol.
//
// Load: rank 0 verifies the manifest and reads the index (io/format), every
// rank reads its blocks (replicas included) at the indexed offsets, in
// pieces on two threads, and the digests of the owned blocks, summed over
// the ranks, are compared.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

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
using format::kResumeHint;
using format::shape_text;

// How far a load asks the kernel to read ahead of its reads.
constexpr std::uint64_t kReadAheadBytes = std::uint64_t{256} << 20;
// A load reads in pieces of at most this size, shared out over kLoadThreads
// threads of the rank: two reads in flight keep a (virtual) disk busier than
// one, and the copies out of the page cache and the digests run on two cores.
// Measured here on one rank (gpt2-124m, cold cache): reading the 1.5 GB into
// place took 1.6-2.7 s with one thread, 1.2-1.4 s with two.
constexpr std::uint64_t kReadPieceBytes = std::uint64_t{16} << 20;
constexpr int kLoadThreads = 2;

// Packs the index for the broadcast from rank 0.
class Packer {
 public:
  void u64(std::uint64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    bytes_ += s;
  }
  void field(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void field(std::uint64_t v) { u64(v); }
  void field(const std::string& s) { str(s); }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

class Unpacker {
 public:
  explicit Unpacker(const std::string& bytes) : bytes_(bytes) {}
  std::uint64_t u64() {
    std::uint64_t v = 0;
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string str() {
    const std::size_t n = static_cast<std::size_t>(u64());
    std::string s = bytes_.substr(at_, n);
    at_ += n;
    return s;
  }

  void field(std::int64_t& v) { v = static_cast<std::int64_t>(u64()); }
  void field(std::uint64_t& v) { v = u64(); }
  void field(std::string& s) { s = str(); }

 private:
  const std::string& bytes_;
  std::size_t at_ = 0;
};

void broadcast(MPI_Comm comm, std::string& bytes) {
  unsigned long long n = bytes.size();
  mpi_broadcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, comm, "a checkpoint text's length");
  bytes.resize(static_cast<std::size_t>(n));
  for (std::size_t at = 0; at < bytes.size(); at += kMaxIoBytes) {
    const int part = static_cast<int>(std::min<std::uint64_t>(bytes.size() - at, kMaxIoBytes));
    mpi_broadcast(bytes.data() + at, part, MPI_CHAR, 0, comm, "a checkpoint text");
  }
}

}  // namespace

CheckpointInfo load_checkpoint(MPI_Comm comm, const std::string& root_dir, std::optional<std::int64_t> step,
                               const std::vector<TensorSlab>& tensors, double* seconds) {
  const auto t_start = Clock::now();
  const int rank = comm_rank(comm);
  const fs::path root(root_dir);
  const std::string fix = "train with checkpoint.every > 0 first or drop --resume";

  // Which checkpoint, is it intact, what does it hold: rank 0 decides, before
  // HDF5 parses anything, and tells the others.
  std::string packed;
  agree_on_errors(comm, [&] {
    if (rank != 0) return;
    require(fs::is_directory(root), "no checkpoint in '" + root.string() + "' (the folder does not exist); " + fix);
    std::int64_t chosen = 0;
    if (step) {
      chosen = *step;
    } else {
      const auto latest = read_latest(root);
      if (!latest) {
        const auto steps = committed_steps(root);
        if (!steps.empty())
          throw Error("no 'latest' marker in '" + root.string() + "', but it holds checkpoints of steps " +
                      steps_text(steps) + " (the marker was deleted or never written); resume one explicitly, " +
                      "e.g. --resume " + std::to_string(steps.back()));
        throw Error("no checkpoint in '" + root.string() + "' (no 'latest' marker and no step_* folders); " + fix);
      }
      chosen = *latest;
    }
    const fs::path dir = root / checkpoint_dirname(chosen);
    if (!fs::is_directory(dir)) {
      if (!step)
        throw Error("the 'latest' marker in '" + root.string() + "' names step " + std::to_string(chosen) + ", but '" +
                    dir.string() + "' does not exist; resume from an existing step with --resume STEP (available: " +
                    available_text(root) + ")");
      throw Error("no checkpoint for step " + std::to_string(chosen) + " in '" + root.string() + "': '" + dir.string() +
                  "' does not exist; pick one of the available steps (" + available_text(root) +
                  ") with --resume STEP");
    }
    const format::Index index = format::read_index(dir.string());
    Packer p;
    p.str(dir.string());
    for_each_field(index.info, [&](const char*, const auto& value) { p.field(value); });
    p.u64(index.tensors.size());
    for (const auto& t : index.tensors) {
      p.str(t.path);
      p.u64(t.shape.size());
      for (auto d : t.shape) p.u64(d);
      p.u64(t.offset);
      p.u64(t.digest);
    }
    packed = std::move(p.bytes());
  });
  broadcast(comm, packed);
  Unpacker u(packed);
  const std::string dir = u.str();
  CheckpointInfo info;
  for_each_field(info, [&](const char*, auto& value) { u.field(value); });
  std::map<std::string, format::TensorEntry> index;
  for (std::uint64_t n = u.u64(); n > 0; --n) {
    format::TensorEntry t;
    t.path = u.str();
    t.shape.resize(static_cast<std::size_t>(u.u64()));
    for (auto& d : t.shape) d = u.u64();
    t.offset = u.u64();
    t.digest = u.u64();
    index[t.path] = std::move(t);
  }

  const auto order = agreed_order(comm, tensors, 0, true);
  const std::string file = dir + "/" + kFileName;
  const std::string where = "checkpoint '" + file + "'";
  std::vector<const format::TensorEntry*> entries(order.size());
  agree_on_errors(comm, [&] {
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Tensor& t = order[i];
      const auto it = index.find(t.path);
      require(it != index.end(), where + " has no tensor '" + t.name +
                                     "'; it was written for a different model (compare the deck with the "
                                     "checkpoint's config attribute)");
      require(it->second.shape == t.shape, where + ": tensor '" + t.name + "' has shape " +
                                               shape_text(it->second.shape) + ", the model expects " +
                                               shape_text(t.shape) +
                                               "; the checkpoint was written for a different model (compare the "
                                               "deck with the checkpoint's config attribute)");
      entries[i] = &it->second;
    }
  });

  std::vector<std::uint64_t> digests(order.size(), 0);
  agree_on_errors(comm, [&] {
    const bool reads = std::any_of(order.begin(), order.end(), [](const Tensor& t) { return !t.runs.empty(); });
    if (!reads) return;
    RawFile raw(file, false);
    // Every run in pieces of at most kReadPieceBytes, in file order.
    struct Piece {
      std::uint64_t offset, bytes;
      char* data;
      std::size_t tensor;
    };
    std::vector<Piece> pieces;
    for (std::size_t i = 0; i < order.size(); ++i)
      for (const Run& r : order[i].runs)
        for (std::uint64_t at = 0; at < 4 * r.length; at += kReadPieceBytes)
          pieces.push_back({entries[i]->offset + 4 * r.start + at, std::min(kReadPieceBytes, 4 * r.length - at),
                            reinterpret_cast<char*>(r.data) + at, i});
    // The kernel reads ahead, tensor span by tensor span, up to
    // kReadAheadBytes of spans beyond the tensor being read.
    std::vector<std::uint64_t> span_start(order.size() + 1, 0);
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto span = byte_span(order[i], entries[i]->offset);
      span_start[i + 1] = span_start[i] + (span.second - span.first);
    }
    std::mutex hint_mutex;
    std::size_t hinted = 0;
    auto read_ahead_of = [&](std::size_t tensor) {
      const std::lock_guard<std::mutex> lock(hint_mutex);
      for (; hinted < order.size() && span_start[hinted] < span_start[tensor] + kReadAheadBytes; ++hinted) {
        const auto span = byte_span(order[hinted], entries[hinted]->offset);
        raw.prefetch(span.first, span.second - span.first);
      }
    };
    share_out(pieces.size(), kLoadThreads, [&](std::size_t k) {
      read_ahead_of(pieces[k].tensor);
      raw.read(pieces[k].offset, pieces[k].data, pieces[k].bytes);
    });
    share_out(order.size(), kLoadThreads, [&](std::size_t i) {
      for (const TensorSlab* b : order[i].owned) digests[i] += block_digest(*b);
    });
    raw.close(false);
  });
  // Replicas are read but not summed: the owned blocks cover each tensor once.
  const auto sums = summed_digests(comm, digests);
  for (std::size_t i = 0; i < order.size(); ++i)
    if (sums[i] != entries[i]->digest)
      throw Error(where + " is corrupted: tensor '" + order[i].name + "' does not match its digest (read " +
                  hex64(sums[i]) + ", saved " + hex64(entries[i]->digest) + "); " + kResumeHint);
  if (seconds) {
    *seconds = seconds_since(t_start);
    mpi_all_reduce(MPI_IN_PLACE, seconds, 1, MPI_DOUBLE, MPI_MAX, comm, "the load time");
  }
  return info;
}

}  // namespace ndmini::io
