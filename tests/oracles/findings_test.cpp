// A documented finding holds a row only when it fails exactly the checks the finding names
// (and what follows from them): a second bug on a finding's row is unexpected. At N = 0 a
// reference is held to the contract, not only to itself.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/step.hpp"
#include "gradnorm/harness/training.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm {
namespace {

using harness::MicroBatch;
using harness::Step;
using harness::StepContext;

// The baseline's arithmetic written out: per micro-batch mean times its count (so an empty
// micro-batch's 0/0 enters the logged loss, as the recipe's running_loss does), rank
// average, then gradients scaled by `factor(W) / N`. factor W is right; W * W applies the
// world size twice.
class TokenMeanTimesCount : public Step {
 public:
  explicit TokenMeanTimesCount(bool world_twice) : world_twice_(world_twice) {}
  void train_step(StepContext& ctx) override {
    at::Tensor tokens = at::zeros({}, at::kLong);
    at::Tensor loss_sum = at::zeros({}, at::kDouble);
    for (const MicroBatch& batch : ctx.micro_batches()) {
      const at::Tensor n = harness::training::valid_token_count(batch);
      const at::Tensor sum = ctx.loss(ctx.model().logits(batch), batch.labels) * n;
      tokens += n;
      loss_sum += sum.detach().to(at::kDouble);
      harness::training::backward(ctx, sum);
    }
    harness::training::rank_average(ctx);
    std::vector<at::Tensor> totals{tokens, loss_sum};
    ctx.comm().all_reduce_sum(totals);
    const double w = ctx.world_size();
    const double n = totals[0].item<double>();
    harness::training::scale_grads(ctx, at::scalar_tensor((world_twice_ ? w * w : w) / n, at::kDouble));
    ctx.optimizer().step();
    ctx.optimizer().zero_grad();
    ctx.log_loss(totals[1].item<double>() / n);
  }

 private:
  bool world_twice_;
};

// Moves the parameters by a finite step whatever N is, and logs NaN: a reference that
// "signals" N = 0 with its logged loss while it silently updates.
class StepsOnNothing : public Step {
 public:
  void train_step(StepContext& ctx) override {
    for (const MicroBatch& batch : ctx.micro_batches()) {
      harness::training::backward(ctx, ctx.model().logits(batch).sum() * 1e-3);
    }
    ctx.optimizer().step();
    ctx.optimizer().zero_grad();
    ctx.log_loss(std::nan(""));
  }
};

void register_once() {
  static const bool done = [] {
    // Both end in "baseline": the catalogue's "*baseline" findings apply to them.
    harness::register_variant({.name = "test/written-out-baseline", .reference = "baseline",
                               .make = [] { return std::make_unique<TokenMeanTimesCount>(false); }});
    harness::register_variant({.name = "test/world-twice-baseline", .reference = "baseline",
                               .make = [] { return std::make_unique<TokenMeanTimesCount>(true); }});
    harness::register_variant({.name = "test/steps-on-nothing",
                               .role = harness::Role::reference,
                               .reference = "test/steps-on-nothing",
                               .make = [] { return std::make_unique<StepsOnNothing>(); }});
    return true;
  }();
  (void)done;
}

oracles::EvaluationRow row_of(const std::string& scenario, const std::string& variant) {
  register_once();
  harness::DeterminismGuard guard;
  const oracles::Evaluation e =
      oracles::evaluate({scenarios::find_scenario(scenario)}, {harness::find_variant(variant)});
  EXPECT_EQ(e.rows.size(), 1u);
  return e.rows.at(0);
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// dist/0-8's finding for the baseline: the empty rank's NaN reaches the logged loss, the
// gradients are right. The same arithmetic written out reproduces it exactly.
TEST(Findings, TheDocumentedFailureIsAKnownFinding) {
  for (const char* variant : {"baseline", "test/written-out-baseline"}) {
    const oracles::EvaluationRow row = row_of("dist/0-8/float32", variant);
    EXPECT_EQ(row.expectation, oracles::Expectation::finding) << variant;
    EXPECT_EQ(row.verdict.failed_checks, std::vector<std::string>{"logged-loss"}) << variant;
    EXPECT_TRUE(row.met) << variant << ": " << row.applicability;
  }
}

// The world size applied twice makes the gradients wrong too. The verdict is still "fail",
// which the finding's verdict alone would have accepted; its checks do not.
TEST(Findings, ASecondFailureOnAFindingRowIsUnexpected) {
  const oracles::EvaluationRow row = row_of("dist/0-8/float32", "test/world-twice-baseline");
  EXPECT_EQ(row.expectation, oracles::Expectation::finding);
  EXPECT_EQ(oracles::to_string(row.verdict.kind), "fail");
  EXPECT_TRUE(contains(row.verdict.failed_checks.front(), "gradients")) << row.applicability;
  EXPECT_FALSE(row.met) << "a second bug hid behind the documented NaN logged loss";
  EXPECT_TRUE(contains(row.applicability, "[the finding fails logged-loss; this row fails gradients, "))
      << row.applicability;
}

// A finding whose named check no longer fails (the bug fixed, or gone elsewhere) no longer
// holds the row either: world-size-only's gradients on dist/0-8 are right, and its finding
// names the logged loss alone.
TEST(Findings, TheRecordedReasonsMatchWhatFails) {
  const oracles::EvaluationRow wso = row_of("dist/0-8/float32", "world-size-only");
  EXPECT_EQ(wso.verdict.failed_checks, std::vector<std::string>{"logged-loss"});
  EXPECT_TRUE(wso.met) << wso.applicability;
  const oracles::EvaluationRow skip = row_of("dist/0-8/float32", "skip");
  EXPECT_EQ(skip.verdict.failed_checks, (std::vector<std::string>{"gradients", "logged-loss", "parameter-update"}));
  EXPECT_TRUE(skip.met) << skip.applicability;
}

// At N = 0 a reference matches itself whatever it does; the contract still forbids a finite
// update. Control: the baseline, which steps on NaN there, signals the expected error.
TEST(Findings, AReferenceIsHeldToTheContractAtZeroTokens) {
  const oracles::EvaluationRow silent = row_of("single/all-masked-mean_ce/float32", "test/steps-on-nothing");
  EXPECT_EQ(oracles::to_string(silent.verdict.kind), "error-mismatch");
  EXPECT_EQ(silent.verdict.failed_checks, std::vector<std::string>{"error-behaviour"});
  EXPECT_FALSE(silent.met);
  ASSERT_FALSE(silent.verdict.reasons.empty());
  EXPECT_TRUE(contains(silent.verdict.reasons.front(), "parameters moved by a finite step"));
  const oracles::EvaluationRow baseline = row_of("single/all-masked-mean_ce/float32", "baseline");
  EXPECT_EQ(oracles::to_string(baseline.verdict.kind), "expected-error");
  EXPECT_TRUE(baseline.met);
}

}  // namespace
}  // namespace gradnorm
