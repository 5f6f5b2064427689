// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ndmini plan --calibrate measures the cluster file of the machine ndmini
// runs on (docs/planner.md). It holds:
// - the GEMM peak per precision, from the start-up calibration
//   (run/calibration.hpp);
// - what the model's own kernels reach: a block's Linear products and its
//   attention as fractions of the peak, and the memory-bound kernels'
//   bandwidth;
// - the collectives' latency and bandwidth, from a short ping of the comm
//   layer over the launched ranks, inverted through the same cost formula
//   the planner predicts with (plan/cost_model.hpp);
// - how much of a collective hides behind compute.
#include <mpi.h>

#include <string>

#include "plan/cluster.hpp"

namespace ndmini {

// Collective over `world` (at least 2 ranks, for the ping). Returns the
// cluster file's text on rank 0 (empty elsewhere). Throws Error with one
// rank.
std::string calibrate_cluster(MPI_Comm world);

}  // namespace ndmini
