// SPDX-License-Identifier: BSD-3-Clause
#include "core/signals.hpp"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace ndmini {
namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
constexpr int kCount = sizeof(kStopSignals) / sizeof(kStopSignals[0]);

volatile std::sig_atomic_t received = 0;
struct sigaction previous[kCount];

// Written with write(2), the only output a handler may use: no formatting.
const char* second_signal_message(int sig) {
  switch (sig) {
    case SIGTERM:
      return "ndmini: second signal (SIGTERM): exiting at once with status 143\n";
    case SIGINT:
      return "ndmini: second signal (SIGINT): exiting at once with status 130\n";
    case SIGUSR1:
      return "ndmini: second signal (SIGUSR1): exiting at once with status 138\n";
    default:
      return "ndmini: second signal: exiting at once\n";
  }
}

// Async-signal-safe: records the first signal; a second ends the process
// (the caller asked twice; a save in progress leaves only its .tmp folder).
extern "C" void on_stop_signal(int sig) {
  if (received == 0) {
    received = sig;
    return;
  }
  const char* message = second_signal_message(sig);
  const ssize_t ignored = write(STDERR_FILENO, message, std::strlen(message));
  (void)ignored;
  _exit(signal_exit_status(sig));
}

}  // namespace

StopSignals::StopSignals() {
  received = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // A system call the signal interrupts resumes (MPI's and HDF5's I/O, poll)
  // instead of failing with EINTR.
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < kCount; ++i) {
    sigaction(kStopSignals[i], nullptr, &previous[i]);
    // Ignored by whoever started us (SIGINT in a shell's background job): stays ignored.
    if (previous[i].sa_handler != SIG_IGN) sigaction(kStopSignals[i], &action, nullptr);
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < kCount; ++i) sigaction(kStopSignals[i], &previous[i], nullptr);
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
