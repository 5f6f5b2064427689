// SPDX-License-Identifier: BSD-3-Clause
// Parallel sharded HDF5 checkpoints (DESIGN section 4).
//
// Save: validate -> rank 0 prepares <root>/.step_N.tmp/ and checks free space
// -> every rank creates every dataset (sorted order) and writes its blocks in
// one collective call per dataset -> close -> rank 0 fsyncs, writes
// manifest.txt (file size + whole-file hash), renames the folder to step_N,
// replaces `latest`, prunes.
// Load: rank 0 checks the manifest BEFORE HDF5 opens the file -> every rank
// reads its blocks (replicas included) collectively -> per-tensor digests of
// the owned blocks are compared.
//
// Every phase ends with an agreement over the communicator (run_phase), so an
// error on any rank becomes the same ndmini::Error on every rank and no rank is
// left waiting in a collective that the others skipped.
#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include "core/error.hpp"

namespace ndmini::io {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFileName = "checkpoint.h5";
constexpr const char* kManifestName = "manifest.txt";
constexpr const char* kManifestMagic = "ndmini-checkpoint-manifest 1";
constexpr const char* kLatestName = "latest";
constexpr const char* kDigestAttr = "digest";
constexpr const char* kResumeHint = "resume from an earlier step with --resume STEP";
// HDF5 refuses chunks of 4 GiB or more.
constexpr std::uint64_t kMaxChunkBytes = (std::uint64_t{1} << 32) - 1;

// ---------------------------------------------------------------- hashing

// splitmix64's finalizer on x + golden gamma: a bijection with no fixed point at 0.
std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Order-dependent hash of a byte stream: a mix64 chain over 8-byte
// little-endian words (the tail zero-padded), finished with the length.
class StreamHash {
 public:
  void update(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    length_ += n;
    while (n > 0) {
      if (fill_ == 0 && n >= 8) {  // fast path: whole words straight from the input
        std::uint64_t w;
        std::memcpy(&w, p, 8);
        h_ = mix64(h_ ^ w);
        p += 8;
        n -= 8;
        continue;
      }
      const std::size_t take = std::min(n, std::size_t{8} - fill_);
      std::memcpy(word_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 8) absorb_partial();
    }
  }
  std::uint64_t finish() {
    if (fill_ > 0) {
      std::memset(word_ + fill_, 0, 8 - fill_);
      absorb_partial();
    }
    return mix64(h_ ^ length_);
  }

 private:
  void absorb_partial() {
    std::uint64_t w;
    std::memcpy(&w, word_, 8);
    h_ = mix64(h_ ^ w);
    fill_ = 0;
  }
  std::uint64_t h_ = 0;
  std::uint64_t length_ = 0;
  unsigned char word_[8] = {};
  std::size_t fill_ = 0;
};

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

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

// Layout-independent digest of one block: the sum over its elements of
// mix64(mix64(global linear index) ^ bits(x)). Summing the owned blocks of all
// ranks gives the same value for any split of the tensor, so a resharded load
// can be checked exactly against what was saved.
std::uint64_t block_digest(const TensorSlab& t) {
  if (is_empty(t)) return 0;
  const std::uint64_t row = t.count.back();
  std::uint64_t sum = 0;
  for_each_row(t, [&](std::uint64_t start, std::uint64_t r) {
    const float* x = t.data + r * row;
    for (std::uint64_t j = 0; j < row; ++j) {
      std::uint32_t bits;
      std::memcpy(&bits, x + j, 4);
      sum += mix64(mix64(start + j) ^ bits);
    }
  });
  return sum;
}

// One row of a block: `length` elements from global linear index `start`, at
// `data` in host memory.
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
  std::vector<std::uint64_t> shape;
  std::vector<const TensorSlab*> owned;  // non-empty, not replica: digest and coverage
  std::vector<const TensorSlab*> moved;  // what this call transfers: owned on save, every non-empty block on load
  std::vector<Run> runs;                 // rows of `moved` in file order, when there are several blocks
};

// ------------------------------------------------------------ agreement

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

std::uint64_t sum_over(MPI_Comm comm, std::uint64_t v) {
  std::uint64_t total = 0;
  MPI_Allreduce(&v, &total, 1, MPI_UINT64_T, MPI_SUM, comm);  // wraps mod 2^64, as intended
  return total;
}

