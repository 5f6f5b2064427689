// SPDX-License-Identifier: BSD-3-Clause
#include "io/format.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <utility>

#include "config/config.hpp"
#include "core/error.hpp"
#include "core/regular_file.hpp"
#include "io/digest.hpp"

namespace ndmini::io::format {
namespace {

constexpr const char* kManifestMagic = "ndmini-checkpoint-manifest";
constexpr const char* kDigestAttr = "digest";
// Raw data of tensors from 4 KiB up starts on a 4 KiB boundary (a page; a
// disk block): a rank's write never shares a page with metadata.
constexpr hsize_t kAlignment = 4096;
// Metadata is allocated in blocks of this size, so the object headers cluster
// instead of sitting between every two tensors.
constexpr hsize_t kMetaBlockBytes = 64 * 1024;
// The manifest holds 5 lines and one per tensor (model, then both AdamW
// moments: 36 per layer), each under 128 bytes. 16 MiB is room for 130,000
// tensors, a model of 3,600 layers: far beyond any GPT, and a bounded read.
constexpr std::uint64_t kManifestMaxBytes = std::uint64_t{16} << 20;
// The longest string attribute is `config`, the resolved deck: at most a
// deck's size, with room for escapes longer than the characters they stand for.
constexpr std::size_t kStringAttrMaxBytes = 8 * kDeckMaxBytes;

Error sys_error(const std::string& what) { return Error(what + ": " + std::strerror(errno)); }

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

// The innermost description on HDF5's error stack: the most specific one.
// A failed system call is reported with its strerror text alone.
std::string hdf5_error_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, keep_deepest, &text);
  H5Eclear2(H5E_DEFAULT);
  const std::string tag = "error message = '";
  const auto at = text.find(tag);
  if (at != std::string::npos) {
    const auto end = text.find('\'', at + tag.size());
    if (end != std::string::npos) text = text.substr(at + tag.size(), end - at - tag.size());
  }
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text.empty() ? "HDF5 error" : text;
}

template <class T>
T checked(T status, const std::string& what) {
  if (status < 0) throw Error(what + " (" + hdf5_error_text() + ")");
  return status;
}

// Owns one HDF5 id and closes it with the matching H5?close. HDF5 runs in one
// process here, so closing is never collective and always safe.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  hid_t release() { return std::exchange(id_, -1); }
  // Closes now and reports failure (a file's close writes its metadata).
  void close(const std::string& what) {
    const hid_t id = std::exchange(id_, -1);
    if (id >= 0) checked(close_(id), what);
  }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

