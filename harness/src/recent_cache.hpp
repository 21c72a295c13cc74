#pragma once
// A small, thread-safe cache of the most recent entries by key: the inputs every rank,
// variant and the oracle of one scenario share (model draws, micro-batches) are made once.
// Linear lookup over a handful of entries; the oldest is dropped first.

#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace gradnorm::harness {

template <typename Value, std::size_t Capacity>
class RecentCache {
 public:
  [[nodiscard]] std::optional<Value> find(const std::string& key) {
    std::lock_guard lock(mutex_);
    for (const auto& [k, value] : entries_) {
      if (k == key) return value;
    }
    return std::nullopt;
  }
  void store(const std::string& key, Value value) {
    std::lock_guard lock(mutex_);
    entries_.emplace_back(key, std::move(value));
    if (entries_.size() > Capacity) entries_.pop_front();
  }

 private:
  std::mutex mutex_;
  std::deque<std::pair<std::string, Value>> entries_;
};

}  // namespace gradnorm::harness
