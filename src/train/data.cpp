// SPDX-License-Identifier: BSD-3-Clause
#include "train/data.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.hpp"
#include "core/regular_file.hpp"
#include "core/rng.hpp"
#include "io/digest.hpp"

namespace ndmini {
namespace {

constexpr std::int32_t kTokenFileMagic = 20240520;
constexpr int kHeaderInts = 256;
// A file source is identified by its size and a hash of its first MiB
// (header and opening tokens): cheap, and enough to tell files apart.
constexpr std::size_t kDigestBytes = std::size_t{1} << 20;

// A task with learnable structure: each sequence walks a fixed random graph
// over an alphabet of A = min(V, 64) tokens where every token has two
// successors, picked by a coin per position. A model can learn the graph,
// so the loss can fall from ln V towards ln 2.
class SyntheticSource final : public DataSource {
 public:
  // `held_out`: the validation stream, the same graph walked with coins
  // from another seed stream, so no training sequence is drawn from it.
  SyntheticSource(const Config& cfg, bool held_out)
      : seq_len_(cfg.model.seq_len),
        global_batch_(cfg.train.global_batch),
        alphabet_(std::min(cfg.model.vocab, 64)),
        held_out_(held_out),
        graph_key_(rng::stream_key(cfg.train.seed, "data/synthetic/graph")),
        walk_key_(rng::stream_key(cfg.train.seed, held_out ? "data/synthetic/validation" : "data/synthetic/walk")) {}

  void fill(std::int64_t step, int first, int count, token_t* inputs, token_t* targets) const override {
    for (int b = 0; b < count; ++b) {
      const std::uint64_t seq = static_cast<std::uint64_t>(step) * global_batch_ + first + b;
      const std::uint64_t base = seq * (seq_len_ + 1);
      token_t x = static_cast<token_t>(rng::bits(walk_key_, base) % alphabet_);
      for (int t = 0; t < seq_len_; ++t) {
        const std::uint64_t coin = rng::bits(walk_key_, base + t + 1) & 1;
        const token_t next =
            static_cast<token_t>(rng::bits(graph_key_, 2 * static_cast<std::uint64_t>(x) + coin) % alphabet_);
        inputs[b * seq_len_ + t] = x;
        targets[b * seq_len_ + t] = next;
        x = next;
      }
    }
  }
  std::string describe() const override {
    return std::string(held_out_ ? "synthetic, held-out walks" : "synthetic") +
           " (random walk on a 2-successor graph over " + std::to_string(alphabet_) + " tokens)";
  }
  // The stream is a function of the deck's seed and shape, which resume checks already.
  io::DataRecord provenance() const override { return {"synthetic", "", 0, ""}; }

 private:
  int seq_len_, global_batch_, alphabet_;
  bool held_out_;
  std::uint64_t graph_key_, walk_key_;
};

// A token stream read in order: sequence b of step s starts at
// ((s * B + b) * T) mod (N - T - 1).
class StreamSource final : public DataSource {
 public:
  StreamSource(std::vector<token_t> tokens, const Config& cfg, std::string what, io::DataRecord record)
      : tokens_(std::move(tokens)),
        seq_len_(cfg.model.seq_len),
        global_batch_(cfg.train.global_batch),
        what_(std::move(what)),
        record_(std::move(record)) {}

  void fill(std::int64_t step, int first, int count, token_t* inputs, token_t* targets) const override {
    const std::uint64_t n = tokens_.size();
    const std::uint64_t span = n - seq_len_ - 1;
    for (int b = 0; b < count; ++b) {
      const std::uint64_t o = ((static_cast<std::uint64_t>(step) * global_batch_ + first + b) * seq_len_) % span;
      std::copy_n(tokens_.data() + o, seq_len_, inputs + static_cast<std::size_t>(b) * seq_len_);
      std::copy_n(tokens_.data() + o + 1, seq_len_, targets + static_cast<std::size_t>(b) * seq_len_);
    }
  }
  std::string describe() const override { return what_ + " (" + std::to_string(tokens_.size()) + " tokens)"; }
  io::DataRecord provenance() const override { return record_; }

