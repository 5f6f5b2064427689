// SPDX-License-Identifier: BSD-3-Clause
#include "io/folder.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"
#include "core/regular_file.hpp"
#include "io/checkpoint.hpp"
#include "io/slabs.hpp"

namespace ndmini::io {
namespace detail {
namespace {

namespace fs = std::filesystem;

// The marker holds one step number (parse_step takes at most 18 digits) and a
// newline: 64 bytes leave room for stray whitespace, nothing more.
constexpr std::uint64_t kLatestMaxBytes = 64;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

Error sys_error(const std::string& what) { return Error(what + ": " + std::strerror(errno)); }

// Parses "123" strictly (digits only, fits in int64).
std::optional<std::int64_t> parse_step(const std::string& s) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(s);
}

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

bool is_stale_name(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const std::size_t n = std::strlen(suffix);
    return name.size() > n && name.compare(name.size() - n, n, suffix) == 0;
  };
  return name.rfind(".step_", 0) == 0 && (ends_with(".tmp") || ends_with(".old") || ends_with(".pruned"));
}

bool is_set_aside_name(const std::string& name) {
  const std::string suffix = ".pruned";
  return name.rfind(".step_", 0) == 0 && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Folders of saves that never committed (and replaced steps never removed),
// and the marker's temporary names; with keep_set_aside, not the steps
// prune set aside (remove_set_aside's, in the background).
void remove_stale(const fs::path& root, bool keep_set_aside = false) {
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (keep_set_aside && is_set_aside_name(name)) continue;
    if (is_stale_name(name) || name == std::string(kLatestName) + ".tmp" || name == std::string(kLatestName) + ".prev")
      fs::remove_all(entry.path());
  }
}

}  // namespace

std::string tmp_dirname(std::int64_t step) { return "." + checkpoint_dirname(step) + ".tmp"; }
std::string old_dirname(std::int64_t step) { return "." + checkpoint_dirname(step) + ".old"; }
std::string set_aside_dirname(std::int64_t step) { return "." + checkpoint_dirname(step) + ".pruned"; }

std::string marker_tmp_name() { return std::string(kLatestName) + ".tmp"; }

std::string marker_prev_name() { return std::string(kLatestName) + ".prev"; }

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

std::optional<std::int64_t> read_latest(const fs::path& root) {
  try {
    return read_latest_marker(root.string(), "pick a checkpoint with --resume STEP");
  } catch (const Error& e) {
    throw Error(e.what() + std::string(" (available steps: ") + available_text(root) + ")");
  }
}

std::int64_t read_latest_quietly(const fs::path& root) {
  try {
    return read_latest(root).value_or(-1);
  } catch (const Error&) {
    return -1;
  }
}

std::uint64_t needed_bytes(std::uint64_t data_bytes, std::size_t tensors) {
  return data_bytes + 8192 * static_cast<std::uint64_t>(tensors) + kMiB;
}

void require_free_space(const fs::path& root, std::uint64_t needed, const std::string& what) {
  const std::uint64_t available = free_bytes(root);
  require(available >= needed, "not enough free space in '" + root.string() + "' " + what + ": it needs about " +
                                   size_text(needed, true) + ", " + size_text(available, false) +
                                   " are free; free some space or set checkpoint.dir to a larger file system");
}

void prune(const fs::path& root, std::int64_t step, int keep, PruneMode mode) {
  std::vector<std::int64_t> older;
  for (auto s : committed_steps(root))
    if (s < step) older.push_back(s);
  const std::size_t keep_older = static_cast<std::size_t>(keep - 1);
  if (older.size() > keep_older) {
    for (std::size_t i = 0; i < older.size() - keep_older; ++i) {
      const fs::path dropped = root / checkpoint_dirname(older[i]);
      if (mode == PruneMode::set_aside) {
        fs::remove_all(root / set_aside_dirname(older[i]));  // a leftover of an earlier run: rename cannot replace it
        fs::rename(dropped, root / set_aside_dirname(older[i]));
      } else {
        fs::remove_all(dropped);
      }
    }
  }
  remove_stale(root, mode == PruneMode::set_aside);
}

std::string remove_set_aside(const fs::path& root) noexcept {
  std::string failed;
  try {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (!is_set_aside_name(entry.path().filename().string())) continue;
      std::error_code removing;
      fs::remove_all(entry.path(), removing);
      if (removing && failed.empty()) failed = "cannot remove '" + entry.path().string() + "': " + removing.message();
    }
    if (ec) failed = "cannot list '" + root.string() + "': " + ec.message();
  } catch (const std::exception& e) {  // a path or message allocation
    if (failed.empty()) failed = e.what();
  }
  return failed;
}

namespace {

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
}  // namespace detail

using namespace detail;

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