// Every rank must pass the same tensor list (and info): HDF5 needs identical
// collective calls, and a mismatch would hang instead of failing.
void require_same_everywhere(MPI_Comm comm, std::uint64_t fingerprint, const std::string& what) {
  std::uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&fingerprint, &lo, 1, MPI_UINT64_T, MPI_MIN, comm);
  MPI_Allreduce(&fingerprint, &hi, 1, MPI_UINT64_T, MPI_MAX, comm);
  require(lo == hi, what);
}

// ------------------------------------------------------------------ HDF5

void quiet_hdf5() {
  // Our messages name the file and the fix; HDF5's stack dumps would only bury them.
  static const bool once = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)once;
}

herr_t keep_deepest(unsigned, const H5E_error2_t* e, void* out) {
  if (e->desc && *e->desc) *static_cast<std::string*>(out) = e->desc;
  return 0;
}

// The innermost description on HDF5's error stack, e.g. "data error detected
// by Fletcher32 checksum"; it is the most specific one.
std::string hdf5_error_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, keep_deepest, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "HDF5 error" : text;
}

template <class T>
T checked(T status, const std::string& what) {
  if (status < 0) throw Error(what + " (" + hdf5_error_text() + ")");
  return status;
}

// Owns one HDF5 id and closes it with the matching H5?close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(id_, o.id_);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  hid_t release() { return std::exchange(id_, -1); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

Handle file_access(MPI_Comm comm) {
  Handle fapl(checked(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"), H5Pclose);
  checked(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), "H5Pset_fapl_mpio");
  // v2 superblock and v1.8+ structures: a damaged header fails cleanly instead
  // of crashing or hanging the reader (research section 2).
  checked(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V110), "H5Pset_libver_bounds");
  // Every rank makes every metadata call, so HDF5 may do them collectively:
  // fewer small I/Os, and no hang in distributed metadata writes (hdf5#265).
  checked(H5Pset_all_coll_metadata_ops(fapl.get(), true), "H5Pset_all_coll_metadata_ops");
  checked(H5Pset_coll_metadata_write(fapl.get(), true), "H5Pset_coll_metadata_write");
  return fapl;
}

Handle collective_transfer() {
  Handle dxpl(checked(H5Pcreate(H5P_DATASET_XFER), "H5Pcreate"), H5Pclose);
  // Fletcher32 datasets can only be written collectively.
  checked(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");
  return dxpl;
}

// H5Fcreate/H5Fopen on every rank. If only some ranks got a handle, those are
// deliberately leaked: H5Fclose is collective, so closing on part of the ranks
// would hang, and the Error thrown everywhere ends the run anyway.
Handle open_file(MPI_Comm comm, const fs::path& path, bool create) {
  hid_t id = -1;
  agree_on_errors(comm, [&] {
    Handle fapl = file_access(comm);
    id = create ? H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get())
                : H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
    checked(id, std::string(create ? "cannot create '" : "cannot open '") + path.string() + "'");
  });
  return Handle(id, H5Fclose);
}

void close_file(MPI_Comm comm, Handle& file, const fs::path& path) {
  agree_on_errors(comm, [&] { checked(H5Fclose(file.release()), "closing '" + path.string() + "' failed"); });
}

