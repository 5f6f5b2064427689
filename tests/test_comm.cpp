// SPDX-License-Identifier: BSD-3-Clause
// The comm layer's MPI backend: every collective, blocking and not, against
// values computed from the ranks, on the world and on a split communicator;
// the accounting; and the request's lifetime rules.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/device_path.hpp"
#include "comm/ledger.hpp"
#include "comm/mpi/mpi_calls.hpp"
#include "comm/progress.hpp"
#include "core/error.hpp"
#include "core/types.hpp"

namespace ndmini {
namespace {

// A value that differs per rank and element and is exact in float.
real value(int rank, std::size_t i) { return static_cast<real>(rank * 1000 + static_cast<int>(i % 997)); }

View1D device_from(const std::vector<real>& host) {
  View1D v("comm_test_buf", host.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < host.size(); ++i) h(i) = host[i];
  Kokkos::deep_copy(v, h);
  return v;
}

std::vector<real> host_from(const View1D& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<real>(h.data(), h.data() + h.extent(0));
}

std::vector<real> rank_values(int rank, std::size_t n) {
  std::vector<real> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = value(rank, i);
  return out;
}

// Runs every test on MPI_COMM_WORLD and on a split into even and odd ranks
// (sizes differ from the world's, and a rank's index differs from its world rank).
class CommTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    const std::string group = GetParam().substr(0, GetParam().find('_'));
    if (group == "world") {
      MPI_Comm_dup(MPI_COMM_WORLD, &mpi_);
    } else {
      MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, -world_rank, &mpi_);  // reversed order on purpose
    }
    // "_watched": every wait under a (generous) deadline, so blocking calls
    // take the non-blocking path of the hang detection.
    if (GetParam().find("_watched") != std::string::npos)
      watchdog_ = std::make_unique<CollectiveWatchdog>(MPI_COMM_WORLD, kGenerousTimeoutS);
    comm_ = std::make_unique<Communicator>(mpi_, GetParam());
  }
  void TearDown() override {
    comm_.reset();
    watchdog_.reset();
    MPI_Comm_free(&mpi_);
  }

  static constexpr double kGenerousTimeoutS = 120;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  std::unique_ptr<Communicator> comm_;
};

TEST_P(CommTest, KnowsItsGroup) {
  int size = 0, rank = 0;
  MPI_Comm_size(mpi_, &size);
  MPI_Comm_rank(mpi_, &rank);
  EXPECT_EQ(comm_->size(), size);
  EXPECT_EQ(comm_->rank(), rank);
  EXPECT_EQ(comm_->mpi(), mpi_);
  EXPECT_EQ(comm_->name(), GetParam());
  EXPECT_EQ(comm_->backend(), Communicator::Backend::mpi);
}

void expect_all_reduce(Communicator& c, const View1D& buf, ReduceOp op) {
  auto got = host_from(buf);
  for (std::size_t i = 0; i < got.size(); ++i) {
    real want = value(0, i);
    for (int r = 1; r < c.size(); ++r) want = op == ReduceOp::sum ? want + value(r, i) : std::max(want, value(r, i));
    ASSERT_EQ(got[i], want) << "element " << i;
  }
}

TEST_P(CommTest, AllReduceSumAndMax) {
  const std::size_t n = 1031;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    auto buf = device_from(rank_values(comm_->rank(), n));
    comm_->all_reduce(buf.data(), n, op);
    expect_all_reduce(*comm_, buf, op);

    buf = device_from(rank_values(comm_->rank(), n));
    CommRequest req = comm_->iall_reduce(buf.data(), n, op);
    EXPECT_TRUE(req.active());
    req.wait();
    EXPECT_FALSE(req.active());
    expect_all_reduce(*comm_, buf, op);
  }
}

void expect_all_gather(Communicator& c, const View1D& recv, std::size_t per_rank) {
  auto got = host_from(recv);
  ASSERT_EQ(got.size(), per_rank * c.size());
  for (int r = 0; r < c.size(); ++r)
    for (std::size_t i = 0; i < per_rank; ++i) ASSERT_EQ(got[r * per_rank + i], value(r, i)) << r << "," << i;
}

TEST_P(CommTest, AllGather) {
  const std::size_t per_rank = 257;
  const std::size_t total = per_rank * comm_->size();
  auto send = device_from(rank_values(comm_->rank(), per_rank));

  View1D recv("recv", total);
  comm_->all_gather(send.data(), recv.data(), per_rank);
  expect_all_gather(*comm_, recv, per_rank);

  View1D recv2("recv2", total);
  CommRequest req = comm_->iall_gather(send.data(), recv2.data(), per_rank);
  req.wait();
  expect_all_gather(*comm_, recv2, per_rank);

  // In place: this rank's block already sits at its offset in recv.
  std::vector<real> staged(total, -1.0f);
  for (std::size_t i = 0; i < per_rank; ++i) staged[comm_->rank() * per_rank + i] = value(comm_->rank(), i);
  auto inplace = device_from(staged);
  comm_->all_gather(inplace.data() + comm_->rank() * per_rank, inplace.data(), per_rank);
  expect_all_gather(*comm_, inplace, per_rank);
}

void expect_reduce_scatter(Communicator& c, const View1D& recv, std::size_t per_rank) {
  auto got = host_from(recv);
  for (std::size_t i = 0; i < per_rank; ++i) {
    real want = 0;
    for (int r = 0; r < c.size(); ++r) want += value(r, c.rank() * per_rank + i);
    ASSERT_EQ(got[i], want) << "element " << i;
  }
}

TEST_P(CommTest, ReduceScatter) {
  const std::size_t per_rank = 129;
  auto send = device_from(rank_values(comm_->rank(), per_rank * comm_->size()));

  View1D recv("recv", per_rank);
  comm_->reduce_scatter(send.data(), recv.data(), per_rank);
  expect_reduce_scatter(*comm_, recv, per_rank);

  View1D recv2("recv2", per_rank);
  CommRequest req = comm_->ireduce_scatter(send.data(), recv2.data(), per_rank);
  while (!req.test()) {
  }
  EXPECT_FALSE(req.active());
  EXPECT_TRUE(req.test());  // stays complete
  expect_reduce_scatter(*comm_, recv2, per_rank);
}

