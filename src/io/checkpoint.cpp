// SPDX-License-Identifier: BSD-3-Clause
// Parallel sharded checkpoints: the collective protocol.
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
//
// Load: rank 0 verifies the manifest and reads the index (io/format), every
// rank reads its blocks (replicas included) at the indexed offsets, in
// pieces on two threads, and the digests of the owned blocks, summed over
// the ranks, are compared.
#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"
#include "core/regular_file.hpp"
#include "core/timer.hpp"
#include "io/digest.hpp"
#include "io/format.hpp"

namespace ndmini::io {
namespace {

namespace fs = std::filesystem;
using format::kFileName;
using format::kResumeHint;

constexpr const char* kLatestName = "latest";
// The marker holds one step number (parse_step takes at most 18 digits) and a
// newline: 64 bytes leave room for stray whitespace, nothing more.
constexpr std::uint64_t kLatestMaxBytes = 64;
// One MPI-IO write or pread moves at most this many bytes (MPI's count is an int).
constexpr std::uint64_t kMaxIoBytes = std::uint64_t{1} << 30;
// How far a load asks the kernel to read ahead of its reads.
constexpr std::uint64_t kReadAheadBytes = std::uint64_t{256} << 20;
// A load reads in pieces of at most this size, shared out over kLoadThreads
// threads of the rank: two reads in flight keep a (virtual) disk busier than
// one, and the copies out of the page cache and the digests run on two cores.
// Measured here on one rank (gpt2-124m, cold cache): reading the 1.5 GB into
// place took 1.6-2.7 s with one thread, 1.2-1.4 s with two.
constexpr std::uint64_t kReadPieceBytes = std::uint64_t{16} << 20;
constexpr int kLoadThreads = 2;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

std::uint64_t product(const std::vector<std::uint64_t>& dims) {
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

// A block holds nothing when its count is empty or has a zero extent.
bool is_empty(const TensorSlab& t) { return t.count.empty() || product(t.count) == 0; }

// Calls f(global linear index of the row's first element, row number in the
// block) for each row of a non-empty block (a run along the last dimension,
// contiguous in the file and in memory), in the block's row-major order.
template <class F>
void for_each_row(const TensorSlab& t, F&& f) {
  const std::size_t rank = t.global_shape.size();
  std::vector<std::uint64_t> stride(rank, 1);
  for (std::size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * t.global_shape[d];
  const std::uint64_t rows = product(t.count) / t.count[rank - 1];
  std::vector<std::uint64_t> pos(rank, 0);  // position inside the block, last dim excluded
  for (std::uint64_t r = 0; r < rows; ++r) {
    std::uint64_t start = 0;
    for (std::size_t d = 0; d < rank; ++d) start += (t.offset[d] + pos[d]) * stride[d];
    f(start, r);
    for (std::size_t d = rank - 1; d-- > 0;) {  // odometer over the outer dims
      if (++pos[d] < t.count[d]) break;
      pos[d] = 0;
    }
  }
}

// The layout-free digest of one block (io::element_digest row by row).
std::uint64_t block_digest(const TensorSlab& t) {
  if (is_empty(t)) return 0;
  const std::uint64_t row = t.count.back();
  std::uint64_t sum = 0;
  for_each_row(t, [&](std::uint64_t start, std::uint64_t r) { sum += element_digest(t.data + r * row, row, start); });
  return sum;
}

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

std::string dataset_path(const std::string& name) { return name.front() == '/' ? name : "/" + name; }

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

// ------------------------------------------------------------ validation

// Checks one entry of the caller's list on its own.
void validate_slab(const TensorSlab& t) {
  const std::string tag = "checkpoint tensor '" + t.name + "'";
  require(!t.name.empty() && t.name != "/" && t.name.back() != '/' && t.name.find("//") == std::string::npos &&
              t.name.find_first_of(" \t\r\n") == std::string::npos,
          "checkpoint tensor name '" + t.name + "' is not a dataset path like 'model/h/0/attn/c_attn/weight'");
  require(!t.global_shape.empty(), tag + " has no dimensions; store a scalar as shape [1]");
  for (auto d : t.global_shape) require(d > 0, tag + " has an empty dimension in " + shape_text(t.global_shape));
  require(product(t.global_shape) < (std::uint64_t{1} << 60), tag + " is too large");
  if (is_empty(t)) return;
  require(t.offset.size() == t.global_shape.size() && t.count.size() == t.global_shape.size(),
          tag + ": offset and count need " + std::to_string(t.global_shape.size()) + " entries");
  for (std::size_t d = 0; d < t.global_shape.size(); ++d)
    require(t.offset[d] + t.count[d] <= t.global_shape[d], tag + ": block at " + shape_text(t.offset) + " of " +
                                                               shape_text(t.count) + " exceeds shape " +
                                                               shape_text(t.global_shape));
  require(t.data != nullptr, tag + ": data is null for a non-empty block");
}

// The rows of the moved blocks sorted by file position, rows that continue
// each other in the file and in memory merged into one run (a flat FSDP shard
// is one run; a column split is one run per row). Overlapping blocks are refused.
std::vector<Run> file_order_runs(const Tensor& t) {
  std::vector<Run> runs;
  for (const TensorSlab* b : t.moved) {
    const std::uint64_t row = b->count.back();
    for_each_row(*b, [&](std::uint64_t start, std::uint64_t r) { runs.push_back({start, row, b->data + r * row}); });
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
  std::vector<Run> merged;
  for (const Run& r : runs) {
    if (!merged.empty()) {
      Run& last = merged.back();
      require(last.start + last.length <= r.start,
              "checkpoint tensor '" + t.name + "': two blocks of one rank overlap (at flat element " +
                  std::to_string(r.start) + "); a rank must list each element at most once");
      if (last.start + last.length == r.start && last.data + last.length == r.data) {
        last.length += r.length;
        continue;
      }
    }
    merged.push_back(r);
  }
  return merged;
}

// Groups the entries by dataset, sorted by path, so that every rank handles
// the datasets once each, in one order, however many blocks it holds.
// Replica blocks are transferred only when loading.
std::vector<Tensor> group_blocks(const std::vector<TensorSlab>& slabs, bool loading) {
  std::map<std::string, Tensor> by_path;
  for (const TensorSlab& s : slabs) {
    validate_slab(s);
    const std::string path = dataset_path(s.name);
    Tensor& t = by_path[path];
    if (t.name.empty()) {
      t.name = s.name;
      t.path = path;
      t.shape = s.global_shape;
    }
    require(s.global_shape == t.shape, "checkpoint tensor '" + s.name + "' is listed with shapes " +
                                           shape_text(t.shape) + " and " + shape_text(s.global_shape) +
                                           "; all its blocks must name the global shape");
    if (is_empty(s)) continue;
    if (!s.replica) t.owned.push_back(&s);
    if (!s.replica || loading) t.moved.push_back(&s);
  }
  std::vector<Tensor> order;
  order.reserve(by_path.size());
  for (auto& entry : by_path) {
    Tensor& t = entry.second;
    t.runs = file_order_runs(t);
    order.push_back(std::move(t));
  }
  return order;
}

// Over the set of distinct tensors (paths and shapes), not the blocks: ranks
// hold different numbers of blocks of a tensor.
std::uint64_t fingerprint(const std::vector<Tensor>& order) {
  StreamHash h;
  for (const Tensor& t : order) {
    h.update(t.path.c_str(), t.path.size() + 1);  // with the NUL, so "ab"+"c" differs from "a"+"bc"
    for (auto d : t.shape) h.update(&d, sizeof d);
    const std::uint64_t end = ~std::uint64_t{0};
    h.update(&end, sizeof end);
  }
  return h.finish();
}

// Validation and the checks that need every rank: the same set of tensors
// (and `extra`, e.g. the checkpoint info), and owned blocks that together
// cover each tensor once.
std::vector<Tensor> agreed_order(MPI_Comm comm, const std::vector<TensorSlab>& tensors, std::uint64_t extra,
                                 bool loading) {
  std::vector<Tensor> order;
  agree_on_errors(comm, [&] { order = group_blocks(tensors, loading); });
  const std::uint64_t mine = splitmix64(fingerprint(order) ^ extra);
  std::uint64_t lo = 0, hi = 0;
  mpi_all_reduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, comm, "the checkpoint's tensor set (min)");
  mpi_all_reduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, comm, "the checkpoint's tensor set (max)");
  require(lo == hi,
          "checkpoint: the ranks passed different tensor lists, shapes or checkpoint info; every "
          "rank must name the same tensors (with count 0 where it holds nothing)");
  std::vector<std::uint64_t> held(order.size(), 0), total(order.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const TensorSlab* b : order[i].owned) held[i] += product(b->count);
  mpi_all_reduce(held.data(), total.data(), static_cast<int>(held.size()), MPI_UINT64_T, MPI_SUM, comm,
                 "the checkpoint's block coverage");
  for (std::size_t i = 0; i < order.size(); ++i)
    require(total[i] == product(order[i].shape),
            "checkpoint: the ranks' non-replica blocks of tensor '" + order[i].name + "' hold " +
                std::to_string(total[i]) + " elements but its shape " + shape_text(order[i].shape) + " has " +
                std::to_string(product(order[i].shape)) +
                "; each element must belong to exactly one rank (mark the other copies replica)");
  return order;
}

// Each tensor's digest over the owned blocks of all ranks.
std::vector<std::uint64_t> summed_digests(MPI_Comm comm, const std::vector<std::uint64_t>& mine) {
  std::vector<std::uint64_t> sums(mine.size());
  // Wraps mod 2^64, as intended.
  mpi_all_reduce(mine.data(), sums.data(), static_cast<int>(mine.size()), MPI_UINT64_T, MPI_SUM, comm,
                 "the checkpoint's digests");
  return sums;
}

// --------------------------------------------------------------- raw data

// MPI's text for an error code, its innermost line only: ROMIO reports
// "Other I/O error , error stack:\nADIOI_GEN_WRITECONTIG(80): Other I/O error
// No space left on device", whose last part says it all.
std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(code, text, &n);
  std::string s(text, static_cast<std::size_t>(n));
  const auto line = s.find_last_of('\n');
  if (line != std::string::npos) s = s.substr(line + 1);
  const auto origin = s.find("): ");
  if (origin != std::string::npos) s = s.substr(origin + 3);
  return s;
}

// This rank's own handles on the checkpoint file: for writing, an MPI-IO
// handle (MPI_COMM_SELF); for reading and the page-cache hints (writeback,
// readahead), a plain descriptor, as pread runs from several threads at
// once where MPI-IO calls would be serialised by the library's lock. Every
// call is independent, so its errors are this rank's alone, and the phase
// agreement carries them to the others.
class RawFile {
 public:
  RawFile(const std::string& path, bool write) : path_(path) {
    if (write) {
      const int rc = MPI_File_open(MPI_COMM_SELF, path.c_str(), MPI_MODE_WRONLY, MPI_INFO_NULL, &fh_);
      if (rc != MPI_SUCCESS) {
        fh_ = MPI_FILE_NULL;
        throw Error("cannot open '" + path + "' (" + mpi_error_text(rc) + ")");
      }
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // rank 0 checked it; a FIFO cannot block
    if (fd_ < 0 && !write) throw Error("cannot open '" + path + "' (" + std::strerror(errno) + ")");
  }
  ~RawFile() {
    if (fh_ != MPI_FILE_NULL) MPI_File_close(&fh_);
    if (fd_ >= 0) ::close(fd_);
  }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;

  void write(std::uint64_t offset, const void* data, std::uint64_t bytes) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const int n = static_cast<int>(std::min(bytes, kMaxIoBytes));
      MPI_Status status;
      const int rc = MPI_File_write_at(fh_, static_cast<MPI_Offset>(offset), p, n, MPI_BYTE, &status);
      int done = 0;
      if (rc == MPI_SUCCESS) MPI_Get_count(&status, MPI_BYTE, &done);
      if (rc != MPI_SUCCESS || done != n)
        throw Error("writing '" + path_ + "' failed at byte " + std::to_string(offset) + " (" +
                    (rc != MPI_SUCCESS
                         ? mpi_error_text(rc)
                         : "short transfer: " + std::to_string(done) + " of " + std::to_string(n) + " bytes") +
                    ")");
      p += n;
      offset += static_cast<std::uint64_t>(n);
      bytes -= static_cast<std::uint64_t>(n);
    }
  }
  // Thread-safe: any number of reads may run at once.
  void read(std::uint64_t offset, void* data, std::uint64_t bytes) const {
    auto* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n =
          ::pread(fd_, p, static_cast<std::size_t>(std::min(bytes, kMaxIoBytes)), static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw Error("reading '" + path_ + "' failed at byte " + std::to_string(offset) + " (" +
                    (n < 0 ? std::string(std::strerror(errno)) : std::string("the file ends there")) + ")");
      p += n;
      offset += static_cast<std::uint64_t>(n);
      bytes -= static_cast<std::uint64_t>(n);
    }
  }

