// SPDX-License-Identifier: BSD-3-Clause
#include "core/signals.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <thread>

namespace ndmini {
namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
constexpr int kCount = sizeof(kStopSignals) / sizeof(kStopSignals[0]);
// The watcher thread's commands, one byte each through the pipe.
constexpr char kEnd = 'e';
constexpr char kQuit = 'q';
// An EndAtOnce that has not ended the process by then (MPI_Abort stuck on a
// dead launcher) is overtaken by _exit: the job never hangs on its way out.
constexpr auto kEndBackstop = std::chrono::seconds(10);

// Lock-free atomics: safe in a handler, and a signal may run it on any thread.
std::atomic<int> received{0};
std::atomic<long long> first_ns{0};
std::atomic<bool> terminal_seen{false};
std::atomic<int> ending_status{0};
static_assert(std::atomic<long long>::is_always_lock_free, "the handler needs lock-free atomics");

int pipe_fds[2] = {-1, -1};
// On the heap: exit() (MPI_Abort's, with this still installed) runs static
// destructors, and a joinable std::thread's calls std::terminate.
std::thread* watcher = nullptr;
EndAtOnce end_at_once_fn = nullptr;
struct sigaction previous[kCount];

long long now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void say(const char* text) {
  const ssize_t ignored = write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// Written with write(2), the only output a handler may use: no formatting.
const char* second_signal_message(int sig) {
  switch (sig) {
    case SIGTERM:
      return "ndmini: second signal (SIGTERM): ending the job at once with status 143\n";
    case SIGINT:
      return "ndmini: second signal (SIGINT): ending the job at once with status 130\n";
    case SIGUSR1:
      return "ndmini: second signal (SIGUSR1): ending the job at once with status 138\n";
    default:
      return "ndmini: second signal: ending the job at once\n";
  }
}

// Async-signal-safe: records the first request, absorbs its copies, and
// hands a deliberate second one to the watcher thread (MPI_Abort is not
// safe here) or, without one, _exits.
extern "C" void on_stop_signal(int sig, siginfo_t* info, void*) {
  const long long t = now_ns();
  // The terminal driver sends Ctrl-C's SIGINT as the kernel; a launcher's or
  // scheduler's copy comes from kill(2).
  const bool from_terminal = info != nullptr && info->si_code == SI_KERNEL;
  const bool terminal_before = from_terminal && terminal_seen.exchange(true);
  long long unset = 0;
  if (first_ns.compare_exchange_strong(unset, t)) {
    received = sig;
    return;
  }
  // Another thread is recording the first request this very moment.
  while (received.load() == 0) {
  }
  const bool copy = sig == received.load() && t - first_ns.load() < kCopyWindowSeconds * 1e9 && !terminal_before;
  if (copy) return;
  int none = 0;
  if (!ending_status.compare_exchange_strong(none, signal_exit_status(sig))) return;  // already ending
  say(second_signal_message(sig));
  const ssize_t sent = pipe_fds[1] >= 0 ? write(pipe_fds[1], &kEnd, 1) : -1;
  if (sent != 1) _exit(signal_exit_status(sig));
}

// Waits for the handler's word and ends the job off the handler's stack.
void watch() {
  char command = 0;
  while (read(pipe_fds[0], &command, 1) != 1 || command != kQuit) {
    if (command != kEnd) continue;
    const int status = ending_status.load();
    std::thread([status] {
      std::this_thread::sleep_for(kEndBackstop);
      _exit(status);
    }).detach();
    if (end_at_once_fn != nullptr) end_at_once_fn(status);
    _exit(status);
  }
}

}  // namespace

StopSignals::StopSignals(EndAtOnce end_at_once) {
  received = 0;
  first_ns = 0;
  terminal_seen = false;
  ending_status = 0;
  end_at_once_fn = end_at_once;
  // Without the pipe (no descriptors left) a second request simply _exits.
  if (pipe2(pipe_fds, O_CLOEXEC) == 0) {
    watcher = new std::thread(watch);
  } else {
    pipe_fds[0] = pipe_fds[1] = -1;
  }
  struct sigaction action {};
  action.sa_sigaction = on_stop_signal;
  // One stop signal at a time per thread: the handler is never nested in itself.
  sigemptyset(&action.sa_mask);
  for (const int sig : kStopSignals) sigaddset(&action.sa_mask, sig);
  // A system call the signal interrupts resumes (MPI's and HDF5's I/O, poll)
  // instead of failing with EINTR.
  action.sa_flags = SA_RESTART | SA_SIGINFO;
  for (int i = 0; i < kCount; ++i) {
    sigaction(kStopSignals[i], nullptr, &previous[i]);
    // Ignored by whoever started us (SIGINT in a shell's background job): stays ignored.
    if (previous[i].sa_handler != SIG_IGN) sigaction(kStopSignals[i], &action, nullptr);
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < kCount; ++i) sigaction(kStopSignals[i], &previous[i], nullptr);
  if (watcher != nullptr) {
    const ssize_t sent = write(pipe_fds[1], &kQuit, 1);
    if (sent == 1) {
      watcher->join();
    } else {
      watcher->detach();
    }
    delete watcher;
    watcher = nullptr;
  }
  for (int& fd : pipe_fds) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

int stop_signal_received() { return received; }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "signal";
  }
}

int signal_exit_status(int sig) { return 128 + sig; }

}  // namespace ndmini
