// SPDX-License-Identifier: BSD-3-Clause
#include "io/inspect.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "io/digest.hpp"
#include "io/format.hpp"

namespace ndmini::io {
namespace {

namespace fs = std::filesystem;

// Bytes read per call when verifying (a multiple of 4: whole floats).
constexpr std::size_t kChunkBytes = std::size_t{16} << 20;

// element_digest of a tensor's raw data, read from the file in chunks.
std::uint64_t digest_of(int fd, const format::TensorEntry& t, const std::string& file) {
  std::vector<float> buf(kChunkBytes / 4);
  std::uint64_t sum = 0, done = 0;
  const std::uint64_t total = t.elements();
  while (done < total) {
    const std::uint64_t want = std::min<std::uint64_t>(total - done, buf.size());
    std::size_t got = 0;
    while (got < 4 * want) {
      const ssize_t n = ::pread(fd, reinterpret_cast<char*>(buf.data()) + got, 4 * want - got,
                                static_cast<off_t>(t.offset + 4 * done + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw Error("reading tensor '" + t.path + "' from '" + file + "' failed (" +
                    (n < 0 ? std::strerror(errno) : "end of file") + ")");
      got += static_cast<std::size_t>(n);
    }
    sum += element_digest(buf.data(), want, done);
    done += want;
  }
  return sum;
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (fs::is_regular_file(p, ec) && p.filename() == format::kFileName) p = p.parent_path();
  require(fs::is_directory(p, ec), "'" + path +
                                       "' does not exist; name a checkpoint folder (checkpoint.dir/step_N) "
                                       "or a checkpoint.dir");
  if (fs::exists(p / format::kManifestName, ec) || fs::exists(p / format::kFileName, ec)) return p.string();
  if (const auto step = read_latest_marker(p.string(), "name a step folder instead"))
    return (p / checkpoint_dirname(*step)).string();
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(p, ec))
    if (e.path().filename().string().rfind("step_", 0) == 0) steps.push_back(e.path().filename().string());
  std::sort(steps.begin(), steps.end());
  if (!steps.empty())
    throw Error("'" + path + "' has no 'latest' marker; name one of its checkpoints, e.g. '" +
                (p / steps.back()).string() + "'");
  throw Error("'" + path + "' is neither a checkpoint folder (no " + format::kManifestName +
              ") nor a checkpoint.dir (no 'latest' marker, no step_* folders)");
}

std::string describe_checkpoint(const std::string& dir) {
  const format::Index index = format::read_index(dir);
  const CheckpointInfo& info = index.info;
  std::ostringstream os;
  std::uint64_t bytes = 0;
  for (const auto& t : index.tensors) bytes += t.bytes();
  // Labels padded to the longest attribute name ("consumed_tokens").
  auto line = [&](const std::string& label) -> std::ostream& {
    return os << label << std::string(17 - label.size(), ' ');
  };
  line("checkpoint") << dir << " (format " << format::kVersion << "; manifest and metadata verified)\n";
  // The root attributes as stored; the deck (`config`) comes last, it is long.
  for_each_field(info, [&](const std::string& name, const auto& value) {
    if (name != "config") line(name) << value << "\n";
  });
  line("file") << format::kFileName << ", " << index.file_bytes << " bytes, " << index.tensors.size() << " tensors, "
               << bytes << " bytes of float32 data\n";
  line("tensors") << "path, shape, bytes, digest\n";
  for (const auto& t : index.tensors)
    os << "  " << t.path << "  " << format::shape_text(t.shape) << "  " << t.bytes() << "  " << hex64(t.digest) << "\n";
  os << "deck\n" << info.config;
  if (!info.config.empty() && info.config.back() != '\n') os << "\n";
  return os.str();
}

VerifyReport verify_checkpoint(const std::string& dir) {
  VerifyReport report;
  format::Index index;
  try {
    index = format::read_index(dir);
  } catch (const Error& e) {
    report.problems.push_back(e.what());
    return report;
  }
  const std::string file = dir + "/" + format::kFileName;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // read_index checked it
  if (fd < 0) {
    report.problems.push_back("cannot read '" + file + "': " + std::strerror(errno));
    return report;
  }
  for (const auto& t : index.tensors) {
    try {
      const std::uint64_t got = digest_of(fd, t, file);
      if (got != t.digest)
        report.problems.push_back("tensor '" + t.path + "' does not match its digest (read " + hex64(got) + ", saved " +
                                  hex64(t.digest) + ")");
    } catch (const Error& e) {
      report.problems.push_back(e.what());
    }
    ++report.tensors;
    report.bytes += t.bytes();
  }
  ::close(fd);
  return report;
}

}  // namespace ndmini::io
