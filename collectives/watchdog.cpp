#include "collectives/watchdog.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "emu/check.h"

namespace emu::coll::watchdog {
namespace {

using Clock = std::chrono::steady_clock;

// Allocated once and never freed: the detached thread may still wait on it while the process exits.
struct State {
  std::mutex mutex;
  std::condition_variable wake;
  bool started = false;
  bool armed = false;
  bool idle_wait = false;           // the thread waits without a deadline and must be woken to see one
  Clock::time_point waiting_until;  // the deadline the thread waits for, when it waits for one
  uint64_t generation = 0;
  double seconds = 0;
  Clock::time_point deadline;
  std::string what;
};

State& state() {
  static State* instance = new State;
  return *instance;
}

[[noreturn]] void fire(const std::string& what, double seconds) {
  std::fprintf(stderr, "%s coll: watchdog: %s did not complete within %.3g s; ending the job\n", rank_tag().c_str(),
               what.c_str(), seconds);
  std::fflush(stderr);
  // Let the peers that wait in the same collective reach their own deadline and say where they are.
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(1.0, 0.5 * seconds)));
  fatal("collective timed out (watchdog): " + what, __FILE__, __LINE__, kExitInternal);
}

void watch() {
  State& s = state();
  std::unique_lock lock(s.mutex);
  for (;;) {
    if (!s.armed) {
      s.idle_wait = true;
      s.wake.wait(lock, [&] { return s.armed; });
      s.idle_wait = false;
      continue;
    }
    const uint64_t generation = s.generation;
    const Clock::time_point deadline = s.deadline;
    s.waiting_until = deadline;
    s.wake.wait_until(lock, deadline);
    s.waiting_until = Clock::time_point::max();
    if (s.armed && s.generation == generation && Clock::now() >= deadline) fire(s.what, s.seconds);
  }
}

}  // namespace

void arm(double seconds, std::string what) {
  if (seconds <= 0) return;
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.armed = true;
  ++s.generation;
  s.seconds = seconds;
  s.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  s.what = std::move(what);
  if (!s.started) {
    s.started = true;
    std::thread(watch).detach();
  } else if (s.idle_wait || s.deadline < s.waiting_until) {
    s.wake.notify_one();
  }
}

void disarm() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.armed = false;
}

}  // namespace emu::coll::watchdog