TEST_P(CommTest, BroadcastFromEveryRoot) {
  const std::size_t n = 100;
  for (int root = 0; root < comm_->size(); ++root) {
    auto buf = device_from(rank_values(comm_->rank(), n));
    comm_->broadcast(buf.data(), n, root);
    EXPECT_EQ(host_from(buf), rank_values(root, n)) << "root " << root;
  }
  EXPECT_THROW(comm_->broadcast(nullptr, 0, comm_->size()), Error);
}

TEST_P(CommTest, SendRecvPairs) {
  if (comm_->size() < 2) GTEST_SKIP() << "needs two ranks in the group";
  // Pairs (0,1), (2,3), ...; the lower rank sends first, so a blocking send
  // never waits on a blocking send.
  const int peer = comm_->rank() ^ 1;
  if (peer >= comm_->size()) return;
  const std::size_t n = 4096;
  auto out = device_from(rank_values(comm_->rank(), n));
  View1D in("in", n);
  if (comm_->rank() < peer) {
    comm_->send(out.data(), n, peer, 7);
    comm_->recv(in.data(), n, peer, 8);
  } else {
    comm_->recv(in.data(), n, peer, 7);
    comm_->send(out.data(), n, peer, 8);
  }
  EXPECT_EQ(host_from(in), rank_values(peer, n));
  EXPECT_EQ(comm_->stats().calls, 2);
  EXPECT_EQ(comm_->stats().bytes, static_cast<std::int64_t>(2 * n * sizeof(real)));
}

TEST_P(CommTest, RingExchangeDoesNotDeadlock) {
  // Every rank sends to the next and receives from the previous at once, the
  // pattern of ring attention: with blocking calls this would deadlock.
  const int n_ranks = comm_->size(), rank = comm_->rank();
  const int next = (rank + 1) % n_ranks, prev = (rank + n_ranks - 1) % n_ranks;
  const std::size_t n = 70000;  // above MPICH's eager limit: a rendezvous transfer
  auto out = device_from(rank_values(rank, n));
  View1D in("in", n);
  CommRequest req = comm_->batch_p2p({{P2POp::Kind::send, out.data(), n, next, 3},  //
                                      {P2POp::Kind::recv, in.data(), n, prev, 3}});
  req.wait();
  EXPECT_EQ(host_from(in), rank_values(prev, n));
  EXPECT_EQ(comm_->stats().calls, 1);
  EXPECT_EQ(comm_->stats().bytes, static_cast<std::int64_t>(2 * n * sizeof(real)));
}

TEST_P(CommTest, IsendBeforeIrecvOnBothSides) {
  // Both sides send first and receive second, the order a pipeline stage may
  // reach them in: fine when neither call blocks. Tags keep two messages apart.
  if (comm_->size() < 2) GTEST_SKIP() << "needs two ranks in the group";
  const int peer = comm_->rank() ^ 1;
  if (peer >= comm_->size()) return;
  const std::size_t n = 70000;
  auto a = device_from(rank_values(comm_->rank(), n)), b = device_from(rank_values(comm_->rank() + 7, n));
  View1D in_a("in_a", n), in_b("in_b", n);
  CommRequest send_b = comm_->isend(b.data(), n, peer, 2);
  CommRequest send_a = comm_->isend(a.data(), n, peer, 1);
  CommRequest recv_a = comm_->irecv(in_a.data(), n, peer, 1);
  CommRequest recv_b = comm_->irecv(in_b.data(), n, peer, 2);
  recv_a.wait();
  recv_b.wait();
  send_a.wait();
  send_b.wait();
  EXPECT_EQ(host_from(in_a), rank_values(peer, n));
  EXPECT_EQ(host_from(in_b), rank_values(peer + 7, n));
  EXPECT_THROW(comm_->isend(a.data(), 1, comm_->size()), Error);
}

TEST_P(CommTest, ScalarAllReduce) {
  const int n = comm_->size();
  EXPECT_DOUBLE_EQ(comm_->all_reduce_scalar(comm_->rank() + 0.5), n * (n - 1) / 2.0 + 0.5 * n);
  EXPECT_DOUBLE_EQ(comm_->all_reduce_scalar(-comm_->rank(), ReduceOp::max), 0.0);
  EXPECT_EQ(comm_->stats().calls, 2);
  EXPECT_EQ(comm_->stats().bytes, static_cast<std::int64_t>(2 * sizeof(double)));
}

TEST_P(CommTest, ZeroCountIsFine) {
  View1D empty("empty", 1);
  comm_->all_reduce(empty.data(), 0);
  comm_->all_gather(empty.data(), empty.data(), 0);
  comm_->iall_reduce(empty.data(), 0).wait();
  EXPECT_EQ(comm_->stats().calls, 3);
  EXPECT_EQ(comm_->stats().bytes, 0);
}

TEST_P(CommTest, AccountingOfBlockingCalls) {
  const int n = comm_->size();
  const std::int64_t f = sizeof(real);
  View1D a("a", 64 * n), b("b", 64 * n);
  comm_->all_reduce(a.data(), 10);
  EXPECT_EQ(comm_->stats().calls, 1);
  EXPECT_EQ(comm_->stats().bytes, 10 * f);  // the full buffer
  EXPECT_GT(comm_->stats().ms, 0.0);
  EXPECT_DOUBLE_EQ(comm_->stats().exposed_ms, comm_->stats().ms);  // blocking: all of it exposed

  comm_->reset_stats();
  comm_->all_gather(a.data(), b.data(), 3);      // the gathered size
  comm_->reduce_scatter(a.data(), b.data(), 5);  // the size before scattering
  comm_->broadcast(a.data(), 7, 0);
  EXPECT_EQ(comm_->stats().calls, 3);
  EXPECT_EQ(comm_->stats().bytes, (3 * n + 5 * n + 7) * f);
  EXPECT_GT(comm_->stats().ms, 0.0);
  EXPECT_DOUBLE_EQ(comm_->stats().exposed_ms, comm_->stats().ms);

  comm_->reset_stats();
  EXPECT_EQ(comm_->stats().calls, 0);
  EXPECT_EQ(comm_->stats().bytes, 0);
  EXPECT_EQ(comm_->stats().ms, 0.0);
  EXPECT_EQ(comm_->stats().exposed_ms, 0.0);
}

