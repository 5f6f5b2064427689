// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Background progress for the MPI backend's non-blocking requests.
//
// MPICH (4.0.2, ch4:ucx on this project's machines) moves a non-blocking
// collective's data only inside MPI calls, about 0.5 MiB per call: a 16 MiB
// all-reduce needs some 35 calls to complete. Polled between blocks (one
// test every 100-300 ms of compute), the bucket reductions of data
// parallelism and FSDP's gathers barely move while the model computes, and
// the transfer lands in the final wait. While this thread lives and an MPI
// request is in flight, it pokes MPI's progress engine (MPI_Iprobe on a
// communicator of its own, so it never touches a request or a message of
// the model) every poll_us microseconds and sleeps in between; with nothing
// in flight it sleeps on a condition variable and costs nothing.
//
// Needs MPI_THREAD_MULTIPLE (MPI_Init_thread in main): where the library
// provides less, or poll_us is 0, no thread starts and MPI progresses inside
// MPI calls only, as before; running() says which.
#include <mpi.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace ndmini {

class MpiProgressThread {
 public:
  // Collective over `world` (duplicates it for the thread's probes).
  MpiProgressThread(MPI_Comm world, double poll_us);
  ~MpiProgressThread();
  MpiProgressThread(const MpiProgressThread&) = delete;
  MpiProgressThread& operator=(const MpiProgressThread&) = delete;

  bool running() const { return thread_.joinable(); }

 private:
  void loop();

  MPI_Comm comm_ = MPI_COMM_NULL;
  double poll_us_;
  std::thread thread_;
};

namespace detail {
// Called by the MPI backend when a request is issued and when it is done.
void mpi_request_started();
void mpi_request_finished();
}  // namespace detail

}  // namespace ndmini
