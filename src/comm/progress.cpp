// SPDX-License-Identifier: BSD-3-Clause
#include "comm/progress.hpp"

#include <chrono>

namespace ndmini {
namespace {

// What the thread waits on: the number of MPI requests in flight in this
// process, and whether it should stop. One process-wide state, as MPI's
// progress engine is one per process.
struct InFlight {
  std::mutex mutex;
  std::condition_variable changed;
  long requests = 0;
  bool stop = false;
};

InFlight& in_flight() {
  static InFlight state;
  return state;
}

}  // namespace

namespace detail {

void mpi_request_started() {
  InFlight& s = in_flight();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.requests++ == 0) s.changed.notify_one();
}

void mpi_request_finished() {
  InFlight& s = in_flight();
  std::lock_guard<std::mutex> lock(s.mutex);
  --s.requests;
}

}  // namespace detail

MpiProgressThread::MpiProgressThread(MPI_Comm world, double poll_us) : poll_us_(poll_us) {
  if (poll_us_ <= 0) return;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  // Every rank got the same thread level from the same library: the choice
  // (and with it the collective MPI_Comm_dup) is the same on every rank.
  if (provided < MPI_THREAD_MULTIPLE) return;
  MPI_Comm_dup(world, &comm_);
  {
    InFlight& s = in_flight();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stop = false;
  }
  thread_ = std::thread([this] { loop(); });
}

MpiProgressThread::~MpiProgressThread() {
  if (thread_.joinable()) {
    {
      InFlight& s = in_flight();
      std::lock_guard<std::mutex> lock(s.mutex);
      s.stop = true;
    }
    in_flight().changed.notify_one();
    thread_.join();
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void MpiProgressThread::loop() {
  InFlight& s = in_flight();
  const auto pause = std::chrono::duration<double, std::micro>(poll_us_);
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    s.changed.wait(lock, [&] { return s.stop || s.requests > 0; });
    if (s.stop) return;
    lock.unlock();
    // Any MPI call runs the progress engine; a probe for a message that is
    // never sent on this communicator changes nothing else.
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(pause);
    lock.lock();
  }
}

}  // namespace ndmini