 private:
  std::vector<token_t> tokens_;
  int seq_len_, global_batch_;
  std::string what_;
  io::DataRecord record_;
};

// How messages name the file `key` (data.path, data.val_path) gives.
FileUse data_file(const std::string& key, const std::string& path, const std::string& kind) {
  return {key + " = \"" + path + "\"", "point " + key + " at " + kind};
}

constexpr const char* kTextKind = "a text file (data.source = \"text\" reads any file as bytes)";
constexpr const char* kTokensKind = "an llm.c .bin token file (data.source = \"tokens\")";
// Read in pieces of this size: a file source costs its tokens, not its bytes as well.
constexpr std::size_t kPieceBytes = std::size_t{1} << 20;

io::DataRecord record_of(const std::string& kind, const std::string& path, const RegularFile& file) {
  std::vector<char> head(static_cast<std::size_t>(std::min<std::uint64_t>(file.size(), kDigestBytes)));
  file.read_exact(0, head.data(), head.size());
  return {kind, path, file.size(), io::hex64(io::hash_bytes(head.data(), head.size()))};
}

// Calls take(piece, bytes) on [offset, offset + bytes) of `file`, in pieces of kPieceBytes.
template <class Take>
void read_in_pieces(const RegularFile& file, std::uint64_t offset, std::uint64_t bytes, Take take) {
  std::vector<char> piece(static_cast<std::size_t>(std::min<std::uint64_t>(bytes, kPieceBytes)));
  for (std::uint64_t done = 0; done < bytes;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes - done, piece.size()));
    file.read_exact(offset + done, piece.data(), n);
    take(piece.data(), n);
    done += n;
  }
}

std::string record_text(const io::DataRecord& r) {
  if (r.kind == "synthetic" || r.kind.empty()) return r.kind.empty() ? "an unrecorded source" : "synthetic data";
  return r.kind + " '" + r.path + "' (" + std::to_string(r.bytes) + " bytes, first-MiB digest " + r.digest + ")";
}

void require_long_enough(std::size_t n, const Config& cfg, const std::string& key, const std::string& path) {
  const std::string named = key + " = \"" + path + "\"";
  const std::size_t need = static_cast<std::size_t>(cfg.model.seq_len) + 2;
  require(n >= need, named + ": the file holds " + std::to_string(n) +
                         " tokens, too short for model.seq_len = " + std::to_string(cfg.model.seq_len) +
                         " (needs at least " + std::to_string(need) + "); use a longer file or a smaller seq_len");
}

// The file's size was bounded before: require_memory_fits counts its tokens
// (run/budget.hpp); it is read up to that size, however it grows meanwhile.
std::vector<token_t> read_text(const std::string& key, const std::string& path, const Config& cfg,
                               io::DataRecord& record) {
  const RegularFile file(path, data_file(key, path, kTextKind));
  record = record_of("text", path, file);
  std::vector<token_t> tokens;
  tokens.reserve(static_cast<std::size_t>(file.size()));
  read_in_pieces(file, 0, file.size(), [&](const char* bytes, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) tokens.push_back(static_cast<unsigned char>(bytes[i]));
  });
  require_long_enough(tokens.size(), cfg, key, path);
  return tokens;
}

// The header is checked against the file's size before any token is read,
// as llm.c's own loader does: a count that does not match is refused, not trusted.
std::vector<token_t> read_tokens(const std::string& key, const std::string& path, const Config& cfg,
                                 io::DataRecord& record) {
  const FileUse use = data_file(key, path, kTokensKind);
  const std::string& named = use.name;
  const RegularFile file(path, use);
  const std::size_t header_bytes = kHeaderInts * sizeof(std::int32_t);
  require(file.size() >= header_bytes, named + ": its " + std::to_string(file.size()) +
                                           " bytes are shorter than the 1024-byte llm.c header; not a token file");
  std::int32_t header[kHeaderInts];
  file.read_exact(0, header, header_bytes);
  require(header[0] == kTokenFileMagic, named + ": bad magic " + std::to_string(header[0]) +
                                            " (an llm.c token file starts with " + std::to_string(kTokenFileMagic) +
                                            "); is this a .bin written by llm.c's data scripts?");
  require(header[1] == 1, named + ": unsupported token file version " + std::to_string(header[1]) +
                              " (ndmini reads version 1, uint16 tokens)");
  const std::uint64_t count = static_cast<std::uint32_t>(header[2]);
  const std::uint64_t expected = header_bytes + sizeof(std::uint16_t) * count;
  require(file.size() == expected,
          named + ": its header says " + std::to_string(count) + " tokens, " + std::to_string(expected) +
              " bytes with the header, but the file has " + std::to_string(file.size()) +
              " bytes; it is truncated or not an llm.c token file (regenerate it with llm.c's data scripts)");
  record = record_of("tokens", path, file);
  std::vector<token_t> tokens;
  tokens.reserve(static_cast<std::size_t>(count));
  token_t largest = 0;
  read_in_pieces(file, header_bytes, file.size() - header_bytes, [&](const char* bytes, std::size_t n) {
    for (std::size_t i = 0; i + 1 < n; i += 2) {
      std::uint16_t t;
      std::memcpy(&t, bytes + i, 2);
      tokens.push_back(t);
      largest = std::max<token_t>(largest, t);
    }
  });
  require(largest < cfg.model.vocab, named + ": holds token id " + std::to_string(largest) +
                                         " but model.vocab = " + std::to_string(cfg.model.vocab) +
                                         "; raise model.vocab (GPT-2 files need 50257 or more, e.g. 50304)");
  require_long_enough(tokens.size(), cfg, key, path);
  return tokens;
}

}  // namespace

