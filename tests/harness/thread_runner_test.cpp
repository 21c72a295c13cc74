// Ranks as threads: one Observation per rank, replicas bit-identical after the reduction;
// injected faults (throw, exit, hang) end the run promptly with a fault naming the rank; a
// recipe error on one rank stops its peers cleanly; bad input is InvalidInput.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/output_capture.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/transport.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm::harness {
namespace {

using namespace std::chrono_literals;
using scenarios::InvalidInput;
using scenarios::Scenario;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Same dtype, shape and bytes (at::equal compares values, and NaN != NaN there).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(),
                     static_cast<std::size_t>(x.numel() * x.element_size())) == 0;
}

bool same_bits(const std::optional<double>& a, const std::optional<double>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || std::memcmp(&*a, &*b, sizeof(double)) == 0;
}

::testing::AssertionResult same_named(const std::vector<NamedTensor>& a,
                                      const std::vector<NamedTensor>& b, const std::string& what) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << what << ": " << a.size() << " tensors vs " << b.size();
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name) {
      return ::testing::AssertionFailure() << what << " " << i << ": '" << a[i].name << "' vs '"
                                           << b[i].name << "'";
    }
    if (!same_bits(a[i].value, b[i].value)) {
      return ::testing::AssertionFailure() << what << " " << a[i].name << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

// Every rank holds the same replica: gradients, norm, logged loss and parameters of every
// step, bit for bit, against rank 0.
::testing::AssertionResult ranks_bit_identical(const RankedRun& run) {
  if (run.ranks.empty()) return ::testing::AssertionFailure() << "no rank";
  const Observation& first = run.ranks.front();
  for (std::size_t r = 1; r < run.ranks.size(); ++r) {
    const Observation& other = run.ranks[r];
    auto fail = [&](const std::string& what) {
      return ::testing::AssertionFailure() << "rank " << r << " differs from rank 0: " << what;
    };
    if (auto same = same_named(other.initial_parameters, first.initial_parameters,
                               "initial parameter");
        !same) {
      return fail(same.message());
    }
    if (other.steps.size() != first.steps.size()) return fail("step count");
    for (std::size_t s = 0; s < first.steps.size(); ++s) {
      const StepRecord& a = other.steps[s];
      const StepRecord& b = first.steps[s];
      const std::string step = "step " + std::to_string(s) + " ";
      if (auto same = same_named(a.gradients, b.gradients, step + "gradient"); !same) {
        return fail(same.message());
      }
      if (auto same = same_named(a.parameters_after, b.parameters_after, step + "parameter");
          !same) {
        return fail(same.message());
      }
      if (!same_bits(a.grad_norm, b.grad_norm)) return fail(step + "grad norm");
      if (!same_bits(a.logged_loss, b.logged_loss)) return fail(step + "logged loss");
    }
    if (!(other.counters == first.counters)) return fail("counters");
  }
  return ::testing::AssertionSuccess();
}

// A thrown or exiting rank aborts the room at once, so those runs get a timeout far beyond
// any step: the abort, not the timeout, must end them (a timeout would name a "hang" and
// fail the check), and a busy machine cannot turn a slow step into a spurious fault. A
// hanging rank is only ended by the timeout, so it gets a short one.
constexpr std::chrono::milliseconds kPatient = 10s;
constexpr std::chrono::milliseconds kShort = 200ms;

RunOptions with_fault(const std::string& fault, std::chrono::milliseconds timeout = kPatient) {
  RunOptions options;
  options.timeout = timeout;
  options.fault = parse_fault(fault);
  return options;
}

// No fault, and a timeout far beyond any step: a hang would show as a fault, not a pass.
RunOptions patient() {
  RunOptions options;
  options.timeout = kPatient;
  return options;
}

// dist/5-3/float32 over `steps` optimizer steps.
Scenario ragged_two_ranks(int steps = 1) {
  Scenario s = scenarios::find_scenario("dist/5-3/float32");
  s.steps = steps;
  if (steps > 1) s.name += "-steps" + std::to_string(steps);
  return s;
}

TEST(RunInThreads, OneObservationPerRankAllBitIdentical) {
  DeterminismGuard guard;
  for (const char* name : {"dist/5-3/float32", "dist/5-3/float64", "dist/8-ranks-ragged/float32",
                           "dist/accum2-ragged/bfloat16"}) {
    const Scenario& s = scenarios::find_scenario(name);
    for (const char* variant : {"baseline", "skip"}) {
      const RankedRun run = run_in_threads(find_variant(variant), s);
      EXPECT_FALSE(run.fault) << name << " x " << variant << ": " << *run.fault;
      ASSERT_EQ(run.ranks.size(), static_cast<std::size_t>(s.world_size)) << name;
      for (int rank = 0; rank < s.world_size; ++rank) {
        const Observation& o = run.ranks[static_cast<std::size_t>(rank)];
        EXPECT_EQ(o.rank, rank) << name;
        EXPECT_EQ(o.scenario, s.name);
        EXPECT_EQ(o.variant, variant);
        EXPECT_FALSE(o.error) << name << " rank " << rank << ": " << o.error->type << ": "
                              << o.error->message;
        ASSERT_EQ(o.steps.size(), 1u) << name << " rank " << rank;
        EXPECT_FALSE(o.steps[0].gradients.empty());
        for (const NamedTensor& g : o.steps[0].gradients) {
          EXPECT_TRUE(g.value.defined()) << name << " rank " << rank << " " << g.name;
        }
        EXPECT_TRUE(o.steps[0].logged_loss);
        EXPECT_EQ(o.counters.reduce_passes, 1) << name << " rank " << rank;
        EXPECT_EQ(o.counters.optimizer_steps, 1) << name << " rank " << rank;
      }
      EXPECT_TRUE(ranks_bit_identical(run)) << name << " x " << variant;
    }
  }
}

// The replica check can fail: one ULP on one parameter of rank 1 is caught.
TEST(RunInThreads, NegativeControlPerturbedRankIsNotIdentical) {
  DeterminismGuard guard;
  const RankedRun run = run_in_threads(find_variant("baseline"), ragged_two_ranks());
  ASSERT_TRUE(ranks_bit_identical(run));
  RankedRun tampered = run;
  at::Tensor& value = tampered.ranks[1].steps[0].parameters_after[0].value;
  value = value.clone();  // the copy shares storage with `run` until here
  const float first = value.reshape({-1})[0].item<float>();
  value.reshape({-1})[0] = std::nextafter(first, 2 * first + 1);
  EXPECT_FALSE(ranks_bit_identical(tampered));
  EXPECT_TRUE(ranks_bit_identical(run)) << "tampering the copy changed the original";
}

// Thread runs are deterministic: the same scenario twice gives the same bits.
TEST(RunInThreads, RepeatedRunsAreBitIdentical) {
  DeterminismGuard guard;
  const Scenario s = ragged_two_ranks();
  const RankedRun first = run_in_threads(find_variant("baseline"), s);
  const RankedRun second = run_in_threads(find_variant("baseline"), s, scenario_batches(s),
                                          RunOptions{});
  RankedRun mixed;
  mixed.ranks = {first.ranks[0], second.ranks[0], first.ranks[1], second.ranks[1]};
  EXPECT_TRUE(ranks_bit_identical(mixed));
}

TEST(RunInThreads, ThrowingRankIsAFaultNamingIt) {
  DeterminismGuard guard;
  const RankedRun run = run_in_threads(find_variant("baseline"), ragged_two_ranks(),
                                       with_fault("1:throw"));
  ASSERT_TRUE(run.fault) << "a rank threw but the run reports no fault";
  EXPECT_TRUE(contains(*run.fault, "rank 1")) << *run.fault;
  EXPECT_TRUE(contains(*run.fault, "threw")) << *run.fault;
  EXPECT_EQ(run.ranks.size(), 2u);
}

TEST(RunInThreads, ExitingRankIsAFaultNamingIt) {
  DeterminismGuard guard;
  const RankedRun run = run_in_threads(find_variant("baseline"), ragged_two_ranks(),
                                       with_fault("1:exit"));
  ASSERT_TRUE(run.fault) << "a rank exited but the run reports no fault";
  EXPECT_TRUE(contains(*run.fault, "rank 1")) << *run.fault;
  EXPECT_TRUE(contains(*run.fault, "exited")) << *run.fault;
}

TEST(RunInThreads, HangingRankIsAFaultNamingIt) {
  DeterminismGuard guard;
  const RankedRun run = run_in_threads(find_variant("baseline"), ragged_two_ranks(),
                                       with_fault("1:hang", kShort));
  ASSERT_TRUE(run.fault) << "a rank hung but the run reports no fault";
  EXPECT_TRUE(contains(*run.fault, "rank 1")) << *run.fault;
  EXPECT_TRUE(contains(*run.fault, "hang") || contains(*run.fault, "hung")) << *run.fault;
  EXPECT_FALSE(contains(*run.fault, "rank 0")) << *run.fault;
}

// A fault in a later step fails the run too; one scheduled past the last step never fires.
TEST(RunInThreads, FaultInALaterStepFailsTheRun) {
  DeterminismGuard guard;
  const Scenario s = ragged_two_ranks(3);
  const RankedRun run = run_in_threads(find_variant("baseline"), s, with_fault("0:throw@1"));
  ASSERT_TRUE(run.fault);
  EXPECT_TRUE(contains(*run.fault, "rank 0")) << *run.fault;
  EXPECT_TRUE(contains(*run.fault, "threw")) << *run.fault;

  const RankedRun clean = run_in_threads(find_variant("baseline"), s, with_fault("0:throw@3"));
  EXPECT_FALSE(clean.fault) << *clean.fault;
  ASSERT_EQ(clean.ranks.size(), 2u);
  EXPECT_EQ(clean.ranks[0].steps.size(), 3u);
  EXPECT_TRUE(ranks_bit_identical(clean));
}

TEST(ParseFault, AcceptsRankKindAndStep) {
  const FaultInjection hang = parse_fault("1:hang");
  EXPECT_EQ(hang.rank, 1);
  EXPECT_EQ(hang.kind, FaultKind::hang);
  EXPECT_EQ(hang.step, 0);
  const FaultInjection late = parse_fault("0:throw@2");
  EXPECT_EQ(late.rank, 0);
  EXPECT_EQ(late.kind, FaultKind::throw_error);
  EXPECT_EQ(late.step, 2);
  const FaultInjection leave = parse_fault("12:exit");
  EXPECT_EQ(leave.rank, 12);
  EXPECT_EQ(leave.kind, FaultKind::exit_early);
  EXPECT_EQ(RunOptions{}.fault.kind, FaultKind::none);
  EXPECT_EQ(RunOptions{}.fault.rank, -1);
}

TEST(ParseFault, RejectsMalformedTextNamingTheFormat) {
  for (const char* text : {"x", "1:boom", "-1:hang", "1:hang@x", "", "1:", ":hang", "1x:hang",
                           "1:hang@", "1:hang@-1", "1:hang@2x", "1;hang"}) {
    try {
      (void)parse_fault(text);
      ADD_FAILURE() << "'" << text << "' was accepted";
    } catch (const InvalidInput& error) {
      EXPECT_TRUE(contains(error.what(), "RANK:KIND")) << error.what();
      EXPECT_TRUE(contains(error.what(), std::string("'") + text + "'")) << error.what();
    }
  }
}

TEST(RunInThreads, FaultOnARankOutsideTheWorldIsInvalidInput) {
  DeterminismGuard guard;
  for (const char* fault : {"2:throw", "5:hang"}) {
    try {
      (void)run_in_threads(find_variant("baseline"), ragged_two_ranks(), with_fault(fault));
      ADD_FAILURE() << fault << " accepted on a 2-rank scenario";
    } catch (const InvalidInput& error) {
      EXPECT_TRUE(contains(error.what(), std::string("rank ") + fault[0])) << error.what();
      EXPECT_TRUE(contains(error.what(), "2 ranks")) << error.what();
    }
  }
}

// A recipe error on one rank (backward on linear_ce's graph-less zero) is recorded there;
// its peer stops with "peer-failure" instead of waiting; the run itself did not fault.
TEST(RunInThreads, RecipeErrorOnOneRankDoesNotHangTheOthers) {
  DeterminismGuard guard;
  Scenario s;
  s.name = "test/linear-ce-empty-rank-0";
  s.world_size = 2;
  s.valid_tokens = {{0}, {8}};
  s.loss = scenarios::LossKind::linear_ce;
  s.seed = 7;
  ASSERT_LE(8, s.micro_batch_capacity());
  const RankedRun run = run_in_threads(find_variant("baseline"), s, patient());
  EXPECT_FALSE(run.fault) << *run.fault;
  ASSERT_EQ(run.ranks.size(), 2u);
  ASSERT_TRUE(run.ranks[0].error) << "backward on a graph-less zero did not raise";
  EXPECT_EQ(run.ranks[0].error->type, "c10::Error") << run.ranks[0].error->message;
  EXPECT_FALSE(run.ranks[0].error->message.empty());
  EXPECT_FALSE(contains(run.ranks[0].error->message, "Exception raised from"))
      << run.ranks[0].error->message;
  ASSERT_TRUE(run.ranks[1].error) << "rank 1 finished a step rank 0 never completed";
  EXPECT_EQ(run.ranks[1].error->type, "peer-failure") << run.ranks[1].error->message;
  for (const Observation& o : run.ranks) EXPECT_TRUE(o.steps.empty()) << "rank " << o.rank;

  // Control: the same counts under mean_ce give NaN, not an exception, and no error.
  s.loss = scenarios::LossKind::mean_ce;
  const RankedRun mean = run_in_threads(find_variant("baseline"), s, patient());
  EXPECT_FALSE(mean.fault);
  for (const Observation& o : mean.ranks) EXPECT_FALSE(o.error) << "rank " << o.rank;
}

// A batch source that breaks the scenario's counts is bad input, reported as such even
// though it surfaces inside one rank's thread.
TEST(RunInThreads, BatchesWithWrongCountsAreInvalidInput) {
  DeterminismGuard guard;
  const Scenario s = ragged_two_ranks();
  const BatchSource swapped = [&s](int rank, int step, int micro) {
    return make_micro_batch(s, 1 - rank, step, micro);
  };
  try {
    (void)run_in_threads(find_variant("baseline"), s, swapped, patient());
    ADD_FAILURE() << "batches with the other rank's counts were accepted";
  } catch (const InvalidInput& error) {
    EXPECT_TRUE(contains(error.what(), "valid labels")) << error.what();
  }
}

TEST(RunSingleDevice, RejectsAMultiRankScenario) {
  DeterminismGuard guard;
  try {
    (void)run_single_device(find_variant("baseline"), ragged_two_ranks());
    ADD_FAILURE() << "a world_size 2 scenario ran on one device";
  } catch (const InvalidInput& error) {
    EXPECT_TRUE(contains(error.what(), "world_size is 2")) << error.what();
  }
}

// A pair the harness cannot run is an input error naming the variant and the reason.
TEST(RunInThreads, APairThatCannotRunIsInvalidInput) {
  try {
    (void)run_in_threads(find_variant("kd-single-device"), ragged_two_ranks());
    ADD_FAILURE() << "the single-device distillation recipe ran on 2 ranks";
  } catch (const InvalidInput& error) {
    EXPECT_TRUE(contains(error.what(), "'kd-single-device'")) << error.what();
    EXPECT_TRUE(contains(error.what(), "a single-device recipe")) << error.what();
  }
}

// full_finetune_distributed with optimizer_in_bwd: each parameter steps in its hook on the
// gradient averaged over ranks, so every rank holds the same replica, and the consumed
// gradients are the token-sum path's up to rounding.
TEST(RunInThreads, OptimizerInBackwardOnTwoRanksStepsOnAveragedGradients) {
  DeterminismGuard guard;
  Scenario s = ragged_two_ranks();
  s.dtype = scenarios::DType::float64;
  const RankedRun plain = run_in_threads(find_variant("baseline"), s);
  s.optimizer_in_backward = true;
  const RankedRun in_backward = run_in_threads(find_variant("baseline"), s);
  ASSERT_FALSE(in_backward.fault) << *in_backward.fault;
  ASSERT_EQ(in_backward.ranks.size(), 2u);
  for (const Observation& o : in_backward.ranks) {
    ASSERT_FALSE(o.error) << o.error->message;
    ASSERT_EQ(o.steps.size(), 1u);
  }
  EXPECT_TRUE(same_named(in_backward.ranks[0].steps[0].gradients,
                         in_backward.ranks[1].steps[0].gradients, "rank replicas"));
  const auto& got = in_backward.ranks[0].steps[0].gradients;
  const auto& want = plain.ranks[0].steps[0].gradients;
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    // float64 gradients; the two paths apply the float32 scale W/N at different points.
    EXPECT_TRUE(at::allclose(got[i].value, want[i].value, 1e-7, 1e-12)) << got[i].name;
  }
  // Negative control: a rank's own, unaveraged gradient is not what either path consumed.
  s.optimizer_in_backward = false;
  s.world_size = 1;
  s.valid_tokens = {s.valid_tokens.front()};
  const Observation local = run_single_device(find_variant("baseline"), s);
  EXPECT_FALSE(at::allclose(local.steps[0].gradients.front().value, got.front().value, 1e-3, 0));
}