void write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* value) {
  Handle space(checked(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  Handle attr(checked(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      std::string("creating attribute '") + name + "'"),
              H5Aclose);
  checked(H5Awrite(attr.get(), mem_type, value), std::string("writing attribute '") + name + "'");
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  // Fixed-length, NUL-terminated: variable-length data has no parallel write path.
  Handle type(checked(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
  checked(H5Tset_size(type.get(), value.size() + 1), "H5Tset_size");
  checked(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), "H5Tset_strpad");
  checked(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset");
  write_attr(obj, name, type.get(), type.get(), value.c_str());
}

Handle open_attr(hid_t obj, const char* name, const std::string& where) {
  require(checked(H5Aexists(obj, name), "H5Aexists") > 0,
          where + " has no attribute '" + name + "'; it is corrupted or not an ndmini checkpoint; " + kResumeHint);
  return Handle(checked(H5Aopen(obj, name, H5P_DEFAULT), std::string("opening attribute '") + name + "'"), H5Aclose);
}

template <class T>
T read_attr(hid_t obj, const char* name, hid_t mem_type, const std::string& where) {
  Handle attr = open_attr(obj, name, where);
  T value{};
  checked(H5Aread(attr.get(), mem_type, &value), std::string("reading attribute '") + name + "'");
  return value;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& where) {
  Handle attr = open_attr(obj, name, where);
  Handle type(checked(H5Aget_type(attr.get()), "H5Aget_type"), H5Tclose);
  require(H5Tget_class(type.get()) == H5T_STRING && H5Tis_variable_str(type.get()) == 0,
          where + ": attribute '" + name + "' is not a fixed-length string");
  const std::size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  checked(H5Aread(attr.get(), type.get(), value.data()), std::string("reading attribute '") + name + "'");
  value.resize(std::strlen(value.c_str()));
  return value;
}

// This rank's blocks of one tensor as ONE HDF5 transfer, so every rank makes
// one collective call per tensor whatever its number of blocks. The file side
// is the union of the blocks' hyperslabs; HDF5 walks it in row-major order of
// the file coordinates, whatever the order of the blocks, so the memory side is
// a 1-D buffer in that order. A single block is that buffer already; several
// are gathered into (save) or scattered from (load) a staging buffer, row by
// row in file order (Tensor::runs). No block selects nothing on both sides;
// the rank still joins the transfer.
struct Transfer {
  Handle memory;
  Handle file;
  std::vector<float> staging;
  float* buffer = nullptr;
};

Transfer prepare_transfer(hid_t dset, const Tensor& t) {
  Transfer x;
  x.file = Handle(checked(H5Dget_space(dset), "H5Dget_space"), H5Sclose);
  std::uint64_t n = 0;
  for (const TensorSlab* b : t.moved) n += product(b->count);
  const hsize_t extent = std::max<std::uint64_t>(n, 1);
  x.memory = Handle(checked(H5Screate_simple(1, &extent, nullptr), "H5Screate_simple"), H5Sclose);
  if (t.moved.empty()) {
    checked(H5Sselect_none(x.memory.get()), "H5Sselect_none");
    checked(H5Sselect_none(x.file.get()), "H5Sselect_none");
    x.staging.assign(1, 0.0f);  // HDF5 wants a buffer even for an empty selection
    x.buffer = x.staging.data();
    return x;
  }
  H5S_seloper_t op = H5S_SELECT_SET;
  for (const TensorSlab* b : t.moved) {
    const std::vector<hsize_t> start(b->offset.begin(), b->offset.end());
    const std::vector<hsize_t> count(b->count.begin(), b->count.end());
    checked(H5Sselect_hyperslab(x.file.get(), op, start.data(), nullptr, count.data(), nullptr), "H5Sselect_hyperslab");
    op = H5S_SELECT_OR;
  }
  if (t.moved.size() == 1) {
    x.buffer = t.moved.front()->data;
  } else {
    x.staging.resize(n);
    x.buffer = x.staging.data();
  }
  return x;
}

// Blocks -> staging buffer, before a write of several blocks.
void gather(const Tensor& t, Transfer& x) {
  if (t.moved.size() < 2) return;
  float* p = x.buffer;
  for (const Run& r : t.runs) p = std::copy(r.data, r.data + r.length, p);
}

// Staging buffer -> blocks, after a read of several blocks.
void scatter(const Tensor& t, const Transfer& x) {
  if (t.moved.size() < 2) return;
  const float* p = x.buffer;
  for (const Run& r : t.runs) {
    std::copy(p, p + r.length, r.data);
    p += r.length;
  }
}

std::string dataset_path(const std::string& name) { return name.front() == '/' ? name : "/" + name; }

// One chunk per tensor keeps the file simple; when a tensor reaches HDF5's
// 4 GiB chunk limit, halve its outermost dimension that can still shrink.
std::vector<hsize_t> chunk_dims(const std::vector<std::uint64_t>& shape) {
  std::vector<hsize_t> chunk(shape.begin(), shape.end());
  std::size_t d = 0;
  while (4 * product(std::vector<std::uint64_t>(chunk.begin(), chunk.end())) > kMaxChunkBytes) {
    while (chunk[d] == 1) ++d;
    chunk[d] = (chunk[d] + 1) / 2;
  }
  return chunk;
}

Handle create_dataset(hid_t file, const Tensor& t, std::uint64_t digest) {
  const std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  const int rank = static_cast<int>(dims.size());
  Handle space(checked(H5Screate_simple(rank, dims.data(), nullptr), "H5Screate_simple"), H5Sclose);
  Handle dcpl(checked(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"), H5Pclose);
  checked(H5Pset_chunk(dcpl.get(), rank, chunk_dims(t.shape).data()), "H5Pset_chunk");
  checked(H5Pset_fletcher32(dcpl.get()), "H5Pset_fletcher32");
  // No fill: the ranks' owned blocks cover every element (checked), so a fill would
  // only write the whole tensor twice.
  checked(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  Handle lcpl(checked(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate"), H5Pclose);
  checked(H5Pset_create_intermediate_group(lcpl.get(), 1), "H5Pset_create_intermediate_group");
  Handle dset(checked(H5Dcreate2(file, dataset_path(t.name).c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(),
                                 dcpl.get(), H5P_DEFAULT),
                      "creating tensor '" + t.name + "'"),
              H5Dclose);
  write_attr(dset.get(), kDigestAttr, H5T_STD_U64LE, H5T_NATIVE_UINT64, &digest);
  return dset;
}

// True when every group on the way to `path` and the final link exist.
// H5Lexists fails, rather than answering false, when a parent is missing.
bool link_exists(hid_t file, const std::string& path) {
  for (std::size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    const std::string prefix = path.substr(0, at);
    if (checked(H5Lexists(file, prefix.c_str(), H5P_DEFAULT), "H5Lexists") <= 0) return false;
    if (at == std::string::npos) return true;
  }
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ------------------------------------------------------------ validation

// Checks one entry of the caller's list on its own.
void validate_slab(const TensorSlab& t) {
  const std::string tag = "checkpoint tensor '" + t.name + "'";
  require(!t.name.empty() && t.name != "/" && t.name.back() != '/' && t.name.find("//") == std::string::npos,
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

// The rows of several blocks sorted by file position: the order in which HDF5
// walks their union. Sorting whole blocks would not do: blocks side by side in
// a row (column splits) interleave row by row. Overlapping blocks would make
// the union smaller than the buffer, so they are refused here.
std::vector<Run> file_order_runs(const Tensor& t) {
  std::vector<Run> runs;
  for (const TensorSlab* b : t.moved) {
    const std::uint64_t row = b->count.back();
    for_each_row(*b, [&](std::uint64_t start, std::uint64_t r) { runs.push_back({start, row, b->data + r * row}); });
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
  for (std::size_t i = 1; i < runs.size(); ++i)
    require(runs[i - 1].start + runs[i - 1].length <= runs[i].start,
            "checkpoint tensor '" + t.name + "': two blocks of one rank overlap (at flat element " +
                std::to_string(runs[i].start) + "); a rank must list each element at most once");
  return runs;
}

// Groups the entries by dataset, sorted by path, so that every rank creates and
// reads the datasets once each, in one order, however many blocks it holds.
// Replica blocks are transferred only when loading.
std::vector<Tensor> group_blocks(const std::vector<TensorSlab>& slabs, bool loading) {
  std::map<std::string, Tensor> by_path;
  for (const TensorSlab& s : slabs) {
    validate_slab(s);
    Tensor& t = by_path[dataset_path(s.name)];
    if (t.name.empty()) {
      t.name = s.name;
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
    if (t.moved.size() > 1) t.runs = file_order_runs(t);
    order.push_back(std::move(t));
  }
  return order;
}

// Over the set of distinct tensors (paths and shapes), not the blocks: ranks
// hold different numbers of blocks of a tensor.
std::uint64_t fingerprint(const std::vector<Tensor>& order) {
  StreamHash h;
  for (const Tensor& t : order) {
    const std::string path = dataset_path(t.name);
    h.update(path.c_str(), path.size() + 1);  // with the NUL, so "ab"+"c" differs from "a"+"bc"
    for (auto d : t.shape) h.update(&d, sizeof d);
    const std::uint64_t end = ~std::uint64_t{0};
    h.update(&end, sizeof end);
  }
  return h.finish();
}

// Validation and the checks that need every rank: the same set of tensors, and
// owned (non-replica) blocks that together cover each tensor once.
std::vector<Tensor> agreed_order(MPI_Comm comm, const std::vector<TensorSlab>& tensors, std::uint64_t extra_fingerprint,
                                 bool loading) {
  std::vector<Tensor> order;
  agree_on_errors(comm, [&] { order = group_blocks(tensors, loading); });
  require_same_everywhere(comm, mix64(fingerprint(order) ^ extra_fingerprint),
                          "checkpoint: the ranks passed different tensor lists, shapes or checkpoint info; every "
                          "rank must name the same tensors (with count 0 where it holds nothing)");
  std::vector<std::uint64_t> held(order.size(), 0), total(order.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const TensorSlab* b : order[i].owned) held[i] += product(b->count);
  MPI_Allreduce(held.data(), total.data(), static_cast<int>(held.size()), MPI_UINT64_T, MPI_SUM, comm);
  for (std::size_t i = 0; i < order.size(); ++i)
    require(total[i] == product(order[i].shape),
            "checkpoint: the ranks' non-replica blocks of tensor '" + order[i].name + "' hold " +
                std::to_string(total[i]) + " elements but its shape " + shape_text(order[i].shape) + " has " +
                std::to_string(product(order[i].shape)) +
                "; each element must belong to exactly one rank (mark the other copies replica)");
  return order;
}

// ------------------------------------------------------------ file system

Error sys_error(const std::string& what) { return Error(what + ": " + std::strerror(errno)); }

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw sys_error("cannot open '" + path.string() + "' to sync it");
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw sys_error("cannot sync '" + path.string() + "'");
}

// Writes a small file and syncs it before returning.
void write_synced(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw sys_error("cannot create '" + path.string() + "'");
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      throw sys_error("cannot write '" + path.string() + "'");
    }
    done += static_cast<std::size_t>(n);
  }
  const bool ok = ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (!ok) throw sys_error("cannot sync '" + path.string() + "'");
}

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
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || !entry.is_directory(ec)) continue;
    if (auto step = parse_step(name.substr(5))) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string available_text(const fs::path& root) {
  const auto steps = committed_steps(root);
  if (steps.empty()) return "none";
  std::string s;
  for (std::size_t i = 0; i < steps.size(); ++i) s += (i ? ", " : "") + std::to_string(steps[i]);
  return s;
}

// nullopt when root_dir or its marker does not exist.
std::optional<std::int64_t> read_latest(const fs::path& root) {
  const fs::path marker = root / kLatestName;
  std::ifstream in(marker);
  if (!in) return std::nullopt;
  std::string text;
  std::getline(in, text);
  const auto step = parse_step(text);
  require(step.has_value(), "the 'latest' marker '" + marker.string() + "' does not hold a step number ('" + text +
                                "'); pick a checkpoint with --resume STEP (available steps: " + available_text(root) +
                                ")");
  return step;
}

std::uint64_t free_bytes(const fs::path& dir) {
  // Test hook: pretend the file system has this many bytes free.
  if (const char* fake = std::getenv("NDMINI_CKPT_FREE_BYTES")) return std::strtoull(fake, nullptr, 10);
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) throw sys_error("cannot query free space of '" + dir.string() + "'");
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

std::string size_text(std::uint64_t bytes) {
  if (bytes < (std::uint64_t{1} << 20)) return std::to_string(bytes) + " bytes";
  return std::to_string((bytes + (std::uint64_t{1} << 20) - 1) >> 20) + " MiB";
}

// Rank 0: creates root_dir and an empty temporary folder for this step, after
// making sure the disk can hold the file. A full disk during a collective HDF5
// write deadlocks on this stack (research section 2), so this check is the guard.
void prepare_tmp_dir(const fs::path& root, std::int64_t step, std::uint64_t data_bytes, std::size_t tensors) {
  fs::create_directories(root);
  const fs::path tmp = root / tmp_dirname(step);
  fs::remove_all(tmp);  // left by a save that died
  // Metadata: object headers, chunk indexes and attributes, generously.
  const std::uint64_t needed = data_bytes + data_bytes / 100 + (std::uint64_t{1} << 20) + 8192 * tensors;
  const std::uint64_t available = free_bytes(root);
  require(available >= needed, "not enough free space in '" + root.string() + "' to save checkpoint step " +
                                   std::to_string(step) + ": it needs about " + size_text(needed) + ", " +
                                   size_text(available) +
                                   " are free; free some space or set checkpoint.dir to a larger file system");
  fs::create_directory(tmp);
}

struct FileDigest {
  std::uint64_t size = 0;
  std::uint64_t hash = 0;
};

FileDigest digest_file(const fs::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw sys_error("cannot read '" + path.string() + "'");
  std::vector<unsigned char> buf(std::size_t{1} << 20);
  StreamHash h;
  FileDigest d;
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    h.update(buf.data(), n);
    d.size += n;
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw Error("cannot read '" + path.string() + "'");
  d.hash = h.finish();
  return d;
}

std::string manifest_text(const FileDigest& d) {
  return std::string(kManifestMagic) + "\nfile " + kFileName + "\nsize " + std::to_string(d.size) +
         "\nhash mix64-chain " + hex64(d.hash) + "\n";
}

// Rank 0, after every rank closed the file: make the checkpoint durable, then
// make it visible. The rename is the commit; `latest` moves only afterwards.
void commit(const fs::path& root, std::int64_t step) {
  const fs::path tmp = root / tmp_dirname(step);
  const fs::path final_dir = root / checkpoint_dirname(step);
  const fs::path old = root / old_dirname(step);
  fsync_path(tmp / kFileName, false);
  write_synced(tmp / kManifestName, manifest_text(digest_file(tmp / kFileName)));
  fsync_path(tmp, true);
  // Saving a step that already exists (a run resumed from an earlier step):
  // rename() cannot replace a non-empty folder, so move the old one aside.
  fs::remove_all(old);
  const bool replacing = fs::exists(final_dir);
  if (replacing) fs::rename(final_dir, old);
  fs::rename(tmp, final_dir);
  fsync_path(root, true);
  const fs::path marker_tmp = root / (std::string(kLatestName) + ".tmp");
  write_synced(marker_tmp, std::to_string(step) + "\n");
  fs::rename(marker_tmp, root / kLatestName);
  fsync_path(root, true);
  if (replacing) fs::remove_all(old);
}

// Rank 0: keeps the step just saved and the newest keep-1 committed steps
// below it, and removes folders of saves that never committed. Steps above the
// one just saved belong to a run this one was resumed away from; they stay.
void prune(const fs::path& root, std::int64_t step, int keep) {
  std::vector<std::int64_t> older;
  for (auto s : committed_steps(root))
    if (s < step) older.push_back(s);
  const std::size_t keep_older = static_cast<std::size_t>(keep - 1);
  if (older.size() > keep_older) {
    for (std::size_t i = 0; i < older.size() - keep_older; ++i) fs::remove_all(root / checkpoint_dirname(older[i]));
  }
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    const bool stale =
        name.rfind(".step_", 0) == 0 && (name.size() > 4 && (name.compare(name.size() - 4, 4, ".tmp") == 0 ||
                                                             name.compare(name.size() - 4, 4, ".old") == 0));
    if (stale) fs::remove_all(entry.path());
  }
}

// Rank 0, before HDF5 sees the file: size and whole-file hash must match the
// manifest, so a damaged header never reaches the library (which can read
// corrupted metadata silently, research section 2).
void verify_manifest(const fs::path& root, std::int64_t step, bool from_latest) {
  const fs::path dir = root / checkpoint_dirname(step);
  const fs::path file = dir / kFileName;
  if (!fs::is_directory(dir)) {
    if (from_latest)
      throw Error("the 'latest' marker in '" + root.string() + "' names step " + std::to_string(step) + ", but '" +
                  dir.string() + "' does not exist; resume from an existing step with --resume STEP (available: " +
                  available_text(root) + ")");
    throw Error("no checkpoint for step " + std::to_string(step) + " in '" + root.string() + "': '" + dir.string() +
                "' does not exist; pick one of the available steps (" + available_text(root) + ") with --resume STEP");
  }
  const std::string broken = "checkpoint '" + file.string() + "' is corrupted or truncated (";
  const std::string fix = "); " + std::string(kResumeHint);
  std::ifstream in(dir / kManifestName);
  if (!in) throw Error(broken + "no " + kManifestName + fix);
  std::string magic, key, name, algorithm, hash;
  std::uint64_t size = 0;
  std::getline(in, magic);
  const bool parsed = magic == kManifestMagic && (in >> key >> name) && key == "file" && name == kFileName &&
                      (in >> key >> size) && key == "size" && (in >> key >> algorithm >> hash) && key == "hash" &&
                      algorithm == "mix64-chain";
  if (!parsed) throw Error(broken + kManifestName + " is unreadable" + fix);
  if (!fs::exists(file)) throw Error(broken + "the file is missing" + fix);
  const std::uint64_t actual = fs::file_size(file);
  if (actual != size)
    throw Error(broken + "it has " + std::to_string(actual) + " bytes, the manifest says " + std::to_string(size) +
                fix);
  const FileDigest d = digest_file(file);
  if (hex64(d.hash) != hash) throw Error(broken + "its content hash " + hex64(d.hash) + " is not " + hash + fix);
}

}  // namespace

namespace detail {

std::uint64_t file_digest(const std::string& path) { return digest_file(path).hash; }

}  // namespace detail

std::string checkpoint_dirname(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

void save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointInfo& info,
                     const std::vector<TensorSlab>& tensors, int keep) {
  quiet_hdf5();
  const int rank = comm_rank(comm);
  agree_on_errors(comm, [&] {
    require(!root_dir.empty(), "checkpoint.dir is empty; set it to a folder");
    require(info.step >= 0, "checkpoint step " + std::to_string(info.step) + " is negative");
    require(keep >= 1, "checkpoint.keep = " + std::to_string(keep) + " must be at least 1");
  });
  StreamHash extra;
  for (std::int64_t v : {info.step, info.consumed_tokens, std::int64_t{keep}}) extra.update(&v, sizeof v);
  extra.update(&info.seed, sizeof info.seed);
  extra.update(info.config.c_str(), info.config.size() + 1);
  extra.update(info.layout.c_str(), info.layout.size() + 1);
  const auto order = agreed_order(comm, tensors, extra.finish(), false);

  // Layout-independent digests of the owned blocks, summed over the ranks
  // before anything is written.
  std::vector<std::uint64_t> digests(order.size(), 0), sums(order.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const TensorSlab* b : order[i].owned) digests[i] += block_digest(*b);
  MPI_Allreduce(digests.data(), sums.data(), static_cast<int>(digests.size()), MPI_UINT64_T, MPI_SUM, comm);

  const fs::path root(root_dir);
  const fs::path file_path = root / tmp_dirname(info.step) / kFileName;
  agree_on_errors(comm, [&] {
    if (rank != 0) return;
    std::uint64_t bytes = 0;
    for (const Tensor& t : order) bytes += 4 * product(t.shape);
    try {
      prepare_tmp_dir(root, info.step, bytes, order.size());
    } catch (const fs::filesystem_error& e) {
      throw Error("cannot prepare a checkpoint folder in '" + root.string() + "': " + e.what());
    }
  });

  try {
    Handle file = open_file(comm, file_path, true);
    agree_on_errors(comm, [&] {
      const std::int64_t version = kFormatVersion;
      write_attr(file.get(), "format_version", H5T_STD_I64LE, H5T_NATIVE_INT64, &version);
      write_attr(file.get(), "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &info.step);
      write_attr(file.get(), "consumed_tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, &info.consumed_tokens);
      write_attr(file.get(), "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &info.seed);
      write_string_attr(file.get(), "config", info.config);
      write_string_attr(file.get(), "layout", info.layout);
    });
    Handle dxpl;
    agree_on_errors(comm, [&] { dxpl = collective_transfer(); });
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Tensor& t = order[i];
      Handle dset;
      Transfer x;
      agree_on_errors(comm, [&] {
        dset = create_dataset(file.get(), t, sums[i]);
        x = prepare_transfer(dset.get(), t);
        gather(t, x);
      });
      agree_on_errors(comm, [&] {
        checked(
            H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, x.memory.get(), x.file.get(), dxpl.get(), x.buffer),
            "writing tensor '" + t.name + "' to '" + file_path.string() + "' failed on rank " + std::to_string(rank));
      });
    }
    close_file(comm, file, file_path);
    agree_on_errors(comm, [&] {
      if (rank != 0) return;
      try {
        commit(root, info.step);
      } catch (const fs::filesystem_error& e) {
        throw Error("committing checkpoint step " + std::to_string(info.step) + " in '" + root.string() +
                    "' failed: " + e.what());
      }
    });
  } catch (const Error&) {
    // Every rank is here (errors are agreed). Drop the partial folder; a
    // folder that does not end in a committed name is never loaded anyway.
    if (rank == 0) {
      std::error_code ignored;
      fs::remove_all(root / tmp_dirname(info.step), ignored);
    }
    throw;
  }
  agree_on_errors(comm, [&] {
    if (rank != 0) return;
    try {
      prune(root, info.step, keep);
    } catch (const std::exception& e) {
      throw Error("checkpoint step " + std::to_string(info.step) + " was saved, but removing old checkpoints in '" +
                  root.string() + "' failed: " + e.what());
    }
  });
}

std::optional<std::int64_t> latest_step(MPI_Comm comm, const std::string& root_dir) {
  long long step = -1;  // -1: no marker
  agree_on_errors(comm, [&] {
    if (comm_rank(comm) != 0) return;
    if (auto s = read_latest(root_dir)) step = *s;
  });
  MPI_Bcast(&step, 1, MPI_LONG_LONG, 0, comm);
  if (step < 0) return std::nullopt;
  return step;
}

CheckpointInfo load_checkpoint(MPI_Comm comm, const std::string& root_dir, std::optional<std::int64_t> step,
                               const std::vector<TensorSlab>& tensors) {
  quiet_hdf5();
  const int rank = comm_rank(comm);
  const fs::path root(root_dir);
  const std::string fix = "train with checkpoint.every > 0 first or drop --resume";

  // Which checkpoint, and is it intact: rank 0 decides, before HDF5 is involved.
  long long chosen = 0;
  agree_on_errors(comm, [&] {
    if (rank != 0) return;
    require(fs::is_directory(root), "no checkpoint in '" + root.string() + "' (the folder does not exist); " + fix);
    if (step) {
      chosen = *step;
    } else {
      const auto latest = read_latest(root);
      require(latest.has_value(), "no checkpoint in '" + root.string() + "' (no 'latest' marker); " + fix);
      chosen = *latest;
    }
    verify_manifest(root, chosen, !step.has_value());
  });
  MPI_Bcast(&chosen, 1, MPI_LONG_LONG, 0, comm);

  const auto order = agreed_order(comm, tensors, 0, true);
  const fs::path file_path = root / checkpoint_dirname(chosen) / kFileName;
  const std::string where = "checkpoint '" + file_path.string() + "'";

  Handle file = open_file(comm, file_path, false);
  CheckpointInfo info;
  agree_on_errors(comm, [&] {
    const auto version = read_attr<std::int64_t>(file.get(), "format_version", H5T_NATIVE_INT64, where);
    require(version == kFormatVersion, where + " has format_version " + std::to_string(version) +
                                           "; this ndmini reads version " + std::to_string(kFormatVersion));
    info.step = read_attr<std::int64_t>(file.get(), "step", H5T_NATIVE_INT64, where);
    info.consumed_tokens = read_attr<std::int64_t>(file.get(), "consumed_tokens", H5T_NATIVE_INT64, where);
    info.seed = read_attr<std::uint64_t>(file.get(), "seed", H5T_NATIVE_UINT64, where);
    info.config = read_string_attr(file.get(), "config", where);
    info.layout = read_string_attr(file.get(), "layout", where);
  });

  Handle dxpl;
  agree_on_errors(comm, [&] { dxpl = collective_transfer(); });
  for (const Tensor& t : order) {
    Handle dset;
    Transfer x;
    std::uint64_t stored = 0;
    agree_on_errors(comm, [&] {
      const std::string path = dataset_path(t.name);
      require(link_exists(file.get(), path), where + " has no tensor '" + t.name +
                                                 "'; it was written for a different model (compare the deck with "
                                                 "the checkpoint's config attribute)");
      dset = Handle(
          checked(H5Dopen2(file.get(), path.c_str(), H5P_DEFAULT), where + ": cannot open tensor '" + t.name + "'"),
          H5Dclose);
      Handle type(checked(H5Dget_type(dset.get()), "H5Dget_type"), H5Tclose);
      require(H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4,
              where + ": tensor '" + t.name + "' is not float32");
      Handle space(checked(H5Dget_space(dset.get()), "H5Dget_space"), H5Sclose);
      const int ndims = checked(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims");
      std::vector<hsize_t> dims(static_cast<std::size_t>(ndims));
      checked(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims");
      const std::vector<std::uint64_t> shape(dims.begin(), dims.end());
      require(shape == t.shape, where + ": tensor '" + t.name + "' has shape " + shape_text(shape) +
                                    ", the model expects " + shape_text(t.shape) +
                                    "; the checkpoint was written for a different model (compare the deck "
                                    "with the checkpoint's config attribute)");
      stored =
          read_attr<std::uint64_t>(dset.get(), kDigestAttr, H5T_NATIVE_UINT64, where + ": tensor '" + t.name + "'");
      x = prepare_transfer(dset.get(), t);
    });
    // A Fletcher32 failure shows only on the rank that reads the damaged chunk;
    // the agreement makes every rank refuse the checkpoint.
    agree_on_errors(comm, [&] {
      const herr_t rc = H5Dread(dset.get(), H5T_NATIVE_FLOAT, x.memory.get(), x.file.get(), dxpl.get(), x.buffer);
      if (rc < 0)
        throw Error(where + " is corrupted: reading tensor '" + t.name + "' failed on rank " + std::to_string(rank) +
                    " (" + hdf5_error_text() + "); " + kResumeHint);
    });
    scatter(t, x);
    // Replicas are read but not summed: the owned blocks cover the tensor once.
    std::uint64_t mine = 0;
    for (const TensorSlab* b : t.owned) mine += block_digest(*b);
    const std::uint64_t digest = sum_over(comm, mine);
    // Same values on every rank, so every rank throws together.
    require(digest == stored, where + " is corrupted: tensor '" + t.name + "' does not match its digest (read " +
                                  hex64(digest) + ", saved " + hex64(stored) + "); " + kResumeHint);
  }
  close_file(comm, file, file_path);
  return info;
}

}  // namespace ndmini::io