  // Starts writing [offset, offset + bytes) back to disk without waiting, so
  // the disk works while the caller computes (Linux; elsewhere a no-op).
  void start_writeback(std::uint64_t offset, std::uint64_t bytes) const {
#ifdef __linux__
    if (fd_ >= 0)
      ::sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(bytes), SYNC_FILE_RANGE_WRITE);
#else
    (void)offset, (void)bytes;
#endif
  }
  // Asks the kernel to read [offset, offset + bytes) ahead.
  void prefetch(std::uint64_t offset, std::uint64_t bytes) const {
#ifdef __linux__
    if (fd_ >= 0) ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_WILLNEED);
#else
    (void)offset, (void)bytes;
#endif
  }

  // Syncs (when it wrote) and closes the MPI-IO handle, reporting failure.
  void close(bool sync) {
    if (fh_ == MPI_FILE_NULL) return;  // opened for reading
    if (sync) {
      const int rc = MPI_File_sync(fh_);
      if (rc != MPI_SUCCESS) throw Error("cannot sync '" + path_ + "' (" + mpi_error_text(rc) + ")");
    }
    const int rc = MPI_File_close(&fh_);
    fh_ = MPI_FILE_NULL;
    if (rc != MPI_SUCCESS) throw Error("cannot close '" + path_ + "' (" + mpi_error_text(rc) + ")");
  }

 private:
  std::string path_;
  MPI_File fh_ = MPI_FILE_NULL;
  int fd_ = -1;
};

