// SPDX-License-Identifier: BSD-3-Clause
#include "comm/progress.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <vector>

#include "comm/backend.hpp"
#include "core/error.hpp"

namespace ndmini {
namespace {

// The requests in flight in this process (one list, as MPI's progress engine
// is one per process), a count of registrations (so a thread that found
// everything done waits for a new one), and the condition variable that
// announces them. Guarded by `mutex`, which is detail::mpi_request_mutex();
// each thread's stop flag is its own object's, under the same mutex.
struct InFlight {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<const CommRequest::Impl*> requests;
  std::uint64_t issued = 0;
};

InFlight& in_flight() {
  static InFlight state;
  return state;
}

}  // namespace

namespace detail {

std::mutex& mpi_request_mutex() { return in_flight().mutex; }

void mpi_request_started(const CommRequest::Impl* request) {
  InFlight& s = in_flight();
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.requests.push_back(request);
    ++s.issued;
  }
  s.changed.notify_all();
}

void mpi_request_finished(const CommRequest::Impl* request) {
  InFlight& s = in_flight();
  const std::lock_guard<std::mutex> lock(s.mutex);
  const auto it = std::find(s.requests.begin(), s.requests.end(), request);
  if (it != s.requests.end()) s.requests.erase(it);
}

}  // namespace detail

MpiProgressThread::MpiProgressThread(MPI_Comm world, double poll_us) : poll_us_(poll_us) {
  if (poll_us_ <= 0) return;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  // Every rank got the same thread level from the same library: the choice
  // (and with it the collective MPI_Comm_dup) is the same on every rank.
  if (provided < MPI_THREAD_MULTIPLE) return;
  if (MPI_Comm_dup(world, &comm_) != MPI_SUCCESS) throw Error("MPI_Comm_dup failed for the progress thread");
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiProgressThread::~MpiProgressThread() {
  if (thread_.joinable()) {
    {
      const std::lock_guard<std::mutex> lock(in_flight().mutex);
      stop_ = true;
    }
    in_flight().changed.notify_all();  // every waiting thread re-checks; only this one stops
    thread_.join();
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void MpiProgressThread::loop() {
  InFlight& s = in_flight();
  const auto pause = std::chrono::duration<double, std::micro>(poll_us_);
  std::uint64_t all_done_at = ~std::uint64_t{0};  // `issued` when every transfer was found done
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    s.changed.wait(lock, [&] { return stop_ || (!s.requests.empty() && s.issued != all_done_at); });
    if (stop_) return;
    lock.unlock();
    // Any MPI call runs the progress engine; a probe for a message that is
    // never sent on this communicator changes nothing else.
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(pause);
    lock.lock();
    // Done at MPI's level, waiting only for the caller's test or wait:
    // nothing left to move until the next request.
    if (std::all_of(s.requests.begin(), s.requests.end(),
                    [](const CommRequest::Impl* r) { return r->mpi_transfer_done(); }))
      all_done_at = s.issued;
  }
}

}  // namespace ndmini
