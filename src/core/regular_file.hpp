// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Every file ndmini reads (the deck, data files, a checkpoint's `latest`
// marker and manifest, /proc) goes through here. It must be a regular file,
// checked before a byte is read: a FIFO would block the open or the read
// forever, a device such as /dev/zero never ends, a folder reads as nothing.
// Its size is known (and bounded by the caller) before any memory is
// allocated for it. Each refusal is one Error naming the file and the fix.
#include <cstddef>
#include <cstdint>
#include <string>

namespace ndmini {

// How messages name a file, and what would fix a refusal.
struct FileUse {
  std::string name;  // the file as the user knows it: "deck 'run.toml'", "data.path = \"a.txt\""
  std::string fix;   // "name a .toml file"
};

// Throws Error unless `path` (symbolic links followed) is a regular file:
// "<name> does not exist; <fix>", "<name> is a FIFO, not a regular file; <fix>".
void require_regular_file(const std::string& path, const FileUse& use);

// A regular file open for reading. Checked with stat before the open, which
// is non-blocking (a FIFO swapped in meanwhile cannot block it), and with
// fstat after it; its size is the one fstat saw. Reads stay within that size,
// so a file that grows meanwhile costs no more memory.
class RegularFile {
 public:
  RegularFile(const std::string& path, const FileUse& use);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  std::uint64_t size() const { return size_; }
  // Exactly `bytes` from `offset` (which must lie within size()); throws
  // Error naming the file should it end early (it shrank).
  void read_exact(std::uint64_t offset, void* data, std::size_t bytes) const;
  // Up to `bytes` from `offset`, regardless of size(); fewer only at the end
  // of the file. For files that report no size (/proc).
  std::size_t read_up_to(std::uint64_t offset, void* data, std::size_t bytes) const;

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
  FileUse use_;
};

// The /proc files ndmini reads (meminfo, self/status) hold a few KiB.
inline constexpr std::uint64_t kProcFileMaxBytes = std::uint64_t{64} << 10;

// The whole of a regular file of at most `max_bytes`: refused from its size
// before anything is read ("<name> has N bytes; ndmini reads at most M from
// it; <fix>"), and never read past max_bytes should it grow meanwhile or
// report no size (as /proc files do).
std::string read_small_file(const std::string& path, std::uint64_t max_bytes, const FileUse& use);

}  // namespace ndmini
