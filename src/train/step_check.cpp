// SPDX-License-Identifier: BSD-3-Clause
#include "train/step_check.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "kernels/kernels.hpp"
#include "model/gpt.hpp"
#include "parallel/stage_runtime.hpp"

namespace ndmini {
namespace {

// This rank's first parameter whose gradient holds a non-finite value, or "".
// Only called once a step has failed: one pass over the shard.
std::string first_bad_tensor(const StageRuntime& model) {
  const ParamStore& store = model.store();
  for (const auto& piece : store.pieces()) {
    const double s = kernels::sum_squares(Slice1D(model.grad_buffer().data() + piece.shard_offset, piece.length));
    if (!std::isfinite(s)) return model.params()[piece.param].name;
  }
  return "";
}

// Where to go on from: the newest checkpoint, which only ever holds a state
// shown sane. Collective.
std::string resume_advice(MPI_Comm comm, const Config& cfg) {
  const auto& k = cfg.checkpoint;
  std::optional<std::int64_t> latest;
  try {
    latest = io::latest_step(comm, k.dir);
  } catch (const Error&) {
    // a damaged marker: the advice below still holds
  }
  const std::string fix = "lower train.lr, set train.grad_clip or lower train.weight_decay";
  if (!latest)
    return k.every > 0 ? "no checkpoint was written before it; " + fix + " and start again"
                       : "no checkpoints are written (checkpoint.every = 0); " + fix + " and start again";
  return "the newest good checkpoint is step " + std::to_string(*latest) + " in '" + k.dir + "': " + fix +
         ", then resume with --resume " + std::to_string(*latest);
}

// Agreement and diagnosis. `bad_loss`, `bad_grad`: this rank's view;
// `local_bad`: this rank's own contribution is non-finite.
void agree_finite(MPI_Comm comm, std::int64_t step, bool bad_loss, bool bad_grad, bool local_bad,
                  const StageRuntime* model, const std::string& what_state, double loss, double grad_norm,
                  const Config& cfg) {
  int flags[2] = {bad_loss ? 1 : 0, bad_grad ? 1 : 0};
  mpi_all_reduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, comm, "the finite-loss check");
  if (!flags[0] && !flags[1]) return;
  // Every rank is here: find the first rank whose own part is non-finite.
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::string tensor = model != nullptr ? first_bad_tensor(*model) : "";
  int mine = (local_bad || !tensor.empty()) ? rank : size, first = size;
  mpi_all_reduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, "the first non-finite rank");
  unsigned long long n = tensor.size();
  if (first < size) {
    mpi_broadcast(&n, 1, MPI_UNSIGNED_LONG_LONG, first, comm, "the non-finite tensor's name length");
    tensor.resize(static_cast<std::size_t>(n));
    if (n > 0) mpi_broadcast(tensor.data(), static_cast<int>(n), MPI_CHAR, first, comm, "the non-finite tensor's name");
  }
  double seen[2] = {loss, grad_norm};  // as the first bad rank (or rank 0) saw them
  mpi_broadcast(seen, 2, MPI_DOUBLE, first < size ? first : 0, comm, "the non-finite values");
  std::ostringstream os;
  os << "non-finite " << (flags[0] ? "loss" : "gradient norm") << " at step " << step;
  if (first < size) {
    os << " (first on rank " << first;
    if (!tensor.empty()) os << ", in the gradient of '" << tensor << "'";
    os << ")";
  } else {
    os << " (every rank's own part is finite: the sum over the ranks overflowed)";
  }
  os << "; loss " << seen[0];
  if (model != nullptr) os << ", grad norm " << seen[1];
  os << ". " << what_state << "; " << resume_advice(comm, cfg);
  throw Error(os.str());
}

}  // namespace

void require_finite_step(MPI_Comm comm, std::int64_t step, double loss, double grad_norm, double local_loss,
                         const StageRuntime& model, const Config& cfg) {
  const bool bad_loss = !std::isfinite(loss) || !std::isfinite(local_loss);
  const bool bad_grad = !std::isfinite(grad_norm);
  agree_finite(comm, step, bad_loss, bad_grad, !std::isfinite(local_loss), &model,
               "The update of step " + std::to_string(step) + " was not applied, nor was a checkpoint written", loss,
               grad_norm, cfg);
}

void require_finite_state(MPI_Comm comm, std::int64_t step, double loss, double local_loss, const Config& cfg) {
  const bool bad = !std::isfinite(loss) || !std::isfinite(local_loss);
  agree_finite(comm, step, bad, false, !std::isfinite(local_loss), nullptr,
               "The final state (after step " + std::to_string(step - 1) + ") was not saved", loss, 0, cfg);
}

void poison_first_gradient(StageRuntime& model) {
  const auto& pieces = model.store().pieces();
  if (pieces.empty()) return;  // this rank holds no gradient to poison
  const View1D grads = model.grad_buffer();
  Kokkos::deep_copy(Kokkos::subview(grads, pieces.front().shard_offset), std::numeric_limits<real>::quiet_NaN());
}

}  // namespace ndmini
