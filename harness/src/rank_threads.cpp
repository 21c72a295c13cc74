#include "rank_threads.hpp"

#include <fmt/format.h>

#include "gradnorm/harness/communicator.hpp"
#include "gradnorm/harness/runner.hpp"

#include <atomic>
#include <condition_variable>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

namespace gradnorm::harness {
namespace {

// One pooled thread: waits for a job, runs it, counts its latch down, waits again.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) { thread_.detach(); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start(std::function<void()> job, std::latch& done) {
    {
      std::lock_guard lock(mutex_);
      job_ = std::move(job);
      done_ = &done;
    }
    wake_.notify_one();
  }

 private:
  [[noreturn]] void loop() {
    for (;;) {
      std::function<void()> job;
      std::latch* done = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return job_ != nullptr; });
        job = std::move(job_);
        job_ = nullptr;
        done = done_;
      }
      job();
      job = nullptr;  // the job's captures go before the run is told it is over
      done->count_down();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> job_;
  std::latch* done_ = nullptr;
  std::thread thread_;
};

// Never destroyed: idle workers wait on their condition variable until the process ends,
// so exit never waits for (or races with) a thread that is still running a rank.
class Pool {
 public:
  static Pool& shared() {
    static Pool* pool = new Pool();
    return *pool;
  }

  void run(int world, const std::function<void(int)>& body) {
    std::vector<Worker*> borrowed = borrow(world - 1);
    std::latch done(static_cast<std::ptrdiff_t>(borrowed.size()));
    for (std::size_t i = 0; i < borrowed.size(); ++i) {
      borrowed[i]->start([&body, rank = static_cast<int>(i) + 1] { body(rank); }, done);
    }
    body(0);
    done.wait();
    std::lock_guard lock(mutex_);
    idle_.insert(idle_.end(), borrowed.begin(), borrowed.end());
  }

  int started() {
    std::lock_guard lock(mutex_);
    return static_cast<int>(all_.size());
  }

 private:
  // `count` workers, all of them or none: a rank must never wait for a peer that has no
  // thread to run on.
  std::vector<Worker*> borrow(int count) {
    std::lock_guard lock(mutex_);
    std::vector<Worker*> out;
    while (static_cast<int>(out.size()) < count && !idle_.empty()) {
      out.push_back(idle_.back());
      idle_.pop_back();
    }
    while (static_cast<int>(out.size()) < count) {
      try {
        all_.push_back(std::make_unique<Worker>());
      } catch (const std::system_error& error) {
        const int rank = static_cast<int>(out.size()) + 1;
        idle_.insert(idle_.end(), out.begin(), out.end());
        throw RankFailure(fmt::format(
            "could not start a thread for rank {} of {}: {} (fewer ranks, or more memory for "
            "thread stacks, may help)",
            rank, count + 1, error.what()));
      }
      out.push_back(all_.back().get());
    }
    return out;
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<Worker>> all_;
  std::vector<Worker*> idle_;
};

// Ranks now running as threads of this process, over every run in flight.
std::atomic<int> ranks_as_threads{0};

}  // namespace

void run_ranks_concurrently(int world, const std::function<void(int)>& body) {
  if (world <= 1) {
    body(0);
    return;
  }
  ranks_as_threads += world;
  struct Done {
    int world;
    ~Done() { ranks_as_threads -= world; }
  } done{world};
  Pool::shared().run(world, body);
}

int ranks_running_as_threads() { return ranks_as_threads.load(); }

int rank_threads_started() { return Pool::shared().started(); }

}  // namespace gradnorm::harness
