#include "gradnorm/harness/communicator.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace gradnorm::harness {

bool ThreadCommunicator::any(bool failed) { return room_->any(rank_, failed); }

bool Communicator::any(bool failed) {
  std::vector<at::Tensor> flag{at::full({}, failed ? 1 : 0, at::kLong)};
  all_reduce_sum(flag);
  return flag[0].item<long>() > 0;
}

bool Communicator::any_failed_else_all_reduce_sum(std::vector<at::Tensor>& tensors) {
  if (any(false)) return true;
  all_reduce_sum(tensors);
  return false;
}

Communicator& Communicator::group(const std::vector<int>& ranks) {
  if (static_cast<int>(ranks.size()) == world_size()) return *this;
  throw CommunicationError(fmt::format("the {} transport has no subgroups (asked for ranks {})",
                                       kind(), fmt::join(ranks, ", ")));
}

Communicator& ThreadCommunicator::group(const std::vector<int>& ranks) {
  if (static_cast<int>(ranks.size()) == world_size()) return *this;
  auto found = groups_.find(ranks);
  if (found == groups_.end()) {
    const auto me = std::find(ranks.begin(), ranks.end(), rank_);
    TORCH_INTERNAL_ASSERT(me != ranks.end(), "harness bug: rank ", rank_, " asked for a group without it");
    found = groups_.emplace(ranks, std::make_unique<ThreadCommunicator>(
                                       room_->subroom(ranks), static_cast<int>(me - ranks.begin())))
                .first;
  }
  return *found->second;
}

std::shared_ptr<ThreadRoom> ThreadRoom::subroom(const std::vector<int>& ranks) {
  std::lock_guard lock(subrooms_mutex_);
  auto found = subrooms_.find(ranks);
  if (found == subrooms_.end()) {
    found = subrooms_.emplace(ranks, std::make_shared<ThreadRoom>(static_cast<int>(ranks.size()),
                                                                 timeout_, this))
                .first;
    if (auto why = aborted()) found->second->abort_locally(*why);
  }
  return found->second;
}

ThreadRoom::ThreadRoom(int world_size, std::chrono::milliseconds timeout, ThreadRoom* parent)
    : world_size_(world_size),
      timeout_(timeout),
      parent_(parent),
      deposits_(static_cast<std::size_t>(world_size), nullptr),
      present_(static_cast<std::size_t>(world_size), false) {}

void ThreadRoom::abort(const std::string& why) {
  if (parent_) return parent_->abort(why);  // the root aborts the whole tree
  abort_locally(why);
}

void ThreadRoom::abort_locally(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    if (!aborted_) aborted_ = why;
  }
  arrived_cv_.notify_all();
  std::lock_guard lock(subrooms_mutex_);
  for (auto& [ranks, room] : subrooms_) room->abort_locally(why);
}

std::optional<std::string> ThreadRoom::aborted() const {
  std::lock_guard lock(mutex_);
  return aborted_;
}

std::optional<std::string> ThreadRoom::mismatch() const {
  auto describe = [](const std::vector<at::Tensor>& list) {
    std::vector<std::string> parts;
    for (const at::Tensor& t : list) {
      parts.push_back(fmt::format("{}{}", c10::toString(t.scalar_type()), t.sizes()));
    }
    return fmt::format("[{}]", fmt::join(parts, ", "));
  };
  const std::vector<at::Tensor>& first = *deposits_[0];
  for (std::size_t r = 1; r < deposits_.size(); ++r) {
    const std::vector<at::Tensor>& other = *deposits_[r];
    bool same = other.size() == first.size();
    for (std::size_t i = 0; same && i < first.size(); ++i) {
      same = other[i].scalar_type() == first[i].scalar_type() && other[i].sizes() == first[i].sizes();
    }
    if (!same) {
      return fmt::format("{}ranks reduce different tensors at collective #{}: rank 0 {}, rank {} {}",
                         parent_ ? "in a subgroup, " : "", generation_ + 1, describe(first), r,
                         describe(*deposits_[r]));
    }
  }
  return std::nullopt;
}

// Every meeting deposits a flag and a tensor list, so ranks that have diverged (one at an
// all-reduce, another at a flag-only agreement) are told apart by mismatch(), never summed
// from a stale deposit.
void ThreadRoom::all_reduce_sum(int rank, std::vector<at::Tensor>& tensors) {
  if (any_else_all_reduce_sum(rank, false, &tensors)) {
    const std::string why = fmt::format(
        "{}rank {} all-reduced while a peer reported a failure: the ranks are at different "
        "collectives",
        parent_ ? "in a subgroup, " : "", rank);
    abort(why);
    throw CommunicationError(why);
  }
}

bool ThreadRoom::any(int rank, bool flag) { return any_else_all_reduce_sum(rank, flag, nullptr); }

bool ThreadRoom::any_else_all_reduce_sum(int rank, bool flag, std::vector<at::Tensor>* tensors) {
  static std::vector<at::Tensor> none;  // a flag-only deposit: nothing to sum
  meet(rank, [&] {
    flags_[static_cast<std::size_t>(rank)] = flag;
    deposits_[static_cast<std::size_t>(rank)] = tensors ? tensors : &none;
  }, [&] {
    any_ = std::find(flags_.begin(), flags_.end(), true) != flags_.end();
    return any_ ? std::nullopt : sum_deposits();
  });
  // Read before this rank can arrive at the next collective, the only one that rewrites it.
  std::lock_guard lock(mutex_);
  return any_;
}

std::optional<std::string> ThreadRoom::sum_deposits() {
  // Ranks that reduce different tensors (a count, a shape, a dtype) have diverged: the
  // run is aborted naming them, and the room is never left half-reduced.
  if (std::optional<std::string> why = mismatch()) return why;
  at::NoGradGuard no_grad;
  const std::size_t count = deposits_[0]->size();
  for (std::size_t i = 0; i < count; ++i) {
    at::Tensor sum = (*deposits_[0])[i].detach().clone();
    for (std::size_t r = 1; r < deposits_.size(); ++r) sum.add_((*deposits_[r])[i]);
    for (std::size_t r = 0; r < deposits_.size(); ++r) (*deposits_[r])[i].copy_(sum);
  }
  return std::nullopt;
}

void ThreadRoom::meet(int rank, const std::function<void()>& deposit,
                      const std::function<std::optional<std::string>()>& complete) {
  std::unique_lock lock(mutex_);
  if (aborted_) throw CommunicationError(*aborted_);
  const long generation = generation_;
  deposit();
  present_[static_cast<std::size_t>(rank)] = true;
  if (++arrived_ == world_size_) {
    if (const std::optional<std::string> why = complete()) {
      lock.unlock();
      abort(*why);
      throw CommunicationError(*why);
    }
    arrived_ = 0;
    std::fill(present_.begin(), present_.end(), false);
    ++generation_;
    lock.unlock();
    arrived_cv_.notify_all();
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  const bool done = arrived_cv_.wait_until(lock, deadline, [&] {
    return generation_ != generation || aborted_.has_value();
  });
  if (generation_ != generation) return;  // completed, even if an abort came after
  if (!done && !aborted_) {
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (!present_[static_cast<std::size_t>(r)]) missing.push_back(r);
    }
    const std::string why =
        fmt::format("{}rank {} did not reach collective #{} within {} ms (hang)",
                    parent_ ? "in a subgroup, " : "", fmt::join(missing, ", "), generation + 1,
                    timeout_.count());
    lock.unlock();
    abort(why);
    lock.lock();
  }
  throw CommunicationError(*aborted_);
}

}  // namespace gradnorm::harness
