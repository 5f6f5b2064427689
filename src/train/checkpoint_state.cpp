// SPDX-License-Identifier: BSD-3-Clause
#include "train/checkpoint_state.hpp"

#include <set>
#include <sstream>

#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"
#include "model/gpt.hpp"

namespace ndmini {
namespace {

// Calls f(piece, block) for every global block of every parameter piece this rank holds.
template <class F>
void for_each_block(const ParamStore& store, F&& f) {
  for (const auto& piece : store.pieces()) {
    const ParamInfo& p = store.layout().params[piece.param];
    for (const auto& block :
         global_blocks(p, store.layout().tp_rank, piece.local_begin, piece.local_begin + piece.length))
      f(piece, block);
  }
}

std::vector<std::uint64_t> to_u64(const std::vector<std::int64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

CheckpointState::CheckpointState(const ModelConfig& m, const ParamStore& store, const AdamW& opt, bool staged)
    : staged_(staged) {
  if (staged) {
    const auto staging = [](const char* label, std::size_t n) {
      return StagingView(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
    };
    staged_params_ = staging("ndmini::checkpoint staging params", store.shard_params().extent(0));
    staged_exp_avg_ = staging("ndmini::checkpoint staging exp_avg", opt.exp_avg.extent(0));
    staged_exp_avg_sq_ = staging("ndmini::checkpoint staging exp_avg_sq", opt.exp_avg_sq.extent(0));
  } else {
    params_ = Kokkos::create_mirror_view(store.shard_params());
    exp_avg_ = Kokkos::create_mirror_view(opt.exp_avg);
    exp_avg_sq_ = Kokkos::create_mirror_view(opt.exp_avg_sq);
  }
  real* const params = staged ? staged_params_.data() : params_.data();
  real* const exp_avg = staged ? staged_exp_avg_.data() : exp_avg_.data();
  real* const exp_avg_sq = staged ? staged_exp_avg_sq_.data() : exp_avg_sq_.data();
  std::set<std::string> named;
  for_each_block(store, [&](const ParamStore::Piece& piece, const GlobalBlock& block) {
    const ParamInfo& p = store.layout().params[piece.param];
    const auto shape = to_u64(p.global_shape);
    const std::size_t at = piece.shard_offset + (block.local_begin - piece.local_begin);
    const bool replica = store.is_replica(piece);
    slabs_.push_back({"model/" + p.name, shape, block.offset, block.count, params + at, replica});
    slabs_.push_back({"optimizer/exp_avg/" + p.name, shape, block.offset, block.count, exp_avg + at, replica});
    slabs_.push_back({"optimizer/exp_avg_sq/" + p.name, shape, block.offset, block.count, exp_avg_sq + at, replica});
    named.insert(p.name);
  });
  // Every rank names every tensor of the model, with an empty block where it
  // holds none of it (another pipeline stage, another FSDP shard): the HDF5
  // calls are collective.
  for (const GlobalTensor& t : gpt_global_tensors(m)) {
    if (named.count(t.name)) continue;
    const auto shape = to_u64(t.shape);
    const std::vector<std::uint64_t> zero(shape.size(), 0);
    for (const char* prefix : {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"})
      slabs_.push_back({prefix + t.name, shape, zero, zero, params, false});
  }
}

void CheckpointState::from_device(const ParamStore& store, const AdamW& opt) {
  if (staged_) {
    Kokkos::deep_copy(staged_params_, store.shard_params());
    Kokkos::deep_copy(staged_exp_avg_, opt.exp_avg);
    Kokkos::deep_copy(staged_exp_avg_sq_, opt.exp_avg_sq);
    return;
  }
  Kokkos::deep_copy(params_, store.shard_params());
  Kokkos::deep_copy(exp_avg_, opt.exp_avg);
  Kokkos::deep_copy(exp_avg_sq_, opt.exp_avg_sq);
}

void CheckpointState::to_device(ParamStore& store, const AdamW& opt) {
  if (staged_) {
    Kokkos::deep_copy(store.shard_params(), staged_params_);
    Kokkos::deep_copy(opt.exp_avg, staged_exp_avg_);
    Kokkos::deep_copy(opt.exp_avg_sq, staged_exp_avg_sq_);
  } else {
    Kokkos::deep_copy(store.shard_params(), params_);
    Kokkos::deep_copy(opt.exp_avg, exp_avg_);
    Kokkos::deep_copy(opt.exp_avg_sq, exp_avg_sq_);
  }
  store.params_changed();
}

std::size_t CheckpointState::staged_bytes() const {
  return (staged_params_.extent(0) + staged_exp_avg_.extent(0) + staged_exp_avg_sq_.extent(0)) * sizeof(real);
}

std::map<std::string, std::vector<float>> gather_global(const ModelConfig& m, const ParamStore& store,
                                                        const View1D& buffer, MPI_Comm world) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), buffer);
  std::map<std::string, std::vector<float>> out;
  for (const GlobalTensor& t : gpt_global_tensors(m)) {
    std::size_t n = 1;
    for (auto d : t.shape) n *= static_cast<std::size_t>(d);
    out[t.name].assign(n, 0.0f);
  }
  for_each_block(store, [&](const ParamStore::Piece& piece, const GlobalBlock& block) {
    if (store.is_replica(piece)) return;
    const ParamInfo& p = store.layout().params[piece.param];
    auto& global = out[p.name];
    const BlockRows rows = block_rows(p, block);
    const float* src = host.data() + piece.shard_offset + (block.local_begin - piece.local_begin);
    for (std::uint64_t r = 0; r < rows.rows; ++r)
      for (std::uint64_t c = 0; c < rows.cols; ++c)
        global[rows.first + r * rows.stride + c] = src[r * rows.local_cols + c];
  });
  for (auto& [name, values] : out)
    mpi_all_reduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_FLOAT, MPI_SUM, world,
                   "gathering a global tensor");
  return out;
}

void check_resume_compatible(const Config& cfg, const io::CheckpointInfo& info, const std::string& where) {
  const Config saved = parse_config(info.config, where + " (config attribute)");
  auto mismatch = [&](const std::string& key, auto a, auto b) {
    if (a != b) {
      std::ostringstream os;
      os << "cannot resume from " << where << ": it was written with " << key << " = " << a << ", the deck says " << b
         << "; resume with the deck that wrote it or start a fresh run in another checkpoint.dir";
      throw Error(os.str());
    }
  };
  mismatch("model.layers", saved.model.layers, cfg.model.layers);
  mismatch("model.channels", saved.model.channels, cfg.model.channels);
  mismatch("model.heads", saved.model.heads, cfg.model.heads);
  mismatch("model.vocab", saved.model.vocab, cfg.model.vocab);
  mismatch("model.seq_len", saved.model.seq_len, cfg.model.seq_len);
  // The architecture (a checkpoint from before these keys existed reads as GPT-2's).
  const ModelConfig &a = saved.model, &b = cfg.model;
  mismatch("model.norm", std::string(name_of(a.norm)), std::string(name_of(b.norm)));
  mismatch("model.norm_eps", a.norm_eps, b.norm_eps);
  mismatch("model.position", std::string(name_of(a.position)), std::string(name_of(b.position)));
  mismatch("model.rope_theta", a.rope_theta, b.rope_theta);
  mismatch("model.mlp", std::string(name_of(a.mlp)), std::string(name_of(b.mlp)));
  mismatch("model.ffn_hidden", a.ffn(), b.ffn());
  mismatch("model.kv_heads", a.kv(), b.kv());
  mismatch("model.tie_embeddings", a.tie_embeddings, b.tie_embeddings);
  mismatch("model.bias", a.bias, b.bias);
  mismatch("train.seed", saved.train.seed, cfg.train.seed);
  mismatch("train.global_batch", saved.train.global_batch, cfg.train.global_batch);
  // It decides which of data.path's tokens are trained on.
  mismatch("data.val_fraction", saved.data.val_fraction, cfg.data.val_fraction);
}

}  // namespace ndmini