// Runs f(0) ... f(n - 1) on `threads` threads (this one among them), each
// taking the next index in turn. The first exception stops the others from
// taking more and is rethrown here once every thread is done.
template <class F>
void share_out(std::size_t n, int threads, F&& f) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (std::size_t k; !failed.load() && (k = next++) < n;) f(k);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> helpers;
  try {
    for (int t = 1; t < threads; ++t) helpers.emplace_back(work);
  } catch (const std::system_error&) {
    // No thread to be had: the threads already started (or this one alone) do it all.
  }
  work();
  for (auto& h : helpers) h.join();
  if (error) std::rethrow_exception(error);
}

// [first byte, end) of a tensor's runs in the file.
std::pair<std::uint64_t, std::uint64_t> byte_span(const Tensor& t, std::uint64_t offset) {
  if (t.runs.empty()) return {offset, offset};
  return {offset + 4 * t.runs.front().start, offset + 4 * (t.runs.back().start + t.runs.back().length)};
}

// ------------------------------------------------------------ file system

Error sys_error(const std::string& what) { return Error(what + ": " + std::strerror(errno)); }

std::string tmp_dirname(std::int64_t step) { return "." + checkpoint_dirname(step) + ".tmp"; }
std::string old_dirname(std::int64_t step) { return "." + checkpoint_dirname(step) + ".old"; }

