// SPDX-License-Identifier: BSD-3-Clause
// The pipeline runner over real MPI ranks, with a stage whose chunks are
// arithmetic so every value is known: chunk k maps its input x to 2x + k,
// the head's loss is the sum of its output, and each backward doubles the
// gradient. For every schedule and several micro-batch counts, every stage
// checks that each action got the right data (a message delivered to the wrong micro-batch or
// chunk shows as a wrong value), the head's losses, and that it held exactly
// the micro-batches the schedule keeps in flight. The forward-only run of
// the validation loss is checked the same way.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/pipeline/pipeline.hpp"

using namespace ndmini;

namespace {

constexpr std::size_t kElements = 40000;  // above MPI's eager limit: rendezvous transfers

std::vector<real> host(const real* p, std::size_t n) {
  Kokkos::View<const real*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> v(p, n);
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), v);
  return std::vector<real>(h.data(), h.data() + n);
}

void upload(real* p, const std::vector<real>& values) {
  Kokkos::View<real*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> v(p, values.size());
  Kokkos::View<const real*, HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(values.data(), values.size());
  Kokkos::deep_copy(v, h);
}

// The input of chunk 0 for a micro-batch, and what chunk k receives.
real first_input(int mb, std::size_t j) { return static_cast<real>(mb) + static_cast<real>(j % 7); }
real input_of(int chunk, int mb, std::size_t j) {
  real x = first_input(mb, j);
  for (int k = 0; k < chunk; ++k) x = 2 * x + static_cast<real>(k);
  return x;
}

class ArithmeticStage final : public PipelineStage {
 public:
  explicit ArithmeticStage(int chunks) : chunks_(chunks) {}

  std::size_t activation_elements() const override { return kElements; }
  real* input_buffer(int chunk, int mb) override { return create(chunk, mb).in.data(); }
  double forward(int chunk, int mb, bool /*last*/) override {
    Record& r = create(chunk, mb);
    std::vector<real> in = chunk == 0 ? std::vector<real>(kElements) : host(r.in.data(), kElements);
    for (std::size_t j = 0; j < kElements; ++j) {
      if (chunk == 0) in[j] = first_input(mb, j);
      if (in[j] != input_of(chunk, mb, j)) ++errors;
      in[j] = 2 * in[j] + static_cast<real>(chunk);
    }
    upload(r.out.data(), in);
    if (chunk + 1 < chunks_) return 0;
    double loss = 0;
    for (real v : in) loss += v;
    upload(r.grad.data(), std::vector<real>(kElements, 1));  // d(loss)/d(out) of the head
    return loss;
  }
  const real* output(int chunk, int mb) override { return records_.at({chunk, mb}).out.data(); }
  real* output_grad_buffer(int chunk, int mb) override { return records_.at({chunk, mb}).grad.data(); }
  void backward(int chunk, int mb, real* input_grad, bool /*last*/) override {
    Record& r = records_.at({chunk, mb});
    std::vector<real> g = host(r.grad.data(), kElements);
    const real want = std::pow(real(2), static_cast<real>(chunks_ - 1 - chunk));
    for (std::size_t j = 0; j < kElements; ++j) {
      if (g[j] != want) ++errors;
      g[j] *= 2;
    }
    if (chunk > 0) upload(input_grad, g);
    records_.erase({chunk, mb});
    ++backwards;
  }
  void discard(int chunk, int mb) override {
    if (records_.erase({chunk, mb}) != 1) ++errors;
  }
  std::size_t records() const { return records_.size(); }

  int errors = 0;
  int backwards = 0;
  std::size_t peak_in_flight = 0;

 private:
  struct Record {
    View1D in{"in", kElements}, out{"out", kElements}, grad{"grad", kElements};
  };
  Record& create(int chunk, int mb) {
    auto it = records_.find({chunk, mb});
    if (it == records_.end()) it = records_.emplace(std::make_pair(chunk, mb), Record()).first;
    peak_in_flight = std::max(peak_in_flight, records_.size());
    return it->second;
  }
  int chunks_;
  std::map<std::pair<int, int>, Record> records_;
};