TEST_P(CommTest, AccountingOfNonBlockingCalls) {
  const int n = comm_->size();
  const std::int64_t f = sizeof(real);
  View1D a("a", 1 << 16), b("b", (1 << 16) * n);

  CommRequest r1 = comm_->iall_reduce(a.data(), 1 << 16);
  CommRequest r2 = comm_->iall_gather(a.data(), b.data(), 1000);
  // Counted at issue...
  EXPECT_EQ(comm_->stats().calls, 2);
  EXPECT_EQ(comm_->stats().bytes, ((1 << 16) + 1000 * n) * f);
  r1.wait();
  r2.wait();
  // ...timed at completion; only part of the time is exposed.
  EXPECT_GT(comm_->stats().ms, 0.0);
  EXPECT_GT(comm_->stats().exposed_ms, 0.0);
  EXPECT_LE(comm_->stats().exposed_ms, comm_->stats().ms);

  // Time spent computing between issue and wait is not exposed.
  comm_->reset_stats();
  CommRequest r3 = comm_->ireduce_scatter(b.data(), a.data(), 1000);
  double t0 = MPI_Wtime();
  while (MPI_Wtime() - t0 < 0.02) {
  }
  r3.wait();
  EXPECT_EQ(comm_->stats().calls, 1);
  EXPECT_EQ(comm_->stats().bytes, 1000 * n * f);
  EXPECT_GE(comm_->stats().ms, 20.0);
  EXPECT_LT(comm_->stats().exposed_ms, comm_->stats().ms);
}

TEST_P(CommTest, RequestDestructorWaits) {
  const std::size_t n = 333;
  auto buf = device_from(rank_values(comm_->rank(), n));
  { CommRequest forgotten = comm_->iall_reduce(buf.data(), n); }
  expect_all_reduce(*comm_, buf, ReduceOp::sum);
  EXPECT_EQ(comm_->stats().calls, 1);
  EXPECT_GT(comm_->stats().ms, 0.0);
  EXPECT_LE(comm_->stats().exposed_ms, comm_->stats().ms);
}

TEST_P(CommTest, RequestMoves) {
  const std::size_t n = 50;
  auto a = device_from(rank_values(comm_->rank(), n));
  auto b = device_from(rank_values(comm_->rank(), n));
  CommRequest r = comm_->iall_reduce(a.data(), n);
  CommRequest moved(std::move(r));
  EXPECT_FALSE(r.active());  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  EXPECT_TRUE(moved.active());
  r.wait();  // no-op on an empty request
  EXPECT_TRUE(r.test());

  // Assigning over an active request completes it first.
  moved = comm_->iall_reduce(b.data(), n);
  expect_all_reduce(*comm_, a, ReduceOp::sum);
  moved.wait();
  expect_all_reduce(*comm_, b, ReduceOp::sum);
  EXPECT_EQ(comm_->stats().calls, 2);

  CommRequest empty;
  EXPECT_FALSE(empty.active());
}

TEST_P(CommTest, ManyRequestsInFlight) {
  const std::size_t n = 200;
  std::vector<View1D> bufs;
  std::vector<CommRequest> reqs;
  for (int k = 0; k < 8; ++k) {
    bufs.push_back(device_from(rank_values(comm_->rank(), n)));
    reqs.push_back(comm_->iall_reduce(bufs.back().data(), n, k % 2 ? ReduceOp::max : ReduceOp::sum));
  }
  for (auto& r : reqs) r.wait();
  for (int k = 0; k < 8; ++k) expect_all_reduce(*comm_, bufs[k], k % 2 ? ReduceOp::max : ReduceOp::sum);
  EXPECT_EQ(comm_->stats().calls, 8);
}

TEST_P(CommTest, LargeCollectivesInPiecesAreExact) {
  // Above the MPI backend's 16 MiB piece size: several calls, one collective
  // to the caller (one call in the accounting, one ledger entry).
  const std::size_t n = (std::size_t{16} << 20) / sizeof(real) * 2 + 3;
  auto buf = device_from(rank_values(comm_->rank(), n));
  comm_->all_reduce(buf.data(), n);
  expect_all_reduce(*comm_, buf, ReduceOp::sum);
  buf = device_from(rank_values(comm_->rank(), n));
  comm_->iall_reduce(buf.data(), n, ReduceOp::max).wait();
  expect_all_reduce(*comm_, buf, ReduceOp::max);
  const int root = comm_->size() - 1;
  buf = device_from(rank_values(comm_->rank(), n));
  comm_->broadcast(buf.data(), n, root);
  EXPECT_EQ(host_from(buf), rank_values(root, n));
  EXPECT_EQ(comm_->stats().calls, 3);
  EXPECT_EQ(comm_->stats().bytes, static_cast<std::int64_t>(3 * n * sizeof(real)));
  EXPECT_EQ(comm_->recent_collectives().size(), 3u);
}

