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
// request's transfer is unfinished, it pokes MPI's progress engine
// (MPI_Iprobe on a communicator of its own, so it never receives a message
// of the model) every poll_us microseconds and sleeps in between. After each
// poke it asks MPI whether the requests in flight are done
// (MPI_Request_get_status, which completes nothing); once they are, or
// with nothing in flight, it sleeps on a condition variable until the next
// request is issued, so it costs nothing while the caller computes on.
//
// Only what the model issues non-blocking counts (CommRequest::Impl::
// moved_by_mpi): a blocking call waited for under the watchdog's deadline
// polls by itself. Needs MPI_THREAD_MULTIPLE (main asks for it whatever
// comm.progress_poll_us says): where the library provides less, or poll_us
// is 0, no thread starts and MPI progresses inside its own calls only;
// running() says which. Several may live at once (each stops its own thread).
#include <mpi.h>

#include <mutex>
#include <thread>

#include "comm/communicator.hpp"

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
  bool stop_ = false;  // guarded by the in-flight count's mutex (progress.cpp)
  std::thread thread_;
};

namespace detail {
// Called by the comm layer when a request that MPI moves is issued
// non-blocking, and when it is done (completed or destroyed).
void mpi_request_started(const CommRequest::Impl* request);
void mpi_request_finished(const CommRequest::Impl* request);
// Held by the progress thread while it looks at the requests in flight, and
// by the MPI backend around MPI_Test/MPI_Wait of a request.
std::mutex& mpi_request_mutex();
}  // namespace detail

}  // namespace ndmini
