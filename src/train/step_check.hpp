// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Nothing non-finite is applied or saved: the checks the training loop makes
// on every rank before the optimizer step and before a checkpoint.
//
// A diverged update can be finite itself and show as NaN only one step later
// (weights of 1e26 give a finite update, then an infinite loss). So a state
// is saved only once it has been shown sane: the save of the state after step
// k waits until step k+1's loss and gradient norm (computed from that very
// state, before its update) are known finite, and the final state is checked
// by the loss of one more batch (forward only) before it is saved.
#include <mpi.h>

#include <cstdint>

#include "config/config.hpp"

namespace ndmini {

class StageRuntime;

// After the backward of `step`: `loss` and `grad_norm` as this rank computed
// them (reduced over its groups), `local_loss` its own partial sum. Collective
// over comm (one small all-reduce); when any rank sees a non-finite value,
// throws the same Error on every rank naming the step, the first rank whose
// own loss or gradient is non-finite and its first such tensor, and the
// newest checkpoint to resume from (cfg.checkpoint.dir).
void require_finite_step(MPI_Comm comm, std::int64_t step, double loss, double grad_norm, double local_loss,
                         const StageRuntime& model, const Config& cfg);

// The same for a state shown only by a loss (the final state, before
// it is saved): `loss` reduced, `local_loss` this rank's part.
void require_finite_state(MPI_Comm comm, std::int64_t step, double loss, double local_loss, const Config& cfg);

// Fault injection (fault.kind = "nan"): this rank's first gradient element
// becomes NaN, as a faulty kernel or device would leave it.
void poison_first_gradient(StageRuntime& model);

}  // namespace ndmini