TEST_P(CommTest, LedgerRecordsEveryCollective) {
  const int n = comm_->size();
  View1D a("a", 64 * n), b("b", 64 * n);
  comm_->all_reduce(a.data(), 10);
  CommRequest in_flight = comm_->iall_gather(a.data(), b.data(), 3);
  comm_->all_reduce_scalar(1.0);
  auto ledger = comm_->recent_collectives();
  ASSERT_EQ(ledger.size(), 3u);
  const std::int64_t f = sizeof(real);
  EXPECT_EQ(ledger[0].seq, 0u);
  EXPECT_EQ(ledger[0].op, "all_reduce");
  EXPECT_EQ(ledger[0].bytes, 10 * f);
  EXPECT_TRUE(ledger[0].blocking);
  EXPECT_TRUE(ledger[0].complete);
  EXPECT_EQ(ledger[1].seq, 1u);
  EXPECT_EQ(ledger[1].op, "all_gather");
  EXPECT_EQ(ledger[1].bytes, 3 * n * f);
  EXPECT_FALSE(ledger[1].blocking);
  EXPECT_EQ(ledger[2].op, "all_reduce_scalar");
  EXPECT_EQ(ledger[2].bytes, static_cast<std::int64_t>(sizeof(double)));
  // The rank-wide index counts in program order across communicators.
  EXPECT_LT(ledger[0].index, ledger[1].index);
  EXPECT_LT(ledger[1].index, ledger[2].index);
  in_flight.wait();
  EXPECT_TRUE(comm_->recent_collectives()[1].complete);
}

TEST_P(CommTest, SkippedCollectiveLeavesNoTrace) {
  // Every rank skips the same call, so nobody waits: the skipped call must
  // not touch the buffer, count, or enter the ledger; the next one goes on.
  const std::size_t n = 64;
  auto buf = device_from(rank_values(comm_->rank(), n));
  comm_->skip_next_for_fault_injection();
  comm_->all_reduce(buf.data(), n);
  EXPECT_EQ(host_from(buf), rank_values(comm_->rank(), n));
  EXPECT_EQ(comm_->stats().calls, 0);
  EXPECT_TRUE(comm_->recent_collectives().empty());
  comm_->skip_next_for_fault_injection();
  EXPECT_DOUBLE_EQ(comm_->all_reduce_scalar(2.5), 2.5);  // skipped: its own value
  comm_->all_reduce(buf.data(), n);
  expect_all_reduce(*comm_, buf, ReduceOp::sum);
  const auto ledger = comm_->recent_collectives();
  ASSERT_EQ(ledger.size(), 1u);
  EXPECT_EQ(ledger[0].seq, 0u);
}

TEST_P(CommTest, DroppedSumsActAsIfAlone) {
  // Every rank drops its sums from now on (fault.rank = -1): an all-reduce
  // leaves the buffer, a reduce-scatter hands back the rank's own block, a
  // scalar sum its own value, nothing enters the ledger -- and a gather
  // still gathers.
  const std::size_t n = 64;
  const std::vector<real> mine = rank_values(comm_->rank(), n * comm_->size());
  auto buf = device_from(mine);
  comm_->drop_sums_for_fault_injection();
  comm_->all_reduce(buf.data(), n);
  comm_->iall_reduce(buf.data(), n).wait();
  EXPECT_EQ(host_from(buf), mine);
  View1D recv("recv", n);
  comm_->reduce_scatter(buf.data(), recv.data(), n);
  const std::vector<real> own(mine.begin() + comm_->rank() * n, mine.begin() + (comm_->rank() + 1) * n);
  EXPECT_EQ(host_from(recv), own);
  Kokkos::deep_copy(recv, real(0));
  comm_->ireduce_scatter(buf.data(), recv.data(), n).wait();
  EXPECT_EQ(host_from(recv), own);
  EXPECT_DOUBLE_EQ(comm_->all_reduce_scalar(2.5), 2.5);
  EXPECT_EQ(comm_->stats().calls, 0);
  EXPECT_TRUE(comm_->recent_collectives().empty());
  View1D gathered("gathered", n * comm_->size());
  comm_->all_gather(recv.data(), gathered.data(), n);
  EXPECT_EQ(comm_->stats().calls, 1);
}

// ---- bf16 sums (comm.reduce_dtype = "bf16") --------------------------------

float float_of_bits(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The bf16 sum as specified, written apart from core/bf16.hpp: the two
// operands widened, added in fp32, and the fp32 sum rounded to nearest even
// by comparing the dropped half of its bits with one half ulp.
std::uint16_t reference_sum_bits(std::uint16_t a, std::uint16_t b) {
  const float sum = float_of_bits(a) + float_of_bits(b);
  std::uint32_t u;
  std::memcpy(&u, &sum, sizeof u);
  std::uint16_t kept = static_cast<std::uint16_t>(u >> 16);
  const std::uint32_t dropped = u & 0xffffu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u) != 0)) ++kept;  // a carry into the exponent is right
  return kept;
}

bool is_nan_bits(std::uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }

std::uint16_t sum_bits(std::uint16_t a, std::uint16_t b) {
  const bf16 in = bf16::from_bits(a);
  bf16 inout = bf16::from_bits(b);
  bf16_sum_into(&in, &inout, 1);
  return inout.bits;
}

