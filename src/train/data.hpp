// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Training data (docs/model.md, "Data"): the global batch of step s is a pure
// function of (seed, s, data source), so every layout, and every resumed run,
// trains on the same tokens in the same order.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "core/types.hpp"
#include "io/checkpoint.hpp"

namespace ndmini {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Writes sequences [first, first + count) of the global batch of `step`
  // (global_batch sequences of seq_len tokens): inputs and their next-token
  // targets, count * seq_len each, row b * seq_len + t.
  virtual void fill(std::int64_t step, int first, int count, token_t* inputs, token_t* targets) const = 0;
  virtual std::string describe() const = 0;
  // What a checkpoint records of the source: kind, path, size, digest of the
  // first MiB (file sources).
  virtual io::DataRecord provenance() const = 0;
};

// Builds the source named by [data]; checks the file (exists, long enough,
// llm.c magic, tokens inside the vocabulary) and throws Error naming it.
// With data.val_fraction the training source is the file without its last
// val_fraction of tokens.
std::unique_ptr<DataSource> make_data_source(const Config& cfg);

// The training source and, when train.eval_every > 0, the held-out one the
// validation loss reads: the file data.val_path, the last data.val_fraction
// of data.path's tokens, or for the synthetic source walks drawn from a seed
// stream of their own ("data/synthetic/validation"; the same graph). Batch j
// of the validation loss is the validation source's batch of step j.
struct DataSources {
  std::unique_ptr<DataSource> train;
  std::unique_ptr<DataSource> validation;  // null when train.eval_every = 0
};
DataSources make_data_sources(const Config& cfg);

// A resumed run must continue on the data its checkpoint was trained on:
// throws Error naming both sources when `saved` (the checkpoint's record) and
// `current` differ in kind, size or digest, unless data.allow_source_change
// says the change is meant. Returns a note to print when the run goes on with
// a changed source or path, else "". `where` names the checkpoint.
std::string check_resume_data(const io::DataRecord& saved, const io::DataRecord& current, const DataConfig& deck,
                              const std::string& where);

// Writes an llm.c token file (256 int32 header, magic 20240520, version 1,
// token count; then uint16 tokens), e.g. to make a small corpus for a test.
void write_token_file(const std::string& path, const std::vector<std::uint16_t>& tokens);

}  // namespace ndmini