// Parses "123" strictly (digits only, fits in int64).
std::optional<std::int64_t> parse_step(const std::string& s) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(s);
}

// Steps of the committed checkpoints (folders under their final name), ascending.
std::vector<std::int64_t> committed_steps(const fs::path& root) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto step = step_of_dirname(entry.path().filename().string());
    if (step && entry.is_directory(ec)) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string steps_text(const std::vector<std::int64_t>& steps) {
  if (steps.empty()) return "none";
  std::string s;
  for (std::size_t i = 0; i < steps.size(); ++i) s += (i ? ", " : "") + std::to_string(steps[i]);
  return s;
}

std::string available_text(const fs::path& root) { return steps_text(committed_steps(root)); }

// At most 40 characters of `text` with anything unprintable escaped, so a
// damaged marker cannot garble the terminal.
std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text.substr(0, 40)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return text.size() > 40 ? out + "..." : out;
}

// nullopt when root_dir or its marker does not exist.
std::optional<std::int64_t> read_latest(const fs::path& root) {
  try {
    return read_latest_marker(root.string(), "pick a checkpoint with --resume STEP");
  } catch (const Error& e) {
    throw Error(e.what() + std::string(" (available steps: ") + available_text(root) + ")");
  }
}

// The marker's step, -1 when missing or damaged.
std::int64_t read_latest_quietly(const fs::path& root) {
  try {
    return read_latest(root).value_or(-1);
  } catch (const Error&) {
    return -1;
  }
}

