// SPDX-License-Identifier: BSD-3-Clause
// The comm layer's NCCL backend on device buffers (cudaMalloc), against
// values computed from the ranks. Label gpu: without one GPU per rank on the
// node, every rank exits 77, which CTest reports as skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/nccl/nccl_backend.hpp"
#include "core/error.hpp"

namespace ndmini {
namespace {

real value(int rank, std::size_t i) { return static_cast<real>(rank * 1000 + static_cast<int>(i % 997)); }

std::vector<real> rank_values(int rank, std::size_t n) {
  std::vector<real> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = value(rank, i);
  return out;
}

// A device buffer of T, owned; NCCL needs device memory whatever Kokkos runs on.
template <class T>
class DeviceBufferOf {
 public:
  explicit DeviceBufferOf(std::size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), std::max<std::size_t>(n, 1) * sizeof(T)) != cudaSuccess)
      throw Error("cudaMalloc failed");
  }
  explicit DeviceBufferOf(const std::vector<T>& host) : DeviceBufferOf(host.size()) { upload(host); }
  ~DeviceBufferOf() { cudaFree(p_); }
  DeviceBufferOf(const DeviceBufferOf&) = delete;
  DeviceBufferOf& operator=(const DeviceBufferOf&) = delete;

  T* data() { return p_; }
  void upload(const std::vector<T>& host) {
    if (cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
      throw Error("cudaMemcpy to device failed");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw Error("cudaMemcpy to host failed");
    return host;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};
using DeviceBuffer = DeviceBufferOf<real>;

class NcclTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (GetParam() == "world") {
      MPI_Comm_dup(MPI_COMM_WORLD, &mpi_);
    } else {
      MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, -world_rank, &mpi_);
    }
    comm_ = std::make_unique<Communicator>(mpi_, GetParam(), Communicator::Backend::nccl);
  }
  void TearDown() override {
    comm_.reset();
    MPI_Comm_free(&mpi_);
  }

  MPI_Comm mpi_ = MPI_COMM_NULL;
  std::unique_ptr<Communicator> comm_;
};

void expect_all_reduce(const Communicator& c, const std::vector<real>& got, ReduceOp op) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    real want = value(0, i);
    for (int r = 1; r < c.size(); ++r) want = op == ReduceOp::sum ? want + value(r, i) : std::max(want, value(r, i));
    ASSERT_EQ(got[i], want) << "element " << i;
  }
}

TEST_P(NcclTest, AllReduce) {
  const std::size_t n = 1 << 20;
  EXPECT_EQ(comm_->backend(), Communicator::Backend::nccl);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    DeviceBuffer buf(rank_values(comm_->rank(), n));
    comm_->all_reduce(buf.data(), n, op);
    expect_all_reduce(*comm_, buf.download(), op);

    buf.upload(rank_values(comm_->rank(), n));
    CommRequest req = comm_->iall_reduce(buf.data(), n, op);
    req.wait();
    expect_all_reduce(*comm_, buf.download(), op);
  }
}

// The stream the model's kernels run on: Kokkos' in a CUDA Kokkos build,
// else the legacy default stream (which the backend also orders after).
cudaStream_t compute_stream() {
#ifdef KOKKOS_ENABLE_CUDA
  return Kokkos::Cuda().cuda_stream();
#else
  return nullptr;
#endif
}

// Page-locked host memory, so cudaMemcpyAsync is truly asynchronous.
class PinnedValues {
 public:
  explicit PinnedValues(const std::vector<real>& v) : n_(v.size()) {
    if (cudaMallocHost(reinterpret_cast<void**>(&p_), n_ * sizeof(real)) != cudaSuccess)
      throw Error("cudaMallocHost failed");
    std::copy(v.begin(), v.end(), p_);
  }
  ~PinnedValues() { cudaFreeHost(p_); }
  PinnedValues(const PinnedValues&) = delete;
  PinnedValues& operator=(const PinnedValues&) = delete;
  // Enqueues the upload on the compute stream and returns at once.
  void upload_async(real* device) const {
    if (cudaMemcpyAsync(device, p_, n_ * sizeof(real), cudaMemcpyHostToDevice, compute_stream()) != cudaSuccess)
      throw Error("cudaMemcpyAsync failed");
  }