TEST(Bf16Sum, ElementwiseMatchesTheReference) {
  struct Case {
    std::uint16_t a, b, want;
    const char* what;
  };
  const Case cases[] = {
      {0x3f80, 0x3f80, 0x4000, "1 + 1 = 2"},
      {0x3f80, 0x3b80, 0x3f80, "1 + 2^-8: a tie, to the even 1"},
      {0x3f81, 0x3b80, 0x3f82, "(1 + 2^-7) + 2^-8: a tie, to the even 1 + 2^-6"},
      {0xbf80, 0xbb80, 0xbf80, "-1 - 2^-8: a tie, to the even -1"},
      {0x3f80, 0x3b81, 0x3f81, "1 + 2^-8 (1 + 2^-7): above the tie, up"},
      {0x3f80, 0x3b00, 0x3f80, "1 + 2^-9: below the tie, down"},
      {0x7f7f, 0x7f7f, 0x7f80, "largest + largest overflows to +Inf"},
      {0xff7f, 0xff7f, 0xff80, "-largest - largest overflows to -Inf"},
      {0x7f7f, 0x3f80, 0x7f7f, "largest + 1 stays the largest"},
      {0x7f80, 0x3f80, 0x7f80, "+Inf + 1 = +Inf"},
      {0xff80, 0xbf80, 0xff80, "-Inf - 1 = -Inf"},
      {0x8000, 0x8000, 0x8000, "-0 + -0 = -0"},
      {0x0000, 0x8000, 0x0000, "+0 + -0 = +0"},
      {0x0001, 0x0001, 0x0002, "subnormals add exactly"},
      {0x0001, 0x8001, 0x0000, "a subnormal and its negation cancel to +0"},
      {0x3f80, 0xbf80, 0x0000, "1 - 1 = +0"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(sum_bits(c.a, c.b), c.want) << c.what;
    EXPECT_EQ(sum_bits(c.b, c.a), c.want) << c.what << " (commuted)";
    EXPECT_EQ(reference_sum_bits(c.a, c.b), c.want) << "the reference itself: " << c.what;
  }
  // NaN in, or Inf - Inf: a NaN out, quieted (so no payload can read as Inf).
  for (const auto& [a, b] : {std::pair<std::uint16_t, std::uint16_t>{0x7fc0, 0x3f80},
                             {0x3f80, 0xffc1},
                             {0x7f81, 0x0000},
                             {0x7f80, 0xff80}}) {
    const std::uint16_t got = sum_bits(a, b);
    EXPECT_TRUE(is_nan_bits(got)) << std::hex << a << " + " << b << " = " << got;
    EXPECT_NE(got & 0x0040u, 0u) << "a quiet NaN: " << std::hex << got;
  }
  // Every kind of operand, drawn at random (a fixed seed): the reference, bit for bit.
  std::uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<std::uint16_t>(state >> 16);
  };
  std::vector<bf16> in(100000), inout(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = bf16::from_bits(next());
    inout[i] = bf16::from_bits(next());
  }
  std::vector<bf16> again = inout;
  const std::vector<bf16> before = inout;
  bf16_sum_into(in.data(), inout.data(), in.size());
  bf16_sum_into(in.data(), again.data(), in.size());
  std::size_t nans = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint16_t want = reference_sum_bits(in[i].bits, before[i].bits);
    ASSERT_EQ(inout[i].bits, again[i].bits) << "not the same twice at " << i;
    if (is_nan_bits(want)) {
      ++nans;
      ASSERT_TRUE(is_nan_bits(inout[i].bits)) << i;
    } else {
      ASSERT_EQ(inout[i].bits, want) << std::hex << in[i].bits << " + " << before[i].bits;
    }
  }
  EXPECT_GT(nans, 0u) << "the random operands include NaNs";
}

// Rank r's bf16 operand i: small integers, whose sums over up to 8 ranks are exact in bf16.
std::uint16_t exact_operand(int rank, std::size_t i) { return bf16(static_cast<float>((rank + 1) * (i % 7))).bits; }
float exact_sum(int size, std::size_t i) { return static_cast<float>(size * (size + 1) / 2 * (i % 7)); }
// Rank r's operand i that rounds when summed: finite, of mixed signs and magnitudes.
std::uint16_t rounding_operand(int rank, std::size_t i) {
  const std::uint32_t h = static_cast<std::uint32_t>(rank * 7919 + i) * 2654435761u;
  const std::uint16_t exponent = static_cast<std::uint16_t>(0x78 + (h >> 8) % 16);  // 2^-7 .. 2^8
  return static_cast<std::uint16_t>(((h >> 31) << 15) | (exponent << 7) | (h >> 16 & 0x7f));
}

Bf16View1D bf16_device_from(const std::vector<std::uint16_t>& bits) {
  Bf16View1D v("comm_test_bf16", bits.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < bits.size(); ++i) h(i) = bf16::from_bits(bits[i]);
  Kokkos::deep_copy(v, h);
  return v;
}

std::vector<std::uint16_t> bf16_host_from(const Bf16View1D& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<std::uint16_t> out(h.extent(0));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = h(i).bits;
  return out;
}

TEST_P(CommTest, Bf16SumsAreExactWhereBf16IsAndCountTwoBytes) {
  const int n = comm_->size(), rank = comm_->rank();
  const std::size_t count = 1031, per_rank = 129;
  std::vector<std::uint16_t> mine(count), mine_blocks(per_rank * n);
  for (std::size_t i = 0; i < count; ++i) mine[i] = exact_operand(rank, i);
  for (std::size_t i = 0; i < mine_blocks.size(); ++i) mine_blocks[i] = exact_operand(rank, i);

  comm_->reset_stats();
  Bf16View1D blocking = bf16_device_from(mine), nonblocking = bf16_device_from(mine);
  comm_->all_reduce(blocking.data(), count);
  comm_->iall_reduce(nonblocking.data(), count).wait();
  const Bf16View1D send = bf16_device_from(mine_blocks);
  Bf16View1D recv("recv", per_rank);
  CommRequest scatter = comm_->ireduce_scatter(send.data(), recv.data(), per_rank);
  EXPECT_EQ(comm_->stats().calls, 3);
  EXPECT_EQ(comm_->stats().bytes, static_cast<std::int64_t>((2 * count + n * per_rank) * sizeof(bf16)));
  scatter.wait();

  for (const auto& got : {bf16_host_from(blocking), bf16_host_from(nonblocking)})
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(float_of_bits(got[i]), exact_sum(n, i)) << "element " << i;
  const auto got = bf16_host_from(recv);
  for (std::size_t i = 0; i < per_rank; ++i)
    ASSERT_EQ(float_of_bits(got[i]), exact_sum(n, rank * per_rank + i)) << "element " << i;
}

