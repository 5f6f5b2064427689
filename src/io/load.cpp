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

// The index as every rank holds it after rank 0 has read it.
struct SharedIndex {
  std::string dir;  // the checkpoint's folder
  CheckpointInfo info;
  std::map<std::string, format::TensorEntry> tensors;  // by path
};

// Rank 0: which folder to load, `step` or the one `latest` names; an error
// names what exists instead.
fs::path chosen_folder(const fs::path& root, std::optional<std::int64_t> step) {
  const std::string fix = "train with checkpoint.every > 0 first or drop --resume";
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
                "' does not exist; pick one of the available steps (" + available_text(root) + ") with --resume STEP");
  }
  return dir;
}

// Rank 0: the folder and its verified index, as bytes for the broadcast.
std::string packed_index(const fs::path& dir) {
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
  return std::move(p.bytes());
}

SharedIndex unpacked_index(const std::string& packed) {
  Unpacker u(packed);
  SharedIndex index;
  index.dir = u.str();
  for_each_field(index.info, [&](const char*, auto& value) { u.field(value); });
  for (std::uint64_t n = u.u64(); n > 0; --n) {
    format::TensorEntry t;
    t.path = u.str();
    t.shape.resize(static_cast<std::size_t>(u.u64()));
    for (auto& d : t.shape) d = u.u64();
    t.offset = u.u64();
    t.digest = u.u64();
    index.tensors[t.path] = std::move(t);
  }
  return index;
}

// Which checkpoint, is it intact, what does it hold: rank 0 decides, before
// HDF5 parses anything, and tells the others.
SharedIndex shared_index(MPI_Comm comm, int rank, const fs::path& root, std::optional<std::int64_t> step) {
  std::string packed;
  agree_on_errors(comm, [&] {
    if (rank != 0) return;
    packed = packed_index(chosen_folder(root, step));
  });
  broadcast(comm, packed);
  return unpacked_index(packed);
}

// Each tensor of the model in the index, with the same shape: a checkpoint of
// another model fails here, on every rank, before anything is read.
std::vector<const format::TensorEntry*> matched_entries(MPI_Comm comm, const std::vector<Tensor>& order,
                                                        const SharedIndex& index, const std::string& where) {
  std::vector<const format::TensorEntry*> entries(order.size());
  agree_on_errors(comm, [&] {
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Tensor& t = order[i];
      const auto it = index.tensors.find(t.path);
      require(it != index.tensors.end(), where + " has no tensor '" + t.name +
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
  return entries;
}

// A read of at most kReadPieceBytes into one tensor's run.
struct Piece {
  std::uint64_t offset, bytes;
  char* data;
  std::size_t tensor;
};

// Every run in pieces of at most kReadPieceBytes, in file order, so that the
// threads share out even work.
std::vector<Piece> read_pieces(const std::vector<Tensor>& order,
                               const std::vector<const format::TensorEntry*>& entries) {
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const Run& r : order[i].runs)
      for (std::uint64_t at = 0; at < 4 * r.length; at += kReadPieceBytes)
        pieces.push_back({entries[i]->offset + 4 * r.start + at, std::min(kReadPieceBytes, 4 * r.length - at),
                          reinterpret_cast<char*>(r.data) + at, i});
  return pieces;
}

// Every rank reads its blocks (replicas included) on kLoadThreads threads,
// the kernel reading ahead, and returns its owned blocks' digests.
std::vector<std::uint64_t> read_slabs(MPI_Comm comm, const std::vector<Tensor>& order,
                                      const std::vector<const format::TensorEntry*>& entries, const std::string& file) {
  std::vector<std::uint64_t> digests(order.size(), 0);
  agree_on_errors(comm, [&] {
    const bool reads = std::any_of(order.begin(), order.end(), [](const Tensor& t) { return !t.runs.empty(); });
    if (!reads) return;
    RawFile raw(file, false);
    const std::vector<Piece> pieces = read_pieces(order, entries);
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
  return digests;
}

// The digests of the owned blocks, summed over the ranks, against the saved
// ones: a corrupted file fails on every rank. Replicas are read but not
// summed: the owned blocks cover each tensor once.
void check_digests(MPI_Comm comm, const std::vector<Tensor>& order,
                   const std::vector<const format::TensorEntry*>& entries, const std::vector<std::uint64_t>& digests,
                   const std::string& where) {
  const auto sums = summed_digests(comm, digests);
  for (std::size_t i = 0; i < order.size(); ++i)
    if (sums[i] != entries[i]->digest)
      throw Error(where + " is corrupted: tensor '" + order[i].name + "' does not match its digest (read " +
                  hex64(sums[i]) + ", saved " + hex64(entries[i]->digest) + "); " + kResumeHint);
}

}  // namespace

CheckpointInfo load_checkpoint(MPI_Comm comm, const std::string& root_dir, std::optional<std::int64_t> step,
                               const std::vector<TensorSlab>& tensors, double* seconds) {
  const auto t_start = Clock::now();
  const SharedIndex index = shared_index(comm, comm_rank(comm), fs::path(root_dir), step);
  const auto order = agreed_order(comm, tensors, 0, true);
  const std::string file = index.dir + "/" + kFileName;
  const std::string where = "checkpoint '" + file + "'";
  const auto entries = matched_entries(comm, order, index, where);
  const auto digests = read_slabs(comm, order, entries, file);
  check_digests(comm, order, entries, digests, where);
  if (seconds) {
    *seconds = seconds_since(t_start);
    mpi_all_reduce(MPI_IN_PLACE, seconds, 1, MPI_DOUBLE, MPI_MAX, comm, "the load time");
  }
  return index.info;
}

}  // namespace ndmini::io