double expected_loss(int chunks, int micro_batches) {
  double total = 0;
  for (int mb = 0; mb < micro_batches; ++mb)
    for (std::size_t j = 0; j < kElements; ++j) total += 2 * input_of(chunks - 1, mb, j) + (chunks - 1);
  return total;
}

}  // namespace

TEST(PipelineRunner, EveryScheduleDeliversEveryMessageToItsAction) {
  int pp = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &pp);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Communicator comm(MPI_COMM_WORLD, "pp");
  struct Case {
    ScheduleKind kind;
    int virtual_stages, micro_batches;
  };
  const std::vector<Case> cases = {{ScheduleKind::gpipe, 1, 3},        {ScheduleKind::gpipe, 1, 1},
                                   {ScheduleKind::one_f_one_b, 1, pp}, {ScheduleKind::one_f_one_b, 1, 2 * pp + 1},
                                   {ScheduleKind::interleaved, 2, pp}, {ScheduleKind::interleaved, 2, 2 * pp}};
  for (const Case& c : cases) {
    const std::string what = std::string(name_of(c.kind)) + " v=" + std::to_string(c.virtual_stages) +
                             " m=" + std::to_string(c.micro_batches);
    SCOPED_TRACE(what);
    const StagePlan plan(pp * c.virtual_stages, pp, c.virtual_stages);
    const Schedule schedule(c.kind, pp, c.virtual_stages, c.micro_batches);
    PipelineRunner runner(comm, plan, schedule);
    ArithmeticStage stage(plan.chunks());
    for (int step = 0; step < 2; ++step) {  // twice: buffers are reused
      const double loss = runner.run(stage);
      const bool head = rank == plan.rank_of(plan.chunks() - 1);
      const double want = head ? expected_loss(plan.chunks(), c.micro_batches) : 0.0;
      EXPECT_NEAR(loss, want, 1e-9 * std::abs(want)) << "stage " << rank;
    }
    EXPECT_EQ(stage.errors, 0) << "stage " << rank << ": an action got another action's data";
    EXPECT_EQ(stage.peak_in_flight, static_cast<std::size_t>(schedule.max_in_flight(rank))) << "stage " << rank;
    EXPECT_GE(runner.bubble_ms(), 0.0);
  }
}

// The validation loss's forward-only run: every message reaches its action,
// the head's loss is the training run's, no backward runs, every record is
// discarded, and a stage holds no more records than the schedule would.
TEST(PipelineRunner, EvaluateRunsForwardsOnly) {
  int pp = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &pp);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Communicator comm(MPI_COMM_WORLD, "pp");
  for (const int v : {1, 2})
    for (const int m : {1, pp, 3 * pp + 1}) {
      SCOPED_TRACE("v=" + std::to_string(v) + " m=" + std::to_string(m));
      const StagePlan plan(pp * v, pp, v);
      const Schedule schedule(v > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b, pp, v, pp);
      PipelineRunner runner(comm, plan, schedule);
      ArithmeticStage stage(plan.chunks());
      for (int round = 0; round < 2; ++round) {
        const double loss = runner.evaluate(stage, m);
        const bool head = rank == plan.rank_of(plan.chunks() - 1);
        const double want = head ? expected_loss(plan.chunks(), m) : 0.0;
        EXPECT_NEAR(loss, want, 1e-9 * std::abs(want)) << "stage " << rank;
        EXPECT_EQ(stage.records(), 0u) << "stage " << rank << ": records left after evaluate";
      }
      EXPECT_EQ(stage.errors, 0) << "stage " << rank << ": an action got another action's data";
      EXPECT_EQ(stage.backwards, 0) << "stage " << rank;
      EXPECT_LE(stage.peak_in_flight, static_cast<std::size_t>(schedule.max_in_flight(rank))) << "stage " << rank;
    }
}
