#pragma once
// Bounds a call into user code by --timeout (docs/reliability.md, "Timeouts"): a Python step,
// a step's or recipe's import, a model's builder and its forward.

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace gradnorm::python::detail {

// --timeout, in milliseconds (set_step_timeout).
extern std::atomic<long> step_timeout_ms;

// When the time is up it runs `on_expiry` (without the GIL) and raises HarnessInterrupt in the
// calling thread (the interpreter checks for it between bytecodes), again every 100 ms: code
// may catch BaseException once, not forever. Code blocked inside one C call (time.sleep, a
// lock) notices only when that call returns; code that still runs another timeout later cannot
// be stopped from outside its thread, so the process ends as a supervisor would end it,
// printing `give_up` and exiting with `give_up_status`. Built and destroyed with the GIL held.
//
// Calls nest (a Python step calls the model's forward): only the outermost one on a thread
// watches, and an inner one neither interrupts nor expires.
class Watchdog {
 public:
  Watchdog(std::function<void(std::chrono::milliseconds)> on_expiry,
           std::function<std::string(std::chrono::milliseconds)> give_up, int give_up_status);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Whether the time ran out (read after the call returned or raised).
  [[nodiscard]] bool expired() const { return expired_.load(); }

 private:
  void watch();

  std::function<void(std::chrono::milliseconds)> on_expiry_;
  std::function<std::string(std::chrono::milliseconds)> give_up_;
  int give_up_status_;
  unsigned long python_thread_;
  bool outermost_;
  std::atomic<bool> expired_{false};
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

// A call that must finish before any row runs (an import, a model's build, cannot_run): past
// the timeout the call is interrupted (the caller turns that into an input error), and past
// another the process exits 2 with "WHAT within N ms (--timeout) and ignored ...".
[[nodiscard]] std::unique_ptr<Watchdog> loading_watchdog(std::string what);

}  // namespace gradnorm::python::detail
