#include "watchdog.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "gradnorm/harness/descendants.hpp"
#include "interpreter.hpp"

namespace gradnorm::python::detail {

std::atomic<long> step_timeout_ms{60'000};

namespace {
thread_local int watched_calls = 0;  // watchdogs alive on this thread
}  // namespace

Watchdog::Watchdog(std::function<void(std::chrono::milliseconds)> on_expiry,
                   std::function<std::string(std::chrono::milliseconds)> give_up, int give_up_status)
    : on_expiry_(std::move(on_expiry)),
      give_up_(std::move(give_up)),
      give_up_status_(give_up_status),
      python_thread_(PyThread_get_thread_ident()),
      outermost_(watched_calls++ == 0) {
  if (outermost_) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  --watched_calls;
  if (!outermost_) return;
  {
    py::gil_scoped_release unlocked;  // the watchdog may be waiting for the GIL
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  // An interrupt that arrived as the call returned must not fire in later Python code.
  PyThreadState_SetAsyncExc(python_thread_, nullptr);
}

void Watchdog::watch() {
  const auto timeout = std::chrono::milliseconds(step_timeout_ms.load());
  std::unique_lock lock(mutex_);
  if (done_cv_.wait_for(lock, timeout, [this] { return done_; })) return;
  expired_ = true;
  on_expiry_(timeout);
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (!done_) {
    if (std::chrono::steady_clock::now() > give_up) {
      std::fprintf(stderr, "gradnorm: %s\n", give_up_(timeout).c_str());
      std::fflush(stderr);
      harness::end_descendants();
      std::_Exit(give_up_status_);
    }
    lock.unlock();
    {
      py::gil_scoped_acquire gil;
      std::lock_guard check(mutex_);
      if (!done_) {
        PyThreadState_SetAsyncExc(python_thread_,
                                  Interpreter::get().runtime().attr("HarnessInterrupt").ptr());
      }
    }
    lock.lock();
    done_cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return done_; });
  }
}

std::unique_ptr<Watchdog> loading_watchdog(std::string what) {
  return std::make_unique<Watchdog>(
      [](std::chrono::milliseconds) {},
      [what = std::move(what)](std::chrono::milliseconds timeout) {
        return fmt::format("{} within {} ms (--timeout) and ignored the harness's interrupt for "
                           "{} ms more: stopped before any rank ran",
                           what, timeout.count(), timeout.count());
      },
      2);
}

}  // namespace gradnorm::python::detail