std::uint64_t free_bytes(const fs::path& dir) {
  // Test hook: pretend the file system has this many bytes free.
  if (const char* fake = std::getenv("NDMINI_CKPT_FREE_BYTES")) return std::strtoull(fake, nullptr, 10);
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) throw sys_error("cannot query free space of '" + dir.string() + "'");
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

// Sizes for messages: exact below 1 MiB, else MiB with one decimal, rounded
// up for what is needed and down for what is free (never flattering).
std::string size_text(std::uint64_t bytes, bool round_up) {
  if (bytes < kMiB) return std::to_string(bytes) + " bytes";
  const std::uint64_t tenths = (bytes * 10 + (round_up ? kMiB - 1 : 0)) / kMiB;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
}

// Room a checkpoint of `data_bytes` needs: the data, HDF5 metadata and
// alignment (4 KiB per tensor at most), the manifest.
std::uint64_t needed_bytes(std::uint64_t data_bytes, std::size_t tensors) {
  return data_bytes + 8192 * static_cast<std::uint64_t>(tensors) + kMiB;
}

void require_free_space(const fs::path& root, std::uint64_t needed, const std::string& what) {
  const std::uint64_t available = free_bytes(root);
  require(available >= needed, "not enough free space in '" + root.string() + "' " + what + ": it needs about " +
                                   size_text(needed, true) + ", " + size_text(available, false) +
                                   " are free; free some space or set checkpoint.dir to a larger file system");
}

bool is_stale_name(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const std::size_t n = std::strlen(suffix);
    return name.size() > n && name.compare(name.size() - n, n, suffix) == 0;
  };
  return name.rfind(".step_", 0) == 0 && (ends_with(".tmp") || ends_with(".old"));
}

// Folders of saves that never committed (and replaced steps never removed),
// and the marker's temporary names.
void remove_stale(const fs::path& root) {
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (is_stale_name(name) || name == std::string(kLatestName) + ".tmp" || name == std::string(kLatestName) + ".prev")
      fs::remove_all(entry.path());
  }
}