TEST(FirstLine, DropsLibTorchsTrailer) {
  EXPECT_EQ(first_line("boom\nmore"), "boom");
  EXPECT_EQ(first_line("element 0 does not require grad Exception raised from foo"),
            "element 0 does not require grad");
  EXPECT_EQ(first_line("plain"), "plain");
}

// What code under test prints while a rank runs (harness/output_capture.hpp): held for the rank
// in `gradnorm run`'s capture mode, untouched everywhere else.
class HeldOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    set_output_mode(OutputMode::capture);
    (void)take_run_output();
  }
  void TearDown() override {
    (void)take_run_output();
    set_output_mode(OutputMode::pass_through);
  }
};

TEST_F(HeldOutput, ARanksPrintsAndLibTorchWarningsAreItsOwn) {
  c10::WarningHandler* before = c10::WarningUtils::get_warning_handler();
  std::string held;
  {
    RankOutput rank("s x v", 0);
    EXPECT_TRUE(hold_output("from Python\n"));
    TORCH_WARN("a LibTorch warning on the rank's thread");
    EXPECT_TRUE(hold_output("progress 10%\rprogress 100%\r\n"));  // a bar redrawn in place
    EXPECT_TRUE(hold_output("no newline"));
    held = rank.take();
  }
  EXPECT_TRUE(contains(held, "\nprogress 100%\n")) << held;
  EXPECT_FALSE(contains(held, "10%")) << held;
  EXPECT_TRUE(contains(held, "from Python\n")) << held;
  EXPECT_TRUE(contains(held, "Warning: a LibTorch warning on the rank's thread (")) << held;
  EXPECT_TRUE(contains(held, "no newline\n")) << held;  // whole lines
  EXPECT_EQ(take_run_output(), "");
  // The thread's handler is the one it had before the rank.
  EXPECT_EQ(c10::WarningUtils::get_warning_handler(), before);
}

