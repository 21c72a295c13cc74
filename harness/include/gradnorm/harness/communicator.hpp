#pragma once
// How ranks talk. A variant is written from one rank's point of view and reaches other
// ranks only through a Communicator, so the same recipe code runs on one device, on threads
// and on c10d process groups.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradnorm::harness {

// A collective could not complete: a peer failed, exited or did not arrive in time. The
// message names the rank and the cause.
class CommunicationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A rank failed outside a collective (its thread could not start): the message names it.
// Like CommunicationError, exit status 3.
class RankFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int world_size() const = 0;
  // Element-wise sum across ranks, in place; every rank receives the same values.
  virtual void all_reduce_sum(std::vector<at::Tensor>& tensors) = 0;
  virtual void barrier() = 0;
  // Every rank learns whether any rank reported `failed` (an all-reduce of a flag), so a
  // rank whose step raised does not leave its peers waiting in the next collective.
  [[nodiscard]] virtual bool any(bool failed);
  // any(false) followed, when no rank failed, by all_reduce_sum(tensors): returns whether a
  // rank failed (then nothing is summed). Transports that can carry the flag with the
  // tensors do both in one collective.
  [[nodiscard]] virtual bool any_failed_else_all_reduce_sum(std::vector<at::Tensor>& tensors);
  // What a report says about the transport: "solo", "threads", "gloo".
  [[nodiscard]] virtual std::string kind() const = 0;
  // The communicator among `ranks` (ascending world ranks, this one among them), for a
  // mesh's subgroups; every rank of the subgroup must ask for it. The whole world is this
  // communicator itself. Transports without subgroups throw CommunicationError.
  [[nodiscard]] virtual Communicator& group(const std::vector<int>& ranks);
};

// World size 1: every collective is the identity.
class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_sum(std::vector<at::Tensor>&) override {}
  void barrier() override {}
  std::string kind() const override { return "solo"; }
};

// Ranks as threads of one process. Reductions add the ranks' tensors in rank order
// (0 + 1 + ... + W-1) in their own dtype, so results are deterministic. A rank that does not
// arrive within `timeout` aborts the room; every waiting rank then throws
// CommunicationError naming the ranks that are missing.
class ThreadRoom {
 public:
  ThreadRoom(int world_size, std::chrono::milliseconds timeout, ThreadRoom* parent = nullptr);
  // The room of a subgroup, made by the first of its ranks to ask. Aborting this room aborts
  // its subrooms; a subroom that times out aborts this room.
  [[nodiscard]] std::shared_ptr<ThreadRoom> subroom(const std::vector<int>& ranks);
  void all_reduce_sum(int rank, std::vector<at::Tensor>& tensors);
  // Whether any rank passed true: the same meeting with a flag instead of tensors.
  [[nodiscard]] bool any(int rank, bool flag);
  // One meeting for both: whether any rank passed true (a failed rank passes no tensors);
  // when none did, the tensors are summed as all_reduce_sum does.
  [[nodiscard]] bool any_else_all_reduce_sum(int rank, bool flag, std::vector<at::Tensor>* tensors);
  // Wakes every waiting rank with CommunicationError(why); later collectives throw at once.
  void abort(const std::string& why);
  [[nodiscard]] std::optional<std::string> aborted() const;
  [[nodiscard]] int world_size() const { return world_size_; }

 private:
  void abort_locally(const std::string& why);
  // Why the deposited tensor lists cannot be summed (count, dtype or shape), if they cannot;
  // with the mutex held.
  [[nodiscard]] std::optional<std::string> mismatch() const;
  // Sums the deposited tensor lists into every deposit, or says why they cannot be summed;
  // with the mutex held.
  [[nodiscard]] std::optional<std::string> sum_deposits();
  // Every collective: each rank deposits (with the mutex held) and waits; the last to arrive
  // runs `complete`, which may return why the collective cannot complete (the run is then
  // aborted), and releases them all.
  void meet(int rank, const std::function<void()>& deposit,
            const std::function<std::optional<std::string>()>& complete);

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  ThreadRoom* const parent_;
  std::mutex subrooms_mutex_;
  std::map<std::vector<int>, std::shared_ptr<ThreadRoom>> subrooms_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_cv_;
  std::vector<std::vector<at::Tensor>*> deposits_;
  std::vector<bool> present_;
  std::vector<bool> flags_ = std::vector<bool>(static_cast<std::size_t>(world_size_), false);
  bool any_ = false;
  int arrived_ = 0;
  long generation_ = 0;
  std::optional<std::string> aborted_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadRoom> room, int rank) : room_(std::move(room)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return room_->world_size(); }
  void all_reduce_sum(std::vector<at::Tensor>& tensors) override { room_->all_reduce_sum(rank_, tensors); }
  bool any(bool failed) override;
  bool any_failed_else_all_reduce_sum(std::vector<at::Tensor>& tensors) override {
    return room_->any_else_all_reduce_sum(rank_, false, &tensors);
  }
  void barrier() override {
    std::vector<at::Tensor> none;
    room_->all_reduce_sum(rank_, none);
  }
  std::string kind() const override { return "threads"; }
  Communicator& group(const std::vector<int>& ranks) override;

 private:
  std::shared_ptr<ThreadRoom> room_;
  int rank_;
  std::map<std::vector<int>, std::unique_ptr<ThreadCommunicator>> groups_;
};

}  // namespace gradnorm::harness