 private:
  real* p_ = nullptr;
  std::size_t n_;
};

TEST_P(NcclTest, CollectivesWaitForTheComputeStream) {
  // The inputs are still being written on the compute stream when each
  // collective is issued (no host synchronisation in between): the
  // communication stream must wait for them on the device. 64 MiB take a
  // few milliseconds to upload, so a collective that did not wait would
  // read stale values.
  const std::size_t n = 1 << 24;
  const PinnedValues values(rank_values(comm_->rank(), n));
  DeviceBuffer buf(n);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(cudaMemset(buf.data(), 0, n * sizeof(real)), cudaSuccess);
    values.upload_async(buf.data());
    if (round < 2)
      comm_->all_reduce(buf.data(), n);
    else
      comm_->iall_reduce(buf.data(), n).wait();
    expect_all_reduce(*comm_, buf.download(), ReduceOp::sum);
  }
  // A ring exchange: what each rank receives was uploaded just before.
  const int next = (comm_->rank() + 1) % comm_->size(), prev = (comm_->rank() + comm_->size() - 1) % comm_->size();
  DeviceBuffer out(n), in(n);
  values.upload_async(out.data());
  comm_->batch_p2p({{P2POp::Kind::send, out.data(), n, next, 0}, {P2POp::Kind::recv, in.data(), n, prev, 0}}).wait();
  EXPECT_EQ(in.download(), rank_values(prev, n));
}

TEST(NcclChoice, EveryRankHasItsOwnGpu) {
  // This program runs only with a GPU per rank (see main): NCCL can run,
  // and the mesh axes get it exactly where MemSpace is device memory.
  EXPECT_EQ(detail::nccl_device_problem(MPI_COMM_WORLD), "");
  EXPECT_EQ(device_collectives_backend(MPI_COMM_WORLD),
            kDeviceMemory ? Communicator::Backend::nccl : Communicator::Backend::mpi);
  setenv("NDMINI_COMM_BACKEND", "mpi", 1);
  EXPECT_EQ(device_collectives_backend(MPI_COMM_WORLD), Communicator::Backend::mpi);
  setenv("NDMINI_COMM_BACKEND", "nccl", 1);
  EXPECT_EQ(device_collectives_backend(MPI_COMM_WORLD), Communicator::Backend::nccl);
  setenv("NDMINI_COMM_BACKEND", "gloo", 1);
  EXPECT_THROW(device_collectives_backend(MPI_COMM_WORLD), Error);
  unsetenv("NDMINI_COMM_BACKEND");
}

void expect_all_gather(const Communicator& c, const std::vector<real>& got, std::size_t per_rank) {
  for (int r = 0; r < c.size(); ++r)
    for (std::size_t i = 0; i < per_rank; ++i) ASSERT_EQ(got[r * per_rank + i], value(r, i)) << r << "," << i;
}

TEST_P(NcclTest, AllGather) {
  const std::size_t per_rank = 4099;
  DeviceBuffer send(rank_values(comm_->rank(), per_rank));
  DeviceBuffer recv(per_rank * comm_->size());
  comm_->all_gather(send.data(), recv.data(), per_rank);
  expect_all_gather(*comm_, recv.download(), per_rank);

  DeviceBuffer recv2(per_rank * comm_->size());
  comm_->iall_gather(send.data(), recv2.data(), per_rank).wait();
  expect_all_gather(*comm_, recv2.download(), per_rank);
}