namespace {

std::vector<token_t> read_source(const std::string& key, const std::string& path, const Config& cfg,
                                 io::DataRecord& record) {
  return cfg.data.source == "text" ? read_text(key, path, cfg, record) : read_tokens(key, path, cfg, record);
}

DataSources make_sources(const Config& cfg, bool validation) {
  const auto& d = cfg.data;
  DataSources out;
  validation = validation && cfg.train.eval_every > 0;
  if (d.source == "synthetic") {
    out.train = std::make_unique<SyntheticSource>(cfg, false);
    if (validation) out.validation = std::make_unique<SyntheticSource>(cfg, true);
    return out;
  }
  io::DataRecord record;
  std::vector<token_t> tokens = read_source("data.path", d.path, cfg, record);
  const std::string what = d.source + " " + d.path;
  if (d.val_fraction > 0) {
    // The last val_fraction of the tokens is held out: training never reads it.
    const std::size_t held = static_cast<std::size_t>(static_cast<double>(tokens.size()) * d.val_fraction);
    const std::size_t need = static_cast<std::size_t>(cfg.model.seq_len) + 2;
    const std::string fraction = "data.val_fraction = " + shortest_float(d.val_fraction) + " of the " +
                                 std::to_string(tokens.size()) + " tokens of data.path = \"" + d.path + "\"";
    require(held >= need, fraction + " holds out " + std::to_string(held) + " tokens, too few for model.seq_len = " +
                              std::to_string(cfg.model.seq_len) + " (needs at least " + std::to_string(need) +
                              "); raise data.val_fraction or use a longer file");
    require(tokens.size() - held >= need,
            fraction + " leaves " + std::to_string(tokens.size() - held) +
                " tokens to train on, too few for model.seq_len = " + std::to_string(cfg.model.seq_len) +
                " (needs at least " + std::to_string(need) + "); lower data.val_fraction");
    if (validation)
      out.validation = std::make_unique<StreamSource>(
          std::vector<token_t>(tokens.end() - static_cast<std::ptrdiff_t>(held), tokens.end()), cfg,
          what + ", its held-out end", record);
    tokens.resize(tokens.size() - held);
    out.train = std::make_unique<StreamSource>(std::move(tokens), cfg, what + ", less the held-out end", record);
    return out;
  }
  out.train = std::make_unique<StreamSource>(std::move(tokens), cfg, what, record);
  if (validation) {
    io::DataRecord val_record;
    auto val = read_source("data.val_path", d.val_path, cfg, val_record);
    out.validation = std::make_unique<StreamSource>(std::move(val), cfg, d.source + " " + d.val_path, val_record);
  }
  return out;
}

}  // namespace

DataSources make_data_sources(const Config& cfg) { return make_sources(cfg, true); }

std::unique_ptr<DataSource> make_data_source(const Config& cfg) { return std::move(make_sources(cfg, false).train); }

std::string check_resume_data(const io::DataRecord& saved, const io::DataRecord& current, const DataConfig& deck,
                              const std::string& where) {
  const bool same = saved.kind == current.kind && saved.bytes == current.bytes && saved.digest == current.digest;
  if (same)
    return saved.path == current.path ? ""
                                      : "data: " + where + " was trained on '" + saved.path + "'; the deck reads '" +
                                            current.path + "', with the same size and digest";
  if (deck.allow_source_change)
    return "data: continuing " + where + ", trained on " + record_text(saved) + ", on " + record_text(current) +
           " (data.allow_source_change = true)";
  throw Error("cannot resume from " + where + ": it was trained on " + record_text(saved) + ", the deck reads " +
              record_text(current) +
              "; resume with the data it was trained on, or set data.allow_source_change = true to continue on the "
              "new data on purpose");
}

void write_token_file(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  std::int32_t header[kHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  require(out.good(), "cannot write '" + path + "'");
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  require(out.good(), "write to '" + path + "' failed");
}

}  // namespace ndmini
