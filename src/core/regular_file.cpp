// SPDX-License-Identifier: BSD-3-Clause
#include "core/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace ndmini {
namespace {

// What a file that is not a regular one is, for the message.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

void require_regular(mode_t mode, const FileUse& use) {
  if (!S_ISREG(mode)) throw Error(use.name + " is " + kind_of(mode) + ", not a regular file; " + use.fix);
}

[[noreturn]] void throw_unreadable(int err, const FileUse& use) {
  if (err == ENOENT || err == ENOTDIR) throw Error(use.name + " does not exist; " + use.fix);
  throw Error(use.name + " cannot be read (" + std::strerror(err) + "); " + use.fix);
}

}  // namespace

void require_regular_file(const std::string& path, const FileUse& use) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_unreadable(errno, use);
  require_regular(st.st_mode, use);
}

RegularFile::RegularFile(const std::string& path, const FileUse& use) : use_(use) {
  // stat first: opening a FIFO, even without blocking, is already more than
  // refusing it by name needs.
  require_regular_file(path, use);
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd_ < 0) throw_unreadable(errno, use);
  // And again on what was opened: the path may name something else by now.
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw_unreadable(err, use);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    require_regular(st.st_mode, use);
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

RegularFile::~RegularFile() { ::close(fd_); }

std::size_t RegularFile::read_up_to(std::uint64_t offset, void* data, std::size_t bytes) const {
  auto* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(use_.name + ": reading the file failed (" + std::strerror(errno) + "); " + use_.fix);
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

void RegularFile::read_exact(std::uint64_t offset, void* data, std::size_t bytes) const {
  if (read_up_to(offset, data, bytes) != bytes)
    throw Error(use_.name + " ended early, at fewer than its " + std::to_string(size_) +
                " bytes (was it changed while ndmini read it?); " + use_.fix);
}

std::string read_small_file(const std::string& path, std::uint64_t max_bytes, const FileUse& use) {
  const RegularFile file(path, use);
  const auto too_large = [&](const std::string& size) {
    return Error(use.name + " has " + size + " bytes; ndmini reads at most " + std::to_string(max_bytes) +
                 " bytes from it; " + use.fix);
  };
  if (file.size() > max_bytes) throw too_large(std::to_string(file.size()));
  // Read to the end, not to the size fstat saw: a /proc file reports 0. One
  // byte beyond the limit tells a file that grew past it from one that fits.
  const std::uint64_t capacity = std::min(std::max(file.size(), std::uint64_t{4096}), max_bytes + 1);
  std::string text(static_cast<std::size_t>(capacity), '\0');
  std::size_t got = 0;
  for (;;) {
    got += file.read_up_to(got, text.data() + got, text.size() - got);
    if (got > max_bytes) throw too_large("more than " + std::to_string(max_bytes));
    if (got < text.size()) break;
    text.resize(static_cast<std::size_t>(std::min<std::uint64_t>(2 * text.size(), max_bytes + 1)));
  }
  text.resize(got);
  return text;
}

}  // namespace ndmini
