// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The route of the matrix products and the peak MFU is measured against. At
// start-up a short calibration on every rank times each library this build
// has on the run's own product shapes, sends each class of products (the
// Linear layers', the attention heads') to the fastest, then measures the
// peak through that route, in the precision the run's products use. The
// deck may force the route (perf.gemm_route) and give the peak
// (perf.peak_gflops: then nothing is timed).
#include <mpi.h>

#include <string>
#include <vector>

#include "config/config.hpp"
#include "kernels/gemm_library.hpp"

namespace ndmini {

struct GemmCalibration {
  double best_flops = 0;          // the peak: the fastest of the timed runs
  std::vector<double> run_flops;  // every timed run (the warm-up excluded), in order
  bool thread_cpu_time = false;   // runs timed by the calling thread's CPU time (products on it alone)
};
// Times `runs` products of 1024 x 1024 matrices in `precision` (bf16: bf16
// inputs, fp32 accumulation, as the model's bf16 products) through the
// model's GEMM route (cuBLAS on a GPU), C = A B^T, A^T B and A B in turn (the
// model's three uses of a weight), after an untimed warm-up of each, and
// keeps the BEST: a busy core can only make a run slower, so the best run is
// the closest to what the hardware does, and no run of the calibration reads
// above it (MFU <= 1 for it by construction).
GemmCalibration calibrate_gemm(Precision precision = Precision::fp32, int runs = 12);
// calibrate_gemm(precision).best_flops.
double calibrate_gemm_flops(Precision precision = Precision::fp32);

// The shapes the route is timed on, per rank: the Linear class as the MLP's
// first layer (rows x hidden x channels: forward NT, weight gradient TN,
// input gradient NN), the heads class as `heads` batched products of seq x
// seq x head_size (S = Q K^T NT, O = S V NN, dV = S^T dO TN). Rows and the
// batch are capped so the timing stays short: past 1024 rows a product's
// rate hardly changes. The defaults: one 1024-row micro-batch of gpt2-124m.
struct ProductShapes {
  int rows = 1024, channels = 768, hidden = 3072;
  int seq = 1024, head_size = 64, heads = 1;
};
// The run's shapes: micro-batch rows (sequence split by cp), widths split by tp.
ProductShapes product_shapes(const Config& cfg);

// One library timed on one class: the rate of the class's products together
// (their FLOPs over their best times) and the fastest single product's.
struct ClassRate {
  double flops = 0, best_product_flops = 0;
};
ClassRate time_gemm_class(bool bf16, kernels::GemmClass cls, kernels::GemmLibrary library, const ProductShapes& shapes,
                          int runs = 2);

// The route: with perf.gemm_route = auto and no peak in the deck, every
// library of gemm_libraries() timed on `shapes` for fp32 (and bf16 when
// `precision` is bf16), the rates agreed over `comm` (each the fastest rank's,
// so every rank reads the same figures and takes the same route), each class
// to the fastest; the default library (BLAS) keeps a class unless another is
// kRouteMargin faster, so two runs on one machine do not flip between near
// ties. Forced, or with a peak in the deck: that library, or the default,
// untimed. Sets the route (kernels::set_gemm_library) and returns what the
// banner says about it. Collective over comm when it times.
inline constexpr double kRouteMargin = 1.05;
kernels::GemmRouteReport choose_gemm_route(const PerfConfig& perf, MPI_Comm comm, Precision precision,
                                           const ProductShapes& shapes = {});

struct PeakFlops {
  double flops_per_rank = 0;
  std::string source;              // for the report: where the figure comes from
  std::vector<double> run_flops;   // this rank's calibration runs; empty when the deck gave the peak
  kernels::GemmRouteReport route;  // the route taken, and the rates that chose it
};
// choose_gemm_route(), then the peak of the route chosen in `precision`: the
// best of calibrate_gemm() and of every product the route's timing ran on
// the libraries chosen, so no product the calibration timed reads above it.
// Collective over comm when it calibrates: the fastest rank sets the peak,
// so a calibration slowed by a busy core cannot flatter the MFU. With
// perf.peak_gflops > 0 nothing is measured (and nothing communicated).
PeakFlops peak_flops(const PerfConfig& perf, MPI_Comm comm, Precision precision = Precision::fp32,
                     const ProductShapes& shapes = {});

}  // namespace ndmini
