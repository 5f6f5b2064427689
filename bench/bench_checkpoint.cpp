// SPDX-License-Identifier: BSD-3-Clause
// Checkpoint write and read bandwidth of a deck's model and AdamW state
// (gpt2-124m.toml by default: about 1.5 GB), on the ranks launched, next to
// `dd` writing (conv=fsync) and reading the same number of bytes in the same
// folder in the same run. The state is split over the ranks as FSDP splits it
// (a flat 1/n of every tensor per rank). Each repetition saves (split into
// create, raw write, digest, flush, metadata, commit), drops the file from
// the page cache, loads it back and checks every value.
//
//   mpiexec -n 2 bench_checkpoint [--deck inputs/gpt2-124m.toml] [--dir DIR] [--reps 3] [--no-dd]
//
// DIR (default: a fresh folder under $TMPDIR or /tmp) should be on the file
// system under test; the program removes what it wrote. bench/checkpoint_io.sh
// runs it on 1 and 2 ranks.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "core/timer.hpp"
#include "io/checkpoint.hpp"
#include "model/gpt.hpp"
#include "parallel/pipeline/schedule.hpp"

namespace {

namespace fs = std::filesystem;
using ndmini::Clock;
using ndmini::seconds_since;
constexpr double kGB = 1e9;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// Rank 0 runs `command` while the others wait without spinning (MPICH's
// barrier busy-polls, which would steal the cores dd needs). Returns seconds.
double timed_on_rank0(MPI_Comm comm, const std::string& command) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  double s = 0;
  if (rank == 0) {
    const auto t0 = Clock::now();
    if (std::system(command.c_str()) != 0) std::fprintf(stderr, "bench_checkpoint: '%s' failed\n", command.c_str());
    s = seconds_since(t0);
  }
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  for (int done = 0; !done;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  MPI_Bcast(&s, 1, MPI_DOUBLE, 0, comm);
  return s;
}

// Evicts a file from the page cache (after it was synced), so a read is a read.
void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string range(const std::vector<double>& v, const char* fmt) {
  char buf[128], a[32], b[32], c[32];
  std::snprintf(a, sizeof a, fmt, median(v));
  std::snprintf(b, sizeof b, fmt, *std::min_element(v.begin(), v.end()));
  std::snprintf(c, sizeof c, fmt, *std::max_element(v.begin(), v.end()));
  std::snprintf(buf, sizeof buf, "%s (%s-%s)", a, b, c);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::string deck = std::string(NDMINI_SOURCE_DIR) + "/inputs/gpt2-124m.toml", dir;
  int reps = 3;
  bool dd = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--deck" && i + 1 < argc) {
      deck = argv[++i];
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no-dd") {
      dd = false;
    } else {
      if (rank == 0) std::fprintf(stderr, "usage: bench_checkpoint [--deck D] [--dir DIR] [--reps N] [--no-dd]\n");
      MPI_Finalize();
      return 2;
    }
  }
  int status = 0;
  try {
    const ndmini::Config cfg = ndmini::load_config(deck);
    // The folder under test: one per run, named by rank 0.
    char name[4096] = {};
    if (rank == 0) {
      const fs::path base = dir.empty() ? fs::temp_directory_path() : fs::path(dir);
      fs::create_directories(base);
      const fs::path mine = base / ("ndmini-bench-ckpt." + std::to_string(::getpid()));
      std::snprintf(name, sizeof name, "%s", mine.c_str());
    }
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
    const std::string root = name;

    // This rank's flat 1/n of every tensor of the model and the two AdamW moments.
    const ndmini::ParamLayout layout =
        ndmini::gpt_param_layout(cfg.model, ndmini::StagePlan(cfg.model.layers, 1, 1).chunks_of(0));
    std::vector<std::vector<float>> memory;
    std::vector<ndmini::io::TensorSlab> slabs;
    std::uint64_t total_bytes = 0;
    int salt = 0;
    for (const char* prefix : {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"}) {
      for (const auto& p : layout.params) {
        ++salt;
        const std::vector<std::uint64_t> shape(p.global_shape.begin(), p.global_shape.end());
        total_bytes += 4 * p.size;
        const std::size_t lo = p.size * rank / ranks, hi = p.size * (rank + 1) / ranks;
        const auto blocks = ndmini::global_blocks(p, 0, lo, hi);
        if (blocks.empty()) {
          const std::vector<std::uint64_t> zero(shape.size(), 0);
          slabs.push_back({prefix + p.name, shape, zero, zero, nullptr, false});
        }
        for (const auto& b : blocks) {
          std::uint64_t n = 1;
          for (auto c : b.count) n *= c;
          memory.emplace_back(n);
          for (std::uint64_t k = 0; k < n; ++k) memory.back()[k] = static_cast<float>(salt) + 1e-6f * (lo + k);
          slabs.push_back({prefix + p.name, shape, b.offset, b.count, memory.back().data(), false});
        }
      }
    }
    const auto expected = memory;
    const std::uint64_t dd_count = (total_bytes + kMiB - 1) / kMiB;
    if (rank == 0)
      std::printf("checkpoint of %s: %zu tensors, %.3f GB, %d rank(s), folder %s\n", deck.c_str(),
                  3 * layout.params.size(), total_bytes / kGB, ranks, root.c_str());

    std::vector<double> dd_w, dd_r, save_s, load_s, create, write, digest, flush, meta, commit, prune;
    for (int rep = 0; rep < reps; ++rep) {
      if (dd) {
        const std::string target = root + "/dd.bin";
        dd_w.push_back(timed_on_rank0(MPI_COMM_WORLD, "mkdir -p '" + root + "' && dd if=/dev/zero of='" + target +
                                                          "' bs=1M count=" + std::to_string(dd_count) +
                                                          " conv=fsync status=none"));
        if (rank == 0) drop_cache(target);
        dd_r.push_back(timed_on_rank0(
            MPI_COMM_WORLD, "dd if='" + target + "' of=/dev/null bs=1M status=none && rm -f '" + target + "'"));
      }
      ndmini::io::CheckpointInfo info;
      info.step = rep + 1;
      info.config = cfg.toml;
      ndmini::io::SaveTimes t;
      ndmini::io::SaveOptions options;
      options.times = &t;
      ndmini::io::save_checkpoint(MPI_COMM_WORLD, root, info, slabs, 1, options);
      save_s.push_back(t.total);
      create.push_back(t.create);
      write.push_back(t.write);
      digest.push_back(t.digest);
      flush.push_back(t.flush);
      meta.push_back(t.metadata);
      commit.push_back(t.commit);
      prune.push_back(t.prune);
      if (rank == 0) drop_cache(root + "/" + ndmini::io::checkpoint_dirname(rep + 1) + "/checkpoint.h5");
      for (auto& m : memory) std::fill(m.begin(), m.end(), -1.0f);
      MPI_Barrier(MPI_COMM_WORLD);
      double load = 0;
      ndmini::io::load_checkpoint(MPI_COMM_WORLD, root, std::nullopt, slabs, &load);
      load_s.push_back(load);
      int wrong = memory != expected;
      MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (wrong) throw std::runtime_error("the loaded state differs from the saved one");
      if (rank == 0)
        std::printf(
            "rep %d: save %.2f s (create %.2f, write %.2f incl. digest %.2f, flush %.2f, metadata %.2f, commit "
            "%.2f, prune %.2f) | load %.2f s | dd write %.2f s, read %.2f s\n",
            rep, t.total, t.create, t.write, t.digest, t.flush, t.metadata, t.commit, t.prune, load,
            dd ? dd_w.back() : 0.0, dd ? dd_r.back() : 0.0);
      std::fflush(stdout);
    }
    if (rank == 0) {
      auto rate = [&](const std::vector<double>& s) {
        std::vector<double> r;
        for (double x : s) r.push_back(total_bytes / x / kGB);
        return r;
      };
      std::printf("\nmedian (min-max) over %d repetitions, %d rank(s), %.3f GB:\n", reps, ranks, total_bytes / kGB);
      std::printf("| what | seconds | GB/s |\n|---|---|---|\n");
      std::printf("| save | %s | %s |\n", range(save_s, "%.2f").c_str(), range(rate(save_s), "%.2f").c_str());
      std::printf("|   create | %s | |\n", range(create, "%.2f").c_str());
      std::printf("|   raw write (page cache) | %s | |\n", range(write, "%.2f").c_str());
      std::printf("|     of which digest | %s | |\n", range(digest, "%.2f").c_str());
      std::printf("|   flush (sync) | %s | |\n", range(flush, "%.2f").c_str());
      std::printf("|   metadata | %s | |\n", range(meta, "%.2f").c_str());
      std::printf("|   commit (rename, latest) | %s | |\n", range(commit, "%.2f").c_str());
      std::printf("|   prune (older checkpoint) | %s | |\n", range(prune, "%.2f").c_str());
      std::printf("| load (cold cache) | %s | %s |\n", range(load_s, "%.2f").c_str(),
                  range(rate(load_s), "%.2f").c_str());
      if (dd) {
        std::printf("| dd write conv=fsync | %s | %s |\n", range(dd_w, "%.2f").c_str(),
                    range(rate(dd_w), "%.2f").c_str());
        std::printf("| dd read (cold cache) | %s | %s |\n", range(dd_r, "%.2f").c_str(),
                    range(rate(dd_r), "%.2f").c_str());
        std::vector<double> ws, rs;
        for (int i = 0; i < reps; ++i) {
          ws.push_back(100 * dd_w[i] / save_s[i]);
          rs.push_back(100 * dd_r[i] / load_s[i]);
        }
        std::printf("| save rate / dd write rate (same repetition) | %s %% | |\n", range(ws, "%.0f").c_str());
        std::printf("| load rate / dd read rate (same repetition) | %s %% | |\n", range(rs, "%.0f").c_str());
      }
      std::error_code ec;
      fs::remove_all(root, ec);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint: rank %d: %s\n", rank, e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
