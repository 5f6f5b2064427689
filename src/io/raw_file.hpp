// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Internal to io/: raw file I/O of the checkpoint's data, rank by rank
// (MPI-IO writes, pread from several threads), and the threads of a load.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.hpp"

namespace ndmini::io::detail {

// One MPI-IO write or pread moves at most this many bytes (MPI's count is an int).
constexpr std::uint64_t kMaxIoBytes = std::uint64_t{1} << 30;

// MPI's text for an error code, its innermost line only: ROMIO reports
// "Other I/O error , error stack:\nADIOI_GEN_WRITECONTIG(80): Other I/O error
// No space left on device", whose last part says it all.
std::string mpi_error_text(int code);

// This rank's own handles on the checkpoint file: for writing, an MPI-IO
// handle (MPI_COMM_SELF); for reading and the page-cache hints (writeback,
// readahead), a plain descriptor, as pread runs from several threads at
// once where MPI-IO calls would be serialised by the library's lock. Every
// call is independent, so its errors are this rank's alone, and the phase
// agreement carries them to the others.
//
// A background writer (checkpoint.async) passes posix = true: its thread may
// not call MPI while the main thread trains (MPI_THREAD_MULTIPLE is not
// assumed), so it writes with pwrite on the descriptor and syncs with fsync.
// The bytes on disk are the same.
class RawFile {
 public:
  RawFile(const std::string& path, bool write, bool posix = false) : path_(path) {
    if (write && posix) {
      fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);  // rank 0 created it; a FIFO cannot block
      if (fd_ < 0) throw Error("cannot open '" + path + "' (" + std::strerror(errno) + ")");
      posix_writer_ = true;
      return;
    }
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
    if (posix_writer_) {
      while (bytes > 0) {
        const ssize_t n =
            ::pwrite(fd_, p, static_cast<std::size_t>(std::min(bytes, kMaxIoBytes)), static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
          throw Error("writing '" + path_ + "' failed at byte " + std::to_string(offset) + " (" +
                      (n < 0 ? std::string(std::strerror(errno)) : std::string("no byte written")) + ")");
        p += n;
        offset += static_cast<std::uint64_t>(n);
        bytes -= static_cast<std::uint64_t>(n);
      }
      return;
    }
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
    if (posix_writer_) {
      const int fd = fd_;
      fd_ = -1;
      if (sync && ::fsync(fd) != 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        throw Error("cannot sync '" + path_ + "' (" + why + ")");
      }
      if (::close(fd) != 0) throw Error("cannot close '" + path_ + "' (" + std::strerror(errno) + ")");
      return;
    }
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
  bool posix_writer_ = false;  // writes through fd_ (pwrite, fsync) rather than MPI-IO
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

}  // namespace ndmini::io::detail
