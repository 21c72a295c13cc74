// How ranks talk: ThreadRoom reduces in rank order, bit for bit; any() is an all-reduced
// flag; a missing rank or an abort fails every waiting rank promptly with a message naming
// the cause; SoloCommunicator is the identity.
#include "gradnorm/harness/communicator.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gradnorm/harness/determinism.hpp"

namespace gradnorm::harness {
namespace {

using namespace std::chrono_literals;

// Same dtype, same shape and the same bytes: a NaN equals itself and -0 differs from +0,
// which at::equal does not promise. Names the first differing element.
::testing::AssertionResult same_bits(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type() << ", want "
                                         << expected.scalar_type();
  }
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << ", want "
                                         << expected.sizes();
  }
  const at::Tensor a = actual.contiguous();
  const at::Tensor e = expected.contiguous();
  const auto item_size = static_cast<std::size_t>(a.element_size());
  const auto* a_bytes = static_cast<const char*>(a.data_ptr());
  const auto* e_bytes = static_cast<const char*>(e.data_ptr());
  for (long i = 0; i < a.numel(); ++i) {
    const std::size_t at_byte = static_cast<std::size_t>(i) * item_size;
    if (std::memcmp(a_bytes + at_byte, e_bytes + at_byte, item_size) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << a.reshape({-1})[i].item<double>() << ", want "
             << e.reshape({-1})[i].item<double>() << " (bits differ)";
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs `body(rank)` on `world` threads and joins them; an exception escaping a rank is
// returned as its text, so a failure reads as "rank 2: ..." rather than std::terminate.
std::vector<std::optional<std::string>> run_ranks(int world,
                                                  const std::function<void(int)>& body) {
  std::vector<std::optional<std::string>> escaped(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& error) {
        escaped[static_cast<std::size_t>(rank)] = error.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return escaped;
}

// The contribution of `rank`: small values on rank 0, then large values of alternating
// sign (+1e7, -1e7, ...) that cancel, each with its own small part, so the order of the
// float32 additions changes what the small parts leave behind; an int64 and a float64
// tensor beside them.
std::vector<at::Tensor> contribution(int rank) {
  const at::Tensor base = at::arange(1, 13, at::kDouble).reshape({3, 4});
  const double large = rank == 0 ? 0.0 : (rank % 2 == 1 ? 1e7 : -1e7);
  at::Tensor values = (base * large + base / (rank + 3)).to(at::kFloat);
  at::Tensor counts = at::arange(0, 5, at::kLong) * (rank + 1);
  at::Tensor wide = at::linspace(-1, 1, 7, at::kDouble) / (rank + 7);
  return {values, counts, wide};
}

// rank 0 + rank 1 + ... + rank W-1, added left to right in each tensor's own dtype.
std::vector<at::Tensor> sum_in_rank_order(int world) {
  std::vector<at::Tensor> sum = contribution(0);
  for (at::Tensor& t : sum) t = t.clone();
  for (int rank = 1; rank < world; ++rank) {
    const std::vector<at::Tensor> next = contribution(rank);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + next[i];
  }
  return sum;
}

// W-1 + ... + 1 + 0: the wrong order, for the control below.
std::vector<at::Tensor> sum_in_reverse_order(int world) {
  std::vector<at::Tensor> sum = contribution(world - 1);
  for (at::Tensor& t : sum) t = t.clone();
  for (int rank = world - 2; rank >= 0; --rank) {
    const std::vector<at::Tensor> next = contribution(rank);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + next[i];
  }
  return sum;
}

// The contributions are order-sensitive: with three or more ranks, adding them in reverse
// rounds differently, so the bit-for-bit check below can tell the orders apart.
TEST(ThreadRoom, NegativeControlContributionsAreOrderSensitive) {
  DeterminismGuard guard;
  for (int world : {3, 5}) {
    const std::vector<at::Tensor> forward = sum_in_rank_order(world);
    const std::vector<at::Tensor> backward = sum_in_reverse_order(world);
    EXPECT_FALSE(same_bits(backward[0], forward[0]))
        << "world " << world << ": the float32 contributions sum alike in either order";
  }
}

TEST(SameBits, NegativeControlOneUlpApartDiffers) {
  const at::Tensor one = at::ones({3}, at::kFloat);
  at::Tensor nudged = one.clone();
  nudged[1] = std::nextafter(1.0f, 2.0f);
  EXPECT_FALSE(same_bits(nudged, one));
  EXPECT_FALSE(same_bits(one.to(at::kDouble), one));
  EXPECT_TRUE(same_bits(one.clone(), one));
}

TEST(ThreadRoom, EveryRankReceivesTheSumInRankOrderBitForBit) {
  DeterminismGuard guard;
  for (int world : {2, 3, 5}) {
    auto room = std::make_shared<ThreadRoom>(world, 10s);
    std::vector<std::vector<at::Tensor>> received(static_cast<std::size_t>(world));
    const auto escaped = run_ranks(world, [&](int rank) {
      ThreadCommunicator comm(room, rank);
      std::vector<at::Tensor> tensors = contribution(rank);
      comm.all_reduce_sum(tensors);
      received[static_cast<std::size_t>(rank)] = tensors;
    });
    const std::vector<at::Tensor> expected = sum_in_rank_order(world);
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_FALSE(escaped[static_cast<std::size_t>(rank)])
          << "world " << world << " rank " << rank << ": " << *escaped[static_cast<std::size_t>(rank)];
      const auto& got = received[static_cast<std::size_t>(rank)];
      ASSERT_EQ(got.size(), expected.size());
      for (std::size_t i = 0; i < expected.size(); ++i) {
        EXPECT_TRUE(same_bits(got[i], expected[i]))
            << "world " << world << " rank " << rank << " tensor " << i;
      }
    }
    EXPECT_FALSE(room->aborted()) << *room->aborted();
  }
}

// The room is reused collective after collective; each round is its own sum.
TEST(ThreadRoom, ConsecutiveCollectivesReuseTheRoom) {
  DeterminismGuard guard;
  constexpr int kWorld = 3;
  constexpr int kRounds = 20;
  auto room = std::make_shared<ThreadRoom>(kWorld, 10s);
  std::vector<std::vector<long>> sums(kWorld);
  const auto escaped = run_ranks(kWorld, [&](int rank) {
    ThreadCommunicator comm(room, rank);
    for (int round = 0; round < kRounds; ++round) {
      std::vector<at::Tensor> value{at::full({}, (rank + 1) * 100 + round, at::kLong)};
      comm.all_reduce_sum(value);
      sums[static_cast<std::size_t>(rank)].push_back(value[0].item<long>());
      if (round % 5 == 0) comm.barrier();
    }
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_FALSE(escaped[static_cast<std::size_t>(rank)]) << *escaped[static_cast<std::size_t>(rank)];
    ASSERT_EQ(sums[static_cast<std::size_t>(rank)].size(), static_cast<std::size_t>(kRounds));
    for (int round = 0; round < kRounds; ++round) {
      EXPECT_EQ(sums[static_cast<std::size_t>(rank)][static_cast<std::size_t>(round)],
                600 + 3 * round)
          << "rank " << rank << " round " << round;
    }
  }
}

// Negative control for the order check: on float32 values where the order of the additions
// changes the rounding, the reverse-order sum differs from the room's, so a room that added
// in another order would be caught.
TEST(ThreadRoom, NegativeControlReversedOrderSumDiffers) {
  DeterminismGuard guard;
  std::array<float, 3> values{1e8f, 1.0f, -1e8f};
  std::sort(values.begin(), values.end());
  auto add_in_order = [](const std::array<float, 3>& v) {
    return (at::scalar_tensor(v[0], at::kFloat) + at::scalar_tensor(v[1], at::kFloat)) +
           at::scalar_tensor(v[2], at::kFloat);
  };
  auto add_reversed = [](const std::array<float, 3>& v) {
    return (at::scalar_tensor(v[2], at::kFloat) + at::scalar_tensor(v[1], at::kFloat)) +
           at::scalar_tensor(v[0], at::kFloat);
  };
  bool found = false;
  do {
    found = !same_bits(add_in_order(values), add_reversed(values));
  } while (!found && std::next_permutation(values.begin(), values.end()));
  ASSERT_TRUE(found) << "no order of 1e8f, 1.0f, -1e8f rounds differently: the control is void";

  auto room = std::make_shared<ThreadRoom>(3, 10s);
  std::vector<at::Tensor> received(3);
  const auto escaped = run_ranks(3, [&](int rank) {
    ThreadCommunicator comm(room, rank);
    std::vector<at::Tensor> mine{at::full({4}, values[static_cast<std::size_t>(rank)], at::kFloat)};
    comm.all_reduce_sum(mine);
    received[static_cast<std::size_t>(rank)] = mine[0];
  });
  const at::Tensor in_order = add_in_order(values).expand({4});
  const at::Tensor reversed = add_reversed(values).expand({4});
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_FALSE(escaped[static_cast<std::size_t>(rank)]) << *escaped[static_cast<std::size_t>(rank)];
    EXPECT_TRUE(same_bits(received[static_cast<std::size_t>(rank)], in_order)) << "rank " << rank;
    EXPECT_FALSE(same_bits(received[static_cast<std::size_t>(rank)], reversed))
        << "rank " << rank << ": the wrong expected sum matched";
  }
}

// any() is true on every rank exactly when some rank passed true: every pattern of flags.
TEST(Communicator, AnyIsTrueOnEveryRankIffSomeRankFailed) {
  DeterminismGuard guard;
  constexpr int kWorld = 3;
  for (int pattern = 0; pattern < (1 << kWorld); ++pattern) {
    auto room = std::make_shared<ThreadRoom>(kWorld, 10s);
    std::array<std::optional<bool>, kWorld> answers;
    const auto escaped = run_ranks(kWorld, [&](int rank) {
      ThreadCommunicator comm(room, rank);
      answers[static_cast<std::size_t>(rank)] = comm.any((pattern >> rank) & 1);
    });
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_FALSE(escaped[static_cast<std::size_t>(rank)]) << *escaped[static_cast<std::size_t>(rank)];
      ASSERT_TRUE(answers[static_cast<std::size_t>(rank)]);
      EXPECT_EQ(*answers[static_cast<std::size_t>(rank)], pattern != 0)
          << "flags " << pattern << " (bit r = rank r failed), rank " << rank;
    }
  }
}

// The agreement and the reduction in one collective: summed when no rank failed, left
// untouched on every rank when one did. Negative control: the pattern with no failure must
// sum, so a collective that never sums fails the first case.
TEST(Communicator, AnyFailedElseAllReduceSumsOnlyWhenNoRankFailed) {
  DeterminismGuard guard;
  constexpr int kWorld = 3;
  for (int pattern = 0; pattern < (1 << kWorld); ++pattern) {
    auto room = std::make_shared<ThreadRoom>(kWorld, 10s);
    std::array<std::optional<bool>, kWorld> answers;
    std::array<double, kWorld> values{};
    const auto escaped = run_ranks(kWorld, [&](int rank) {
      ThreadCommunicator comm(room, rank);
      const bool failed = (pattern >> rank) & 1;
      std::vector<at::Tensor> tensors{at::full({2}, rank + 1.0, at::kDouble)};
      const std::size_t r = static_cast<std::size_t>(rank);
      // A failed rank brings its flag alone, as announce_failure() does.
      answers[r] = failed ? room->any_else_all_reduce_sum(rank, true, nullptr)
                          : comm.any_failed_else_all_reduce_sum(tensors);
      values[r] = tensors[0][1].item<double>();
    });
    for (int rank = 0; rank < kWorld; ++rank) {
      const std::size_t r = static_cast<std::size_t>(rank);
      ASSERT_FALSE(escaped[r]) << *escaped[r];
      ASSERT_TRUE(answers[r]);
      EXPECT_EQ(*answers[r], pattern != 0) << "flags " << pattern << ", rank " << rank;
      EXPECT_EQ(values[r], pattern == 0 ? 6.0 : rank + 1.0) << "flags " << pattern << ", rank " << rank;
    }
  }
}

// Ranks that have diverged, one all-reducing and one at a flag-only agreement, are both told
// so; neither sums the other's (absent) deposit.
TEST(ThreadRoom, AnAllReduceMeetingAFlagOnlyAgreementFailsBothRanks) {
  auto room = std::make_shared<ThreadRoom>(2, 10s);
  const auto escaped = run_ranks(2, [&](int rank) {
    ThreadCommunicator comm(room, rank);
    if (rank == 0) {
      std::vector<at::Tensor> tensors{at::ones({3})};
      comm.all_reduce_sum(tensors);
    } else {
      (void)comm.any(false);
    }
  });
  for (const auto& error : escaped) {
    ASSERT_TRUE(error) << "a diverged rank returned normally";
    EXPECT_NE(error->find("ranks reduce different tensors"), std::string::npos) << *error;
  }
}

// The ranks a "did not reach" message lists as missing: "rank 1, 2 did not reach ..." gives
// {1, 2}; empty when the message has another form.
std::vector<int> missing_ranks(const std::string& message) {
  std::vector<int> out;
  const std::string prefix = "rank ";
  const auto end = message.find(" did not reach");
  if (message.rfind(prefix, 0) != 0 || end == std::string::npos) return out;
  std::string list = message.substr(prefix.size(), end - prefix.size());
  std::size_t at = 0;
  while (at < list.size()) {
    std::size_t used = 0;
    try {
      out.push_back(std::stoi(list.substr(at), &used));
    } catch (const std::logic_error&) {
      return {};
    }
    at += used;
    if (list.compare(at, 2, ", ") == 0) at += 2;
    else if (at != list.size()) return {};
  }
  return out;
}

TEST(MissingRanks, ParsesTheRoomsMessage) {
  EXPECT_EQ(missing_ranks("rank 1 did not reach collective #1 within 100 ms (hang)"),
            std::vector<int>{1});
  EXPECT_EQ(missing_ranks("rank 0, 2 did not reach collective #4 within 5 ms (hang)"),
            (std::vector<int>{0, 2}));
  EXPECT_TRUE(missing_ranks("rank 1 threw: boom").empty());
}

// One rank waits for a peer that never arrives: it throws within the room's timeout, the
// message names exactly the missing rank, and its tensor is left as it was.
TEST(ThreadRoom, MissingRankFailsTheWaiterNamingIt) {
  DeterminismGuard guard;
  auto room = std::make_shared<ThreadRoom>(2, 100ms);
  std::vector<at::Tensor> mine{at::full({2}, 3.0, at::kFloat)};
  try {
    room->all_reduce_sum(0, mine);
    ADD_FAILURE() << "rank 0 completed a collective rank 1 never joined";
  } catch (const CommunicationError& error) {
    EXPECT_EQ(missing_ranks(error.what()), std::vector<int>{1}) << error.what();
    EXPECT_NE(std::string(error.what()).find("100 ms"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(same_bits(mine[0], at::full({2}, 3.0, at::kFloat)))
      << "the tensor changed although the collective failed";
  ASSERT_TRUE(room->aborted());
  EXPECT_EQ(missing_ranks(*room->aborted()), std::vector<int>{1}) << *room->aborted();
  // The late rank does not complete a collective its peer gave up on.
  std::vector<at::Tensor> late{at::ones({2}, at::kFloat)};
  EXPECT_THROW(room->all_reduce_sum(1, late), CommunicationError);
  EXPECT_TRUE(same_bits(late[0], at::ones({2}, at::kFloat)));
}

// With several waiters, every rank that arrived throws the same CommunicationError, which
// lists rank 1 among the missing (a waiter that timed out before its peer even started
// may list that peer too, so only "rank 1 is listed" is certain).
TEST(ThreadRoom, MissingRankFailsEveryWaiter) {
  DeterminismGuard guard;
  constexpr int kWorld = 3;
  auto room = std::make_shared<ThreadRoom>(kWorld, 100ms);
  std::array<at::Tensor, kWorld> tensors;
  std::array<std::optional<std::string>, kWorld> errors;
  std::array<bool, kWorld> returned{};
  const auto escaped = run_ranks(kWorld, [&](int rank) {
    if (rank == 1) return;  // never arrives
    std::vector<at::Tensor> mine{at::full({2}, rank + 1.0, at::kFloat)};
    try {
      room->all_reduce_sum(rank, mine);
      returned[static_cast<std::size_t>(rank)] = true;
    } catch (const CommunicationError& error) {
      errors[static_cast<std::size_t>(rank)] = error.what();
    }
    tensors[static_cast<std::size_t>(rank)] = mine[0];
  });
  ASSERT_TRUE(room->aborted()) << "nobody noticed rank 1 was missing";
  for (int rank : {0, 2}) {
    const auto r = static_cast<std::size_t>(rank);
    ASSERT_FALSE(escaped[r]) << *escaped[r];
    EXPECT_FALSE(returned[r]) << "rank " << rank << " completed a collective rank 1 never joined";
    ASSERT_TRUE(errors[r]) << "rank " << rank << " did not throw CommunicationError";
    const std::vector<int> missing = missing_ranks(*errors[r]);
    EXPECT_NE(std::find(missing.begin(), missing.end(), 1), missing.end()) << *errors[r];
    EXPECT_EQ(*errors[r], *room->aborted()) << "every waiter reports the room's one cause";
    EXPECT_TRUE(same_bits(tensors[r], at::full({2}, rank + 1.0, at::kFloat)))
        << "rank " << rank << "'s tensor changed although the collective failed";
  }
}

// abort() wakes a rank waiting in a collective with the abort's message (the room's own
// timeout is far away), and every later collective throws it at once.
TEST(ThreadRoom, AbortWakesWaitingRanksAndLaterCollectivesThrow) {
  DeterminismGuard guard;
  auto room = std::make_shared<ThreadRoom>(2, std::chrono::minutes(10));
  auto waiting = std::async(std::launch::async, [room]() -> std::string {
    std::vector<at::Tensor> mine{at::ones({3}, at::kDouble)};
    try {
      room->all_reduce_sum(0, mine);
    } catch (const CommunicationError& error) {
      if (!same_bits(mine[0], at::ones({3}, at::kDouble))) return "tensor changed";
      return error.what();
    }
    return "returned without rank 1";
  });
  // Let rank 0 enter the room (if it has not yet, it throws on entry: the same message).
  std::this_thread::sleep_for(20ms);
  room->abort("operator pulled the plug");
  // A liveness guard, not a timing claim: without the wake-up rank 0 waits ten minutes.
  ASSERT_EQ(waiting.wait_for(std::chrono::minutes(2)), std::future_status::ready)
      << "abort() did not wake the waiting rank";
  EXPECT_EQ(waiting.get(), "operator pulled the plug");

  ASSERT_TRUE(room->aborted());
  EXPECT_EQ(*room->aborted(), "operator pulled the plug");
  room->abort("a second reason");
  EXPECT_EQ(*room->aborted(), "operator pulled the plug") << "the first cause must be kept";

  for (int rank : {0, 1}) {
    ThreadCommunicator comm(room, rank);
    std::vector<at::Tensor> later{at::zeros({2}, at::kFloat)};
    try {
      comm.all_reduce_sum(later);
      ADD_FAILURE() << "rank " << rank << ": a collective after abort() returned";
    } catch (const CommunicationError& error) {
      EXPECT_STREQ(error.what(), "operator pulled the plug");
    }
    EXPECT_THROW(comm.barrier(), CommunicationError);
    EXPECT_THROW((void)comm.any(false), CommunicationError);
  }
}

TEST(ThreadCommunicator, ReportsItsRankWorldAndKind) {
  auto room = std::make_shared<ThreadRoom>(4, 1s);
  ThreadCommunicator comm(room, 2);
  EXPECT_EQ(comm.rank(), 2);
  EXPECT_EQ(comm.world_size(), 4);
  EXPECT_EQ(comm.kind(), "threads");
  EXPECT_FALSE(room->aborted());
}

TEST(SoloCommunicator, EveryCollectiveIsTheIdentity) {
  DeterminismGuard guard;
  SoloCommunicator solo;
  EXPECT_EQ(solo.rank(), 0);
  EXPECT_EQ(solo.world_size(), 1);
  EXPECT_EQ(solo.kind(), "solo");

  const std::vector<at::Tensor> original = contribution(3);
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& t : original) tensors.push_back(t.clone());
  const void* storage = tensors[0].data_ptr();
  solo.all_reduce_sum(tensors);
  ASSERT_EQ(tensors.size(), original.size());
  EXPECT_EQ(tensors[0].data_ptr(), storage) << "the identity must work in place";
  for (std::size_t i = 0; i < original.size(); ++i) {
    EXPECT_TRUE(same_bits(tensors[i], original[i])) << "tensor " << i;
  }
  std::vector<at::Tensor> none;
  solo.all_reduce_sum(none);
  EXPECT_TRUE(none.empty());
  EXPECT_NO_THROW(solo.barrier());
  EXPECT_TRUE(solo.any(true));
  EXPECT_FALSE(solo.any(false));
}

}  // namespace
}  // namespace gradnorm::harness