TEST_P(CommTest, Bf16SumsRoundTheSameOnEveryRankAndEveryRun) {
  const int n = comm_->size(), rank = comm_->rank();
  const std::size_t count = 4099;
  std::vector<std::uint16_t> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = rounding_operand(rank, i);
  std::vector<std::vector<std::uint16_t>> runs;
  for (int run = 0; run < 2; ++run) {
    Bf16View1D buf = bf16_device_from(mine);
    comm_->iall_reduce(buf.data(), count).wait();
    runs.push_back(bf16_host_from(buf));
  }
  EXPECT_EQ(runs[0], runs[1]) << "two runs of one bf16 sum differ";
  // Every rank of the group holds the same bits.
  std::vector<std::uint16_t> rank0 = runs[0];
  MPI_Bcast(rank0.data(), static_cast<int>(count), MPI_UINT16_T, 0, mpi_);
  EXPECT_EQ(runs[0], rank0) << "rank " << rank << " differs from rank 0";
  // Two ranks: the one pairwise sum there is, the reference's bits.
  std::size_t rounded = 0;
  if (n == 2)
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint16_t want = reference_sum_bits(rounding_operand(0, i), rounding_operand(1, i));
      ASSERT_EQ(runs[0][i], want) << "element " << i;
      rounded += float_of_bits(want) != float_of_bits(rounding_operand(0, i)) + float_of_bits(rounding_operand(1, i));
    }
  if (n == 2) EXPECT_GT(rounded, count / 4) << "the operands are meant to round";
}

// --- Variable all-to-all -------------------------------------------------------

// Elements rank s sends rank d in a group of n: 0, 5 or 10 (so some pairs
// exchange nothing), and nothing at all from the last rank of a group of two or more.
std::size_t a2a_count(int s, int d, int n) {
  if (n > 1 && s == n - 1) return 0;
  return static_cast<std::size_t>((s + d + 1) % 3) * 5;
}

// The bits of element j of the block rank s sends rank d: distinct per
// (s, d, j) and a finite number both as an fp32 integer and as bf16 bits.
std::uint16_t a2a_bits(int s, int d, std::size_t j) {
  return static_cast<std::uint16_t>((s << 12) | (d << 8) | static_cast<int>(j & 0xff));
}
constexpr std::uint16_t kGapBits = 0x7777;  // what lies between the received blocks, untouched

template <class T>
T a2a_element(std::uint16_t bits) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16::from_bits(bits);
  else
    return static_cast<real>(bits);
}

// Rank `me`'s layout: blocks one element apart, sent in reverse rank order
// and received in rank order after a leading gap, so every displacement matters.
AllToAllCounts a2a_layout(int me, int n) {
  AllToAllCounts c;
  for (auto* v : {&c.send_counts, &c.send_displs, &c.recv_counts, &c.recv_displs}) v->resize(n);
  std::size_t at = 0;
  for (int d = n - 1; d >= 0; --d) {
    c.send_counts[d] = a2a_count(me, d, n);
    c.send_displs[d] = at;
    at += c.send_counts[d] + 1;
  }
  at = 1;
  for (int s = 0; s < n; ++s) {
    c.recv_counts[s] = a2a_count(s, me, n);
    c.recv_displs[s] = at;
    at += c.recv_counts[s] + 1;
  }
  return c;
}

// Bytes this rank sends plus receives, by the formula (its own block included).
std::int64_t a2a_bytes(int me, int n, std::size_t element) {
  std::size_t elements = 0;
  for (int r = 0; r < n; ++r) elements += a2a_count(me, r, n) + a2a_count(r, me, n);
  return static_cast<std::int64_t>(elements * element);
}

template <class T>
Kokkos::View<T*, MemSpace> device_of(const std::vector<T>& host) {
  Kokkos::View<T*, MemSpace> v("comm_test_a2a", host.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < host.size(); ++i) h(i) = host[i];
  Kokkos::deep_copy(v, h);
  return v;
}

// One all-to-all-v of T over `c`, blocking or not: the received buffer
// against the reference bit for bit (gaps included), and the accounting.
template <class T>
void check_all_to_all_v(Communicator& c, bool blocking) {
  const int n = c.size(), me = c.rank();
  const AllToAllCounts layout = a2a_layout(me, n);
  std::vector<T> send(layout.send_displs[0] + layout.send_counts[0] + 1, a2a_element<T>(kGapBits));
  for (int d = 0; d < n; ++d)
    for (std::size_t j = 0; j < layout.send_counts[d]; ++j)
      send[layout.send_displs[d] + j] = a2a_element<T>(a2a_bits(me, d, j));
  std::vector<T> want(layout.recv_displs[n - 1] + layout.recv_counts[n - 1] + 1, a2a_element<T>(kGapBits));
  for (int s = 0; s < n; ++s)
    for (std::size_t j = 0; j < a2a_count(s, me, n); ++j)
      want[layout.recv_displs[s] + j] = a2a_element<T>(a2a_bits(s, me, j));
  const auto send_v = device_of(send);
  const auto recv_v = device_of(std::vector<T>(want.size(), a2a_element<T>(kGapBits)));

  c.reset_stats();
  if (blocking) {
    c.all_to_all_v(send_v.data(), recv_v.data(), layout);
  } else {
    CommRequest r = c.iall_to_all_v(send_v.data(), recv_v.data(), layout);
    EXPECT_EQ(c.stats().calls, 1);  // counted at issue
    r.wait();
  }
  auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), recv_v);
  ASSERT_EQ(got.extent(0), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(std::memcmp(&got(i), &want[i], sizeof(T)), 0) << "element " << i << " of rank " << me;
  EXPECT_EQ(c.stats().calls, 1);
  EXPECT_EQ(c.stats().bytes, a2a_bytes(me, n, sizeof(T)));
  EXPECT_GT(c.stats().ms, 0.0);
  if (blocking) EXPECT_DOUBLE_EQ(c.stats().exposed_ms, c.stats().ms);
  EXPECT_LE(c.stats().exposed_ms, c.stats().ms);
}

TEST_P(CommTest, AllToAllVMovesUnevenBlocksBitwise) {
  for (bool blocking : {true, false}) {
    SCOPED_TRACE(blocking ? "blocking" : "non-blocking");
    check_all_to_all_v<real>(*comm_, blocking);
    check_all_to_all_v<bf16>(*comm_, blocking);
  }
  // Nothing to move anywhere: every rank still calls, and it completes.
  const std::vector<std::size_t> zeros(comm_->size(), 0);
  comm_->reset_stats();
  comm_->all_to_all_v<real>(nullptr, nullptr, AllToAllCounts::packed(zeros, zeros));
  EXPECT_EQ(comm_->stats().calls, 1);
  EXPECT_EQ(comm_->stats().bytes, 0);
}