TEST_P(NcclTest, ReduceScatter) {
  const std::size_t per_rank = 3001;
  DeviceBuffer send(rank_values(comm_->rank(), per_rank * comm_->size()));
  DeviceBuffer recv(per_rank);
  auto check = [&](const std::vector<real>& got) {
    for (std::size_t i = 0; i < per_rank; ++i) {
      real want = 0;
      for (int r = 0; r < comm_->size(); ++r) want += value(r, comm_->rank() * per_rank + i);
      ASSERT_EQ(got[i], want) << "element " << i;
    }
  };
  comm_->reduce_scatter(send.data(), recv.data(), per_rank);
  check(recv.download());

  DeviceBuffer recv2(per_rank);
  CommRequest req = comm_->ireduce_scatter(send.data(), recv2.data(), per_rank);
  while (!req.test()) {
  }
  check(recv2.download());
}

// bf16 sums (comm.reduce_dtype = "bf16") through ncclBfloat16: small
// integers, whose sums are exact in bf16, so any order of the ranks gives
// them; counted at 2 bytes a value.
TEST_P(NcclTest, Bf16Sums) {
  const int n = comm_->size(), rank = comm_->rank();
  const std::size_t count = 4099, per_rank = 1031;
  auto operand = [](int r, std::size_t i) { return bf16(static_cast<float>((r + 1) * (i % 7))); };
  auto sum = [&](std::size_t i) { return static_cast<float>(n * (n + 1) / 2 * (i % 7)); };
  std::vector<bf16> mine(count), blocks(per_rank * n);
  for (std::size_t i = 0; i < count; ++i) mine[i] = operand(rank, i);
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = operand(rank, i);

  comm_->reset_stats();
  DeviceBufferOf<bf16> blocking(mine), nonblocking(mine), send(blocks), recv(per_rank);
  comm_->all_reduce(blocking.data(), count);
  comm_->iall_reduce(nonblocking.data(), count).wait();
  comm_->ireduce_scatter(send.data(), recv.data(), per_rank).wait();
  EXPECT_EQ(comm_->stats().bytes, static_cast<std::int64_t>((2 * count + n * per_rank) * sizeof(bf16)));
  for (const auto& got : {blocking.download(), nonblocking.download()})
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(static_cast<float>(got[i]), sum(i)) << "element " << i;
  const auto got = recv.download();
  for (std::size_t i = 0; i < per_rank; ++i)
    ASSERT_EQ(static_cast<float>(got[i]), sum(rank * per_rank + i)) << "element " << i;
}

TEST_P(NcclTest, BroadcastAndSendRecv) {
  const std::size_t n = 1000;
  for (int root = 0; root < comm_->size(); ++root) {
    DeviceBuffer buf(rank_values(comm_->rank(), n));
    comm_->broadcast(buf.data(), n, root);
    EXPECT_EQ(buf.download(), rank_values(root, n));
  }
  const int peer = comm_->rank() ^ 1;
  if (peer >= comm_->size()) return;
  DeviceBuffer out(rank_values(comm_->rank(), n)), in(n);
  if (comm_->rank() < peer) {
    comm_->send(out.data(), n, peer);
    comm_->recv(in.data(), n, peer);
  } else {
    comm_->recv(in.data(), n, peer);
    comm_->send(out.data(), n, peer);
  }
  EXPECT_EQ(in.download(), rank_values(peer, n));
}

TEST_P(NcclTest, Accounting) {
  const std::int64_t n = comm_->size(), f = sizeof(real);
  DeviceBuffer a(1 << 16), b((1 << 16) * comm_->size());
  comm_->all_reduce(a.data(), 100);
  comm_->all_gather(a.data(), b.data(), 10);
  EXPECT_EQ(comm_->stats().calls, 2);
  EXPECT_EQ(comm_->stats().bytes, (100 + 10 * n) * f);
  EXPECT_GT(comm_->stats().ms, 0.0);
  EXPECT_DOUBLE_EQ(comm_->stats().exposed_ms, comm_->stats().ms);

  comm_->reset_stats();
  {
    CommRequest forgotten = comm_->ireduce_scatter(b.data(), a.data(), 1000);  // completed by its destructor
  }
  EXPECT_EQ(comm_->stats().calls, 1);
  EXPECT_EQ(comm_->stats().bytes, 1000 * n * f);
  EXPECT_GT(comm_->stats().ms, 0.0);
  EXPECT_LE(comm_->stats().exposed_ms, comm_->stats().ms);

  // Host scalars go over MPI even on the NCCL backend.
  EXPECT_DOUBLE_EQ(comm_->all_reduce_scalar(1.0), static_cast<double>(comm_->size()));
}