// Rank 0: keeps the step just saved and the newest keep-1 committed steps
// below it, and removes debris. Steps above the one just saved belong to a
// run this one was resumed away from; they stay.
void prune(const fs::path& root, std::int64_t step, int keep) {
  std::vector<std::int64_t> older;
  for (auto s : committed_steps(root))
    if (s < step) older.push_back(s);
  const std::size_t keep_older = static_cast<std::size_t>(keep - 1);
  if (older.size() > keep_older)
    for (std::size_t i = 0; i < older.size() - keep_older; ++i) fs::remove_all(root / checkpoint_dirname(older[i]));
  remove_stale(root);
}

// --------------------------------------------------------- the save, rank 0

std::string marker_tmp_name() { return std::string(kLatestName) + ".tmp"; }
std::string marker_prev_name() { return std::string(kLatestName) + ".prev"; }

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

// Packs the index for the broadcast from rank 0.
class Packer {
 public:
  void u64(std::uint64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    bytes_ += s;
  }
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

// Rank 0, holding the lock on `fd`: records the holder; a writer also clears
// debris and checks the room for one checkpoint.
void claim(int fd, const fs::path& root, bool write, std::uint64_t checkpoint_bytes) {
  // Who holds it, for the message of a job refused later. Best effort: a
  // full disk or a read-only lock file must not stop a run.
  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  const std::string holder =
      "host " + std::string(host) + ", pid " + std::to_string(::getpid()) + (write ? "" : ", reading") + "\n";
  if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, holder.data(), holder.size(), 0) < 0) {
    // ignored: see above
  }
  if (!write) return;
  remove_stale(root);  // the only writer now: any .tmp is debris
  if (checkpoint_bytes > 0) require_free_space(root, checkpoint_bytes + kMiB, "for one checkpoint of this model");
}

}  // namespace

const char* phase_name(SavePhase p) {
  switch (p) {
    case SavePhase::create:
      return "create";
    case SavePhase::write:
      return "write";
    case SavePhase::close:
      return "close";
    case SavePhase::rename:
      return "rename";
    case SavePhase::latest:
      return "latest";
  }
  return "?";
}