TEST_P(CommTest, AllToAllVRefusesBadLayouts) {
  const std::size_t n = comm_->size();
  View1D buf("buf", 1);
  AllToAllCounts short_one = AllToAllCounts::packed(std::vector<std::size_t>(n, 0), std::vector<std::size_t>(n, 0));
  short_one.recv_displs.pop_back();
  EXPECT_THROW(comm_->all_to_all_v(buf.data(), buf.data(), short_one), Error);
  // More elements than MPI's int counts: refused before anything is read or
  // sent (the buffers are far too small), on every rank alike.
  std::vector<std::size_t> huge(n, 0);
  huge[comm_->rank()] = static_cast<std::size_t>(std::numeric_limits<int>::max()) + 1;
  EXPECT_THROW(comm_->all_to_all_v(buf.data(), buf.data(), AllToAllCounts::packed(huge, huge)), Error);
  comm_->all_reduce(buf.data(), 1);  // the group is still in step
}

// The signature the hang diagnosis compares (detail::spmd_signature) of
// c's newest ledger entry, as every rank of `group` has it (rank order).
std::vector<std::string> newest_signatures(const Communicator& c, MPI_Comm group) {
  const auto mine = c.recent_collectives();
  std::string sig;
  for (const auto& e : detail::ledger_entries())
    if (!mine.empty() && e.index == mine.back().index) sig = detail::spmd_signature(c.name(), e, "");
  constexpr int kChars = 96;
  sig.resize(kChars, ' ');
  int size = 1;
  MPI_Comm_size(group, &size);
  std::vector<char> all(static_cast<std::size_t>(size) * kChars);
  MPI_Allgather(sig.data(), kChars, MPI_CHAR, all.data(), kChars, MPI_CHAR, group);
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.emplace_back(all.data() + r * kChars, kChars);
  return out;
}

TEST_P(CommTest, AllToAllVLedgersAgreeAcrossUnevenCountsButNotOtherCalls) {
  const int n = comm_->size(), me = comm_->rank();
  const AllToAllCounts layout = a2a_layout(me, n);
  View1D send("send", 64), recv("recv", 64);
  comm_->all_to_all_v(send.data(), recv.data(), layout);
  const auto ledger = comm_->recent_collectives();
  ASSERT_EQ(ledger.size(), 1u);
  EXPECT_EQ(ledger[0].op, "all_to_all_v");
  EXPECT_EQ(ledger[0].bytes, a2a_bytes(me, n, sizeof(real)));  // the ledger still shows this rank's bytes
  if (n > 1) {
    std::int64_t lo = ledger[0].bytes, hi = ledger[0].bytes;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT64_T, MPI_MIN, mpi_);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT64_T, MPI_MAX, mpi_);
    ASSERT_LT(lo, hi) << "the ranks are meant to move different amounts";
  }
  const auto same = newest_signatures(*comm_, mpi_);
  for (int r = 1; r < n; ++r) EXPECT_EQ(same[r], same[0]) << "rank " << r << " against rank 0";

  // Next, rank 0 calls an all-reduce where the others call an all-to-all-v
  // (each on a group of its own, named as this one, so nothing waits): its
  // entry differs from theirs, which still agree among themselves.
  MPI_Comm self = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_SELF, &self);
  {
    Communicator alone(self, comm_->name());
    View1D a("a", 16), b("b", 16);
    const std::size_t own = static_cast<std::size_t>(me % 4) + 1;  // bytes differ between ranks
    if (me == 0)
      alone.all_reduce(a.data(), 4);
    else
      alone.all_to_all_v(a.data(), b.data(), AllToAllCounts::packed({own}, {own}));
    const auto sigs = newest_signatures(alone, mpi_);
    for (int r = 1; r < n; ++r) {
      EXPECT_NE(sigs[r], sigs[0]) << "rank " << r << " against rank 0's all-reduce";
      EXPECT_EQ(sigs[r], sigs[n - 1]) << "rank " << r << " against rank " << n - 1;
    }
  }
  MPI_Comm_free(&self);
  // A collective of fixed size still compares its bytes.
  detail::LedgerEntry e;
  e.op = detail::CollOp::all_reduce;
  e.bytes = 4;
  detail::LedgerEntry f = e;
  f.bytes = 8;
  EXPECT_NE(detail::spmd_signature("dp", e, ""), detail::spmd_signature("dp", f, ""));
  e.op = f.op = detail::CollOp::all_to_all_v;
  EXPECT_EQ(detail::spmd_signature("dp", e, ""), detail::spmd_signature("dp", f, ""));
}

INSTANTIATE_TEST_SUITE_P(Groups, CommTest, ::testing::Values("world", "split", "world_watched", "split_watched"),
                         [](const auto& info) { return info.param; });

// The MPI backend's path to MemSpace buffers. Host memory goes to MPI as it
// is, unless NDMINI_MPI_CUDA_AWARE=0 asks for the staged path (the way a GPU
// build without a CUDA-aware MPI runs): test_comm_staged_* run this whole
// suite so, which checks every staged call against the same values.
TEST(CommDevicePath, StagesExactlyWhenAsked) {
  const std::string line = detail::mpi_device_path_description();
  const bool staged = line.find("staged through") != std::string::npos;
  const char* env = std::getenv("NDMINI_MPI_CUDA_AWARE");
  if (env != nullptr && std::string(env) == "0") EXPECT_TRUE(staged) << line;
  if (env == nullptr && !kDeviceMemory) EXPECT_TRUE(line.empty()) << "host memory needs no path: " << line;
  Communicator c(MPI_COMM_WORLD, "world");
  auto buf = device_from(rank_values(c.rank(), 100));
  const std::size_t before = detail::staged_buffers();
  c.all_reduce(buf.data(), 100);
  c.iall_reduce(buf.data(), 100).wait();
  EXPECT_EQ(detail::staged_buffers() - before, staged ? 2u : 0u);
}