// Rank s sends rank d (s + d + 1) % 3 * 5 elements (zero for some pairs),
// the last rank of a group of two or more nothing; packed blocks, bits
// distinct per (s, d, j), compared bit for bit in fp32 and in bf16.
TEST_P(NcclTest, AllToAllV) {
  const int n = comm_->size(), me = comm_->rank();
  auto count = [n](int s, int d) -> std::size_t { return n > 1 && s == n - 1 ? 0 : (s + d + 1) % 3 * 5; };
  auto bits = [](int s, int d, std::size_t j) { return static_cast<std::uint16_t>((s << 12) | (d << 8) | j); };
  std::vector<std::size_t> sc(n), rc(n);
  for (int r = 0; r < n; ++r) {
    sc[r] = count(me, r);
    rc[r] = count(r, me);
  }
  const AllToAllCounts layout = AllToAllCounts::packed(sc, rc);
  std::vector<std::uint16_t> send, want;
  for (int d = 0; d < n; ++d)
    for (std::size_t j = 0; j < sc[d]; ++j) send.push_back(bits(me, d, j));
  for (int s = 0; s < n; ++s)
    for (std::size_t j = 0; j < rc[s]; ++j) want.push_back(bits(s, me, j));
  std::vector<bf16> send16;
  std::vector<real> send32;
  for (std::uint16_t b : send) {
    send16.push_back(bf16::from_bits(b));
    send32.push_back(static_cast<real>(b));
  }
  comm_->reset_stats();
  DeviceBufferOf<bf16> in16(send16), out16(want.size());
  DeviceBuffer in32(send32), out32(want.size());
  comm_->all_to_all_v(in32.data(), out32.data(), layout);
  comm_->iall_to_all_v(in16.data(), out16.data(), layout).wait();
  const auto got32 = out32.download();
  const auto got16 = out16.download();
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got32[i], static_cast<real>(want[i])) << "fp32 element " << i;
    ASSERT_EQ(got16[i].bits, want[i]) << "bf16 element " << i;
  }
  EXPECT_EQ(comm_->stats().calls, 2);
  EXPECT_EQ(comm_->stats().bytes,
            static_cast<std::int64_t>((send.size() + want.size()) * (sizeof(real) + sizeof(bf16))));
}

INSTANTIATE_TEST_SUITE_P(Groups, NcclTest, ::testing::Values("world", "split"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ndmini

// CTest's SKIP_RETURN_CODE for this test.
constexpr int kSkip = 77;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  // NCCL allows one rank per GPU: skip unless this node has a GPU for every
  // rank on it. Every rank decides the same, so all exit 77 together.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  int skip = devices < local_size ? 1 : 0, any_skip = 0;
  MPI_Allreduce(&skip, &any_skip, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_skip) {
    if (rank == 0) {
      if (devices == 0) {
        std::printf("no GPU: skipping NCCL tests\n");
      } else {
        std::printf("%d GPU(s) for %d ranks on a node (NCCL needs one each): skipping NCCL tests\n", devices,
                    local_size);
      }
    }
    MPI_Finalize();
    return kSkip;
  }

  // One GPU per rank on the node, chosen before Kokkos so a CUDA Kokkos uses
  // the same one (the NCCL backend takes the current device).
  cudaSetDevice(local_rank % devices);
  std::vector<char*> args(argv, argv + argc);
  std::string device_arg = "--kokkos-device-id=" + std::to_string(local_rank % devices);
#ifdef KOKKOS_ENABLE_CUDA
  args.push_back(device_arg.data());
#endif
  int kargc = static_cast<int>(args.size());
  Kokkos::initialize(kargc, args.data());
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  Kokkos::finalize();
  MPI_Finalize();
  return worst;
}