Handle file_access() {
  Handle fapl(checked(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"), H5Pclose);
  checked(H5Pset_fapl_sec2(fapl.get()), "H5Pset_fapl_sec2");
  // v2 superblock and v1.8+ structures: a damaged header fails cleanly
  // instead of crashing or hanging the reader.
  checked(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V110), "H5Pset_libver_bounds");
  checked(H5Pset_alignment(fapl.get(), kAlignment, kAlignment), "H5Pset_alignment");
  checked(H5Pset_meta_block_size(fapl.get(), kMetaBlockBytes), "H5Pset_meta_block_size");
#if H5_VERSION_GE(1, 10, 7) && !(H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 12 && H5_VERS_RELEASE == 0)
  // One writer per folder is ndmini's own lock (io::CheckpointDirLock); HDF5's
  // flock would only fail on file systems without flock.
  checked(H5Pset_file_locking(fapl.get(), false, true), "H5Pset_file_locking");
#endif
  return fapl;
}

void write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* value) {
  Handle space(checked(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  Handle attr(checked(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      std::string("creating attribute '") + name + "'"),
              H5Aclose);
  checked(H5Awrite(attr.get(), mem_type, value), std::string("writing attribute '") + name + "'");
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  // Fixed-length and NUL-terminated: readable by every HDF5 tool.
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
  Handle space(checked(H5Aget_space(attr.get()), "H5Aget_space"), H5Sclose);
  require(H5Sget_simple_extent_npoints(space.get()) == 1,
          where + ": attribute '" + name + "' is not one string; it is corrupted; " + kResumeHint);
  const std::size_t size = H5Tget_size(type.get());
  require(size <= kStringAttrMaxBytes, where + ": attribute '" + name + "' claims " + std::to_string(size) +
                                           " bytes, more than the " + std::to_string(kStringAttrMaxBytes) +
                                           " ndmini writes at most; it is corrupted; " + kResumeHint);
  std::string value(size, '\0');
  checked(H5Aread(attr.get(), type.get(), value.data()), std::string("reading attribute '") + name + "'");
  value.resize(std::strlen(value.c_str()));
  return value;
}

// One root attribute of CheckpointInfo, by the type of its field
// (for_each_field): little-endian 64-bit integers and UTF-8 strings.
void write_field(hid_t obj, const char* name, const std::int64_t& value) {
  write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
void write_field(hid_t obj, const char* name, const std::uint64_t& value) {
  write_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}
void write_field(hid_t obj, const char* name, const std::string& value) { write_string_attr(obj, name, value); }

void read_field(hid_t obj, const char* name, std::int64_t& value, const std::string& where) {
  value = read_attr<std::int64_t>(obj, name, H5T_NATIVE_INT64, where);
}
void read_field(hid_t obj, const char* name, std::uint64_t& value, const std::string& where) {
  value = read_attr<std::uint64_t>(obj, name, H5T_NATIVE_UINT64, where);
}
void read_field(hid_t obj, const char* name, std::string& value, const std::string& where) {
  value = read_string_attr(obj, name, where);
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

// ------------------------------------------------------------ file system

class Fd {
 public:
  Fd(const std::string& path, int flags) : fd_(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  // Closes now and reports failure (NFS reports write errors at close).
  bool close() { return ::close(std::exchange(fd_, -1)) == 0; }

 private:
  int fd_;
};

struct Extent {
  std::uint64_t offset = 0, bytes = 0;
  std::string path;
};

// Hash of every byte of the file outside the extents (sorted, disjoint), in
// file order: the HDF5 metadata and the alignment gaps.
std::uint64_t metadata_hash(const std::string& file, std::uint64_t size, const std::vector<Extent>& extents) {
  Fd fd(file, O_RDONLY | O_NONBLOCK);  // a FIFO under this name cannot block
  if (!fd.ok()) throw sys_error("cannot read '" + file + "'");
  StreamHash h;
  std::vector<unsigned char> buf(1 << 16);
  auto hash_range = [&](std::uint64_t from, std::uint64_t to) {
    while (from < to) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(to - from, buf.size()));
      const ssize_t n = ::pread(fd.get(), buf.data(), want, static_cast<off_t>(from));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw sys_error("cannot read '" + file + "'");
      if (n == 0) throw Error("'" + file + "' ended early while reading it");
      h.update(buf.data(), static_cast<std::size_t>(n));
      from += static_cast<std::uint64_t>(n);
    }
  };
  std::uint64_t at = 0;
  for (const Extent& e : extents) {
    hash_range(at, e.offset);
    at = e.offset + e.bytes;
  }
  hash_range(at, size);
  return h.finish();
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw sys_error("cannot stat '" + path + "'");
  return static_cast<std::uint64_t>(st.st_size);
}

// The folder's name is what `latest` and --resume STEP point at: a folder
// holding another step's files (copied or renamed by hand) would otherwise
// resume at that other step without a word.
void require_step_matches_folder(const std::string& dir, std::int64_t step) {
  std::error_code ec;
  std::filesystem::path folder = std::filesystem::absolute(dir, ec).lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();  // "step_00000008/"
  const auto named = step_of_dirname(folder.filename().string());
  if (!named || *named == step) return;
  const std::string here = std::filesystem::path(dir).lexically_normal().string();
  throw Error("checkpoint folder '" + here + "' is named for step " + std::to_string(*named) + ", but its " +
              kFileName + " holds step " + std::to_string(step) +
              " (copied or moved there by hand?); resuming it would restart at step " + std::to_string(step) +
              ". Move its files to a folder " + checkpoint_dirname(step) +
              ", or resume another step with --resume STEP");
}

}  // namespace

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::uint64_t TensorEntry::elements() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void sync_path(const std::string& path, bool directory) {
  Fd fd(path, directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (!fd.ok()) throw sys_error("cannot open '" + path + "' to sync it");
  if (::fsync(fd.get()) != 0) throw sys_error("cannot sync '" + path + "'");
}

void write_synced(const std::string& path, const std::string& text) {
  Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd.ok()) throw sys_error("cannot create '" + path + "'");
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw sys_error("cannot write '" + path + "'");
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) throw sys_error("cannot sync '" + path + "'");
  if (!fd.close()) throw sys_error("cannot close '" + path + "'");
}

namespace {

// Extents of the raw data, sorted by offset.
std::vector<Extent> extents_of(const std::vector<TensorEntry>& tensors) {
  std::vector<Extent> extents;
  for (const TensorEntry& t : tensors) extents.push_back({t.offset, t.bytes(), t.path});
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
  return extents;
}

// Sets `fd`'s size to `bytes`, reserving the blocks where the file system can.
void reserve(int fd, std::uint64_t bytes, const std::string& file) {
  // Test hook: behave as a file system without fallocate, so that a full disk
  // hits the ranks' data writes themselves.
  const bool try_reserve = std::getenv("NDMINI_CKPT_NO_RESERVE") == nullptr;
#ifdef __linux__
  // fallocate(2), not posix_fallocate(3): where the file system cannot
  // reserve, glibc's fallback would write the whole file once more.
  if (try_reserve && ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0) return;
  if (try_reserve && errno != EOPNOTSUPP && errno != ENOSYS)
    throw sys_error("cannot reserve " + std::to_string(bytes) + " bytes for '" + file + "'");
#else
  (void)try_reserve;
#endif
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw sys_error("cannot size '" + file + "'");
}

}  // namespace

FileBuilder::FileBuilder(const CheckpointInfo& info, std::vector<TensorEntry>& tensors) {
  quiet_hdf5();
  // A sparse file in memory where there is one (/dev/shm), else in the
  // temporary folder: the datasets' raw data are holes in it, only the
  // metadata takes space. (Not a memfd: HDF5 needs a real path.)
  std::string tried;
  const char* tmpdir = std::getenv("TMPDIR");
  for (const char* dir : {"/dev/shm", tmpdir, "/tmp"}) {
    if (dir == nullptr || *dir == '\0') continue;
    std::string name = std::string(dir) + "/ndmini-checkpoint-metadata-XXXXXX";
    fd_ = ::mkstemp(name.data());
    if (fd_ >= 0) {
      path_ = name;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + std::string(dir) + " (" + std::strerror(errno) + ")";
  }
  if (fd_ < 0) throw Error("cannot create a temporary file for the checkpoint's metadata in " + tried);
  const std::string what = "building the checkpoint's HDF5 metadata";
  Handle fapl = file_access();
  // No modification times in the object headers (HDF5 stores them by
  // default): a checkpoint is then a function of its contents alone, so
  // saves of the same state (sync or async, at any hour) are byte-identical.
  Handle fcpl(checked(H5Pcreate(H5P_FILE_CREATE), "H5Pcreate"), H5Pclose);
  checked(H5Pset_obj_track_times(fcpl.get(), false), "H5Pset_obj_track_times");
  Handle gcpl(checked(H5Pcreate(H5P_GROUP_CREATE), "H5Pcreate"), H5Pclose);
  checked(H5Pset_obj_track_times(gcpl.get(), false), "H5Pset_obj_track_times");
  Handle f(checked(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), what), H5Fclose);
  // Open now (by HDF5 and by fd_), so its name can go: a process killed
  // mid-save leaves nothing behind in /dev/shm.
  ::unlink(path_.c_str());
  path_.clear();
  const std::int64_t version = kVersion;
  write_attr(f.get(), "format_version", H5T_STD_I64LE, H5T_NATIVE_INT64, &version);
  for_each_field(info, [&](const char* name, const auto& value) { write_field(f.get(), name, value); });

  Handle dcpl(checked(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"), H5Pclose);
  checked(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout");
  // Allocated now, so every offset is known before any rank writes; never
  // filled: the ranks' blocks cover every element.
  checked(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
  checked(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  checked(H5Pset_obj_track_times(dcpl.get(), false), "H5Pset_obj_track_times");
  // The groups on the way to each tensor, made here (intermediate groups
  // that H5Dcreate2 made would take HDF5's default, times tracked).
  std::set<std::string> groups;
  for (const TensorEntry& t : tensors)
    for (std::size_t at = t.path.find('/', 1); at != std::string::npos; at = t.path.find('/', at + 1)) {
      const std::string group = t.path.substr(0, at);
      if (!groups.insert(group).second) continue;
      Handle g(checked(H5Gcreate2(f.get(), group.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
                       what + ": creating group '" + group + "'"),
               H5Gclose);
    }
  for (TensorEntry& t : tensors) {
    const std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    Handle space(checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple"),
                 H5Sclose);
    Handle dset(
        checked(H5Dcreate2(f.get(), t.path.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                what + ": creating tensor '" + t.path + "'"),
        H5Dclose);
    const std::uint64_t zero = 0;
    write_attr(dset.get(), kDigestAttr, H5T_STD_U64LE, H5T_NATIVE_UINT64, &zero);
    const haddr_t at = H5Dget_offset(dset.get());
    require(at != HADDR_UNDEF, what + ": tensor '" + t.path + "' has no storage (" + hdf5_error_text() + ")");
    t.offset = static_cast<std::uint64_t>(at);
  }
  haddr_t eoa = 0;
  checked(H5Fget_eoa(f.get(), &eoa), "H5Fget_eoa");
  size_ = static_cast<std::uint64_t>(eoa);
  h5_ = f.release();
}

FileBuilder::~FileBuilder() {
  if (h5_ >= 0) H5Fclose(h5_);  // a few MiB at most, off the checkpoint's file system
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) ::unlink(path_.c_str());
}

void FileBuilder::create_target(const std::string& file) const {
  Fd fd(file, O_WRONLY | O_CREAT | O_EXCL);
  if (!fd.ok()) throw sys_error("cannot create '" + file + "'");
  reserve(fd.get(), size_, file);
  if (!fd.close()) throw sys_error("cannot close '" + file + "'");
}

void FileBuilder::finish(const std::vector<TensorEntry>& tensors, const std::string& file) {
  const std::string what = "completing the checkpoint's HDF5 metadata";
  {
    Handle f(std::exchange(h5_, -1), H5Fclose);
    for (const TensorEntry& t : tensors) {
      Handle dset(checked(H5Dopen2(f.get(), t.path.c_str(), H5P_DEFAULT), what + ": tensor '" + t.path + "'"),
                  H5Dclose);
      Handle attr(checked(H5Aopen(dset.get(), kDigestAttr, H5P_DEFAULT), what), H5Aclose);
      checked(H5Awrite(attr.get(), H5T_NATIVE_UINT64, &t.digest), what + ": tensor '" + t.path + "'");
    }
    f.close(what);
  }
  // The metadata, byte for byte, into the real file: everything outside the
  // raw data, up to the image's final size (closing may give back space).
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw sys_error(what);
  const auto final_size = static_cast<std::uint64_t>(st.st_size);
  Fd out(file, O_WRONLY);
  if (!out.ok()) throw sys_error("cannot open '" + file + "'");
  if (final_size != size_) reserve(out.get(), final_size, file);
  std::vector<char> buf(1 << 16);
  auto copy_range = [&](std::uint64_t from, std::uint64_t to) {
    while (from < to) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(to - from, buf.size()));
      const ssize_t n = ::pread(fd_, buf.data(), want, static_cast<off_t>(from));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw sys_error(what + ": reading the in-memory file");
      std::size_t done = 0;
      while (done < static_cast<std::size_t>(n)) {
        const ssize_t w =
            ::pwrite(out.get(), buf.data() + done, static_cast<std::size_t>(n) - done, static_cast<off_t>(from + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw sys_error("writing the metadata of '" + file + "' failed");
        done += static_cast<std::size_t>(w);
      }
      from += static_cast<std::uint64_t>(n);
    }
  };
  std::uint64_t at = 0;
  for (const Extent& e : extents_of(tensors)) {
    copy_range(at, std::min(e.offset, final_size));
    at = e.offset + e.bytes;
  }
  if (at < final_size) copy_range(at, final_size);
  if (::fsync(out.get()) != 0) throw sys_error("cannot sync '" + file + "'");
  if (!out.close()) throw sys_error("cannot close '" + file + "'");
}

void write_manifest(const std::string& dir, const std::vector<TensorEntry>& tensors) {
  const std::string file = dir + "/" + kFileName;
  const std::vector<Extent> extents = extents_of(tensors);
  const std::uint64_t size = file_size(file);
  std::ostringstream os;
  os << kManifestMagic << ' ' << kVersion << "\nfile " << kFileName << "\nsize " << size << "\nmetadata "
     << hex64(metadata_hash(file, size, extents)) << '\n';
  for (const Extent& e : extents) os << "extent " << e.offset << ' ' << e.bytes << ' ' << e.path << '\n';
  std::string text = os.str();
  text += "manifest " + hex64(hash_bytes(text.data(), text.size())) + "\n";
  write_synced(dir + "/" + kManifestName, text);
}

Index read_index(const std::string& dir) {
  quiet_hdf5();
  const std::string file = dir + "/" + kFileName;
  const std::string broken = "checkpoint '" + file + "' is corrupted or truncated (";
  const std::string fix = "); " + std::string(kResumeHint);

  // 1. The manifest, on its own.
  const std::string manifest = dir + "/" + kManifestName;
  std::error_code ec;
  if (!std::filesystem::exists(manifest, ec)) throw Error(broken + "no " + kManifestName + fix);
  const std::string text =
      read_small_file(manifest, kManifestMaxBytes, {"checkpoint manifest '" + manifest + "'", kResumeHint});
  std::istringstream lines(text);
  std::string magic;
  int version = 0;
  if (!(lines >> magic >> version) || magic != kManifestMagic)
    throw Error(broken + kManifestName + " is not an ndmini manifest" + fix);
  if (version != kVersion)
    throw Error("checkpoint '" + file + "' is in format " + std::to_string(version) + "; this ndmini reads format " +
                std::to_string(kVersion) + ": finish that run with the ndmini that wrote it, or start a fresh run");
  const auto tail = text.rfind("manifest ");
  std::uint64_t stated = 0, actual = 0;
  if (tail == std::string::npos || tail == 0 || text[tail - 1] != '\n' ||
      !parse_hex64(text.substr(tail + 9, 16), stated) || text.size() != tail + 9 + 16 + 1 ||
      (actual = hash_bytes(text.data(), tail)) != stated)
    throw Error(broken + kManifestName + " is damaged: its own hash does not match" + fix);
  std::string key, name, meta_hex;
  std::uint64_t size = 0, meta = 0;
  if (!(lines >> key >> name) || key != "file" || name != kFileName || !(lines >> key >> size) || key != "size" ||
      !(lines >> key >> meta_hex) || key != "metadata" || !parse_hex64(meta_hex, meta))
    throw Error(broken + kManifestName + " is unreadable" + fix);
  std::vector<Extent> extents;
  std::set<std::string> paths;
  while (lines >> key && key == "extent") {
    Extent e;
    if (!(lines >> e.offset >> e.bytes >> e.path)) throw Error(broken + kManifestName + " is unreadable" + fix);
    const std::uint64_t from = extents.empty() ? 0 : extents.back().offset + extents.back().bytes;
    if (e.offset < from || e.bytes > size || e.offset > size - e.bytes || !paths.insert(e.path).second)
      throw Error(broken + kManifestName + " lists overlapping or out-of-file extents" + fix);
    extents.push_back(std::move(e));
  }

  // 2. The file against it: size, then every byte HDF5 will parse.
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) throw Error(broken + "the file is missing" + fix);
  require_regular_file(file, {"checkpoint '" + file + "'", kResumeHint});
  const auto on_disk = static_cast<std::uint64_t>(st.st_size);
  if (on_disk != size)
    throw Error(broken + "it has " + std::to_string(on_disk) + " bytes, the manifest says " + std::to_string(size) +
                fix);
  const std::uint64_t got = metadata_hash(file, size, extents);
  if (got != meta)
    throw Error(broken + "its metadata hash " + hex64(got) + " is not " + hex64(meta) + ", the manifest's" + fix);

  // 3. Now HDF5 may read it.
  const std::string where = "checkpoint '" + file + "'";
  Index index;
  index.file_bytes = size;
  Handle fapl = file_access();
  Handle f(checked(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl.get()), where + " cannot be opened"), H5Fclose);
  const auto fv = read_attr<std::int64_t>(f.get(), "format_version", H5T_NATIVE_INT64, where);
  require(fv == kVersion, where + " has format_version " + std::to_string(fv) + " but its manifest says " +
                              std::to_string(kVersion) + "; it is corrupted; " + kResumeHint);
  CheckpointInfo& info = index.info;
  for_each_field(info, [&](const char* name, auto& value) { read_field(f.get(), name, value, where); });
  require_step_matches_folder(dir, info.step);

  for (const Extent& e : extents) {
    const std::string tag = where + ": tensor '" + e.path + "'";
    require(link_exists(f.get(), e.path), tag + " is listed in the manifest but missing; " + kResumeHint);
    Handle dset(checked(H5Dopen2(f.get(), e.path.c_str(), H5P_DEFAULT), tag + " cannot be opened"), H5Dclose);
    Handle type(checked(H5Dget_type(dset.get()), "H5Dget_type"), H5Tclose);
    require(H5Tequal(type.get(), H5T_IEEE_F32LE) > 0, tag + " is not float32 little-endian");
    Handle dcpl(checked(H5Dget_create_plist(dset.get()), "H5Dget_create_plist"), H5Pclose);
    require(H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl.get()) == 0,
            tag + " is not stored contiguously without filters");
    Handle space(checked(H5Dget_space(dset.get()), "H5Dget_space"), H5Sclose);
    const int ndims = checked(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims");
    std::vector<hsize_t> dims(static_cast<std::size_t>(ndims));
    checked(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims");
    TensorEntry t;
    t.path = e.path;
    t.shape.assign(dims.begin(), dims.end());
    t.offset = static_cast<std::uint64_t>(H5Dget_offset(dset.get()));
    require(t.offset == e.offset && t.bytes() == e.bytes && H5Dget_storage_size(dset.get()) == e.bytes,
            tag + " (shape " + shape_text(t.shape) + ") is not where the manifest puts it; it is corrupted; " +
                kResumeHint);
    t.digest = read_attr<std::uint64_t>(dset.get(), kDigestAttr, H5T_NATIVE_UINT64, tag);
    index.tensors.push_back(std::move(t));
  }
  f.close(where + ": closing it failed");
  std::sort(index.tensors.begin(), index.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.path < b.path; });
  return index;
}

}  // namespace ndmini::io::format