TEST(CommStats, Adds) {
  CommStats a{1, 10, 1.5, 0.5}, b{2, 20, 2.0, 1.0};
  a += b;
  EXPECT_EQ(a.calls, 3);
  EXPECT_EQ(a.bytes, 30);
  EXPECT_DOUBLE_EQ(a.ms, 3.5);
  EXPECT_DOUBLE_EQ(a.exposed_ms, 1.5);
}

TEST(CollectiveWatchdog, NestedOnesStack) {
  // A train() inside a watched program builds its own: the newest governs,
  // and the outer one is back when it goes. Both with no deadline here,
  // so nothing can time out; the collectives still complete and are recorded.
  Communicator c(MPI_COMM_WORLD, "nested");
  double v = 0;
  {
    CollectiveWatchdog outer(MPI_COMM_WORLD, 0);
    {
      CollectiveWatchdog inner(MPI_COMM_WORLD, 0);
      v += c.all_reduce_scalar(1.0);
    }
    v += c.all_reduce_scalar(1.0);
    EXPECT_DOUBLE_EQ(outer.timeout_s(), 0.0);
  }
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  EXPECT_DOUBLE_EQ(v, 2.0 * n);
  EXPECT_EQ(c.recent_collectives().size(), 2u);
  EXPECT_THROW(CollectiveWatchdog(MPI_COMM_WORLD, -1), Error);
}

// A deadline of any size is kept in seconds, never as a time point that
// could overflow (1e300 s once made every collective time out at once); the
// raw MPI calls of comm/mpi/mpi_calls.hpp complete under it with their results
// and are entered in the ledger with their purpose. Non-finite deadlines
// are refused.
TEST(CollectiveWatchdog, HugeDeadlineAndRawCalls) {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CollectiveWatchdog watchdog(MPI_COMM_WORLD, 1e300);
  Communicator c(MPI_COMM_WORLD, "huge");
  EXPECT_DOUBLE_EQ(c.all_reduce_scalar(1.0), n);
  int one = 1, sum = 0;
  mpi_all_reduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, "a test sum");
  EXPECT_EQ(sum, n);
  long long root_value = 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) root_value = 42;
  mpi_broadcast(&root_value, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD, "a test broadcast");
  EXPECT_EQ(root_value, 42);
  mpi_barrier(MPI_COMM_WORLD, "a test barrier");
  EXPECT_NO_THROW(agree(MPI_COMM_WORLD, ""));
  EXPECT_THROW(agree(MPI_COMM_WORLD, rank == n - 1 ? "the last rank failed" : ""), Error);
  int purposes = 0;
  for (const auto& e : detail::ledger_entries())
    if (e.what != nullptr && std::string(e.what).rfind("a test ", 0) == 0) ++purposes;
  EXPECT_EQ(purposes, 3);
  EXPECT_THROW(CollectiveWatchdog(MPI_COMM_WORLD, std::numeric_limits<double>::infinity()), Error);
  EXPECT_THROW(CollectiveWatchdog(MPI_COMM_WORLD, std::numeric_limits<double>::quiet_NaN()), Error);
}

// Host work for `seconds` of wall time that makes no MPI call.
void spin_without_mpi(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() < end)
    for (int i = 0; i < 1000; ++i) sink = sink + 1e-9 * i;
}

// comm/progress.hpp: a 16 MiB all-reduce needs some 35 MPI calls' worth of
// progress on MPICH 4.0; with the thread it completes while every rank
// computes without an MPI call, so the first test() after the compute finds
// it done. (Without the thread the same test() is one call's worth of
// progress; that case is printed, not asserted: an MPI library with its own
// asynchronous progress may well be done too.)
TEST(MpiProgressThread, CompletesATransferDuringCompute) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);  // the same on every rank: they skip together
  if (level < MPI_THREAD_MULTIPLE) GTEST_SKIP() << "this MPI library does not provide MPI_THREAD_MULTIPLE";
  Communicator comm(MPI_COMM_WORLD, "dp_replicate");
  const std::size_t n = (std::size_t{16} << 20) / sizeof(real);
  constexpr double kComputeS = 3;  // some 35 polls at 100 us are needed; ample even on an oversubscribed node
  for (bool thread : {false, true}) {
    const MpiProgressThread progress(MPI_COMM_WORLD, thread ? 100 : 0);
    ASSERT_EQ(progress.running(), thread);
    auto buf = device_from(rank_values(comm.rank(), n));
    MPI_Barrier(MPI_COMM_WORLD);
    CommRequest request = comm.iall_reduce(buf.data(), n);
    spin_without_mpi(kComputeS);
    const bool done = request.test();
    if (thread) {
      EXPECT_TRUE(done) << "the all-reduce did not complete during " << kComputeS << " s of compute";
    } else if (comm.rank() == 0) {
      std::printf("[progress] without the thread, 16 MiB all-reduce %s after %g s of compute\n",
                  done ? "complete" : "not complete", kComputeS);
    }
    request.wait();
    expect_all_reduce(comm, buf, ReduceOp::sum);
  }
}

TEST(MpiProgressThread, OffWhenPollIsZero) {
  const MpiProgressThread progress(MPI_COMM_WORLD, 0);
  EXPECT_FALSE(progress.running());
}

TEST(Communicator, RejectsNullCommunicator) { EXPECT_THROW(Communicator(MPI_COMM_NULL, "tp"), Error); }

TEST(Communicator, NcclBackendNeedsNcclAndAGpu) {
  if (!nccl_available()) {
    EXPECT_THROW(Communicator(MPI_COMM_WORLD, "tp", Communicator::Backend::nccl), Error);
    return;
  }
  // Built with NCCL: on a machine without a GPU the constructor must say so.
  // One rank per communicator (MPI_COMM_SELF), so ranks sharing one GPU
  // cannot trip NCCL's one-rank-per-GPU rule when a GPU is present.
  try {
    Communicator c(MPI_COMM_SELF, "self", Communicator::Backend::nccl);
    EXPECT_EQ(c.backend(), Communicator::Backend::nccl);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ndmini