TEST_F(HeldOutput, NegativeControlOutsideARunNothingIsHeld) {
  set_output_mode(OutputMode::pass_through);
  RankOutput rank("s x v", 0);
  EXPECT_FALSE(hold_output("printed by its caller\n"));
  EXPECT_EQ(rank.take(), "");
  set_output_mode(OutputMode::live);
  EXPECT_FALSE(hold_output("printed as it comes\n"));
  EXPECT_EQ(take_run_output(), "");
}

TEST_F(HeldOutput, AThreadOfNoRankGoesToTheOneRunOrToTheRunsLog) {
  auto from_another_thread = [](const char* text) { std::thread([text] { hold_output(text); }).join(); };
  std::string lowest;
  {
    RankOutput rank1("s x v", 1);
    std::optional<std::string> rank0_held;
    std::thread([&] {
      RankOutput rank0("s x v", 0);
      from_another_thread("a thread the step started\n");  // one run: its lowest rank
      {
        RankOutput other("t x v", 0);  // a second run at once: nobody's in particular
        from_another_thread("whose?\n");
      }
      rank0_held = rank0.take();
    }).join();
    lowest = rank0_held.value_or("");
    EXPECT_EQ(rank1.take(), "");
  }
  EXPECT_EQ(lowest, "a thread the step started\n");
  EXPECT_EQ(take_run_output(), "whose?\n");
  from_another_thread("no rank at all\n");
  EXPECT_EQ(take_run_output(), "no rank at all\n");
}

TEST(ObservationCodec, OutputTravelsToRankZeroAndStaysOutOfTheDigest) {
  Observation o;
  o.scenario = "s";
  o.variant = "v";
  o.output = "Warning: at 12:54:16.891\n\xff not UTF-8\n";
  const Observation back = deserialize(serialize(o));
  EXPECT_TRUE(contains(back.output, "Warning: at 12:54:16.891\n")) << back.output;
  EXPECT_TRUE(contains(back.output, " not UTF-8\n")) << back.output;
  Observation quiet = o;
  quiet.output.clear();
  EXPECT_EQ(digest(quiet), digest(o));
  // Negative control: the digest does see what a user sees.
  quiet.error = ErrorRecord{"ValueError", "boom"};
  EXPECT_NE(digest(quiet), digest(o));
}

}  // namespace
}  // namespace gradnorm::harness