std::string checkpoint_dirname(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::optional<std::int64_t> step_of_dirname(const std::string& name) {
  if (name.rfind("step_", 0) != 0) return std::nullopt;
  return parse_step(name.substr(5));
}

std::optional<std::int64_t> read_latest_marker(const std::string& root_dir, const std::string& fix) {
  const fs::path marker = fs::path(root_dir) / kLatestName;
  std::error_code ec;
  if (!fs::exists(marker, ec)) return std::nullopt;
  const FileUse use{"the 'latest' marker '" + marker.string() + "'", fix};
  std::string text = read_small_file(marker.string(), kLatestMaxBytes, use);
  text = text.substr(0, text.find('\n'));
  const auto step = parse_step(text);
  require(step.has_value(), use.name + " does not hold a step number (it holds '" + printable(text) + "'); " + fix);
  return step;
}

void save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info,
                     const std::vector<TensorSlab>& tensors, int keep, const SaveOptions& options) {
  const auto t_start = Clock::now();
  const int rank = comm_rank(comm);
  agree_on_errors(comm, [&] {
    require(!root_dir.empty(), "checkpoint.dir is empty; set it to a folder");
    require(info.step >= 0, "checkpoint step " + std::to_string(info.step) + " is negative");
    require(keep >= 1, "checkpoint.keep = " + std::to_string(keep) + " must be at least 1");
  });
  StreamHash extra;
  for (std::int64_t v : {info.step, info.consumed_tokens, std::int64_t{keep}}) extra.update(&v, sizeof v);
  extra.update(&info.seed, sizeof info.seed);
  for (const std::string* s : {&info.config, &info.layout, &info.data.kind, &info.data.path, &info.data.digest})
    extra.update(s->c_str(), s->size() + 1);
  const auto order = agreed_order(comm, tensors, extra.finish(), false);

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
        throw Error(std::string("phase '") + phase_name(p) + "' on rank " + std::to_string(rank) + ": " + e.what());
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

std::optional<std::int64_t> latest_step(MPI_Comm comm, const std::string& root_dir) {
  long long step = -1;  // -1: no marker
  agree_on_errors(comm, [&] {
    if (comm_rank(comm) != 0) return;
    if (auto s = read_latest(root_dir)) step = *s;
  });
  mpi_broadcast(&step, 1, MPI_LONG_LONG, 0, comm, "the step of 'latest'");
  if (step < 0) return std::nullopt;
  return step;
}

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
    p.u64(static_cast<std::uint64_t>(index.info.step));
    p.u64(static_cast<std::uint64_t>(index.info.consumed_tokens));
    p.u64(index.info.seed);
    for (const std::string* s : {&index.info.config, &index.info.layout, &index.info.data.kind, &index.info.data.path,
                                 &index.info.data.digest})
      p.str(*s);
    p.u64(index.info.data.bytes);
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
  info.step = static_cast<std::int64_t>(u.u64());
  info.consumed_tokens = static_cast<std::int64_t>(u.u64());
  info.seed = u.u64();
  for (std::string* s : {&info.config, &info.layout, &info.data.kind, &info.data.path, &info.data.digest}) *s = u.str();
  info.data.bytes = u.u64();
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

CheckpointDirLock::CheckpointDirLock(MPI_Comm comm, const std::string& dir, DirAccess access,
                                     std::uint64_t checkpoint_bytes) {
  const bool write = access == DirAccess::write;
  int fd = -1;
  agree_on_errors(comm, [&] {
    if (comm_rank(comm) != 0) return;
    const fs::path root(dir);
    const std::string key = "checkpoint.dir = '" + dir + "'";
    const std::string fix = "; set checkpoint.dir to a writable folder";
    std::error_code ec;
    if (!write && !fs::is_directory(root, ec)) return;  // nothing to read: the load says so
    if (fs::exists(root, ec) && !fs::is_directory(root, ec)) throw Error(key + " is not a folder" + fix);
    if (write) {
      fs::create_directories(root, ec);
      if (ec) throw Error(key + ": the folder cannot be created (" + ec.message() + ")" + fix);
      // Writable: a file can be created and removed there (the lock file may
      // exist already, so opening it would prove nothing).
      const fs::path probe = root / (".probe." + std::to_string(::getpid()));
      const int p = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (p < 0) throw Error(key + " is not writable (" + std::strerror(errno) + ")" + fix);
      ::close(p);
      fs::remove(probe, ec);
    }

    const fs::path lock_path = root / ".lock";
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0 && !write) fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO never blocks
    if (fd < 0) {
      if (!write) return;  // a read-only archive of checkpoints: nobody can write there either
      throw Error(key + ": cannot open its lock file '" + lock_path.string() + "' (" + std::strerror(errno) + ")" +
                  fix);
    }
    if (::flock(fd, (write ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        char text[256] = {};
        const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
        std::string holder = n > 0 ? std::string(text, static_cast<std::size_t>(n)) : "";
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\r')) holder.pop_back();
        ::close(fd);
        fd = -1;
        throw Error(key + " is in use by another job (" + (holder.empty() ? "holder unknown" : printable(holder)) +
                    "): one job writes a checkpoint folder at a time, and nobody reads it meanwhile; wait for that "
                    "job to end, or give this run its own checkpoint.dir");
      }
      if (err != ENOLCK && err != EINVAL && err != EOPNOTSUPP && err != ENOSYS) {
        ::close(fd);
        fd = -1;
        throw Error(key + ": cannot lock '" + lock_path.string() + "' (" + std::strerror(err) + ")");
      }
      std::fprintf(stderr,
                   "ndmini: warning: %s: the file system does not support flock (%s); a second job on this "
                   "folder would not be refused\n",
                   key.c_str(), std::strerror(err));
    }
    try {
      claim(fd, root, write, checkpoint_bytes);
    } catch (...) {
      ::close(fd);
      fd = -1;
      throw;
    }
  });
  fd_ = fd;
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the flock
}

}  // namespace ndmini::io
