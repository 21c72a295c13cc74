// Every oracle check has a negative control: a variant (or a tampered observation) where
// the check must fail, and a test proving it does.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/tolerance.hpp"
#include "test_support.hpp"

namespace gradnorm {
namespace {

using oracles::VerdictKind;
using testing_support::any_reason_contains;
using testing_support::explain;
using testing_support::has_verdict;
using testing_support::judge_named;

// The pull request's first regression: optimizer.step() inside the skip gate. Caught by the
// gradient check (nothing consumed) and the update check (the model did not move).
TEST(NegativeControl, StepInsideSkipGateIsFlagged) {
  harness::DeterminismGuard guard;
  const auto j = judge_named("single/n5/float32", "broken/step-inside-skip-gate");
  EXPECT_TRUE(has_verdict(j, VerdictKind::fail));
  EXPECT_TRUE(any_reason_contains(j.verdict, "consumed no gradient")) << explain(j.verdict);
  EXPECT_TRUE(any_reason_contains(j.verdict, "parameter update")) << explain(j.verdict);
}

// The second: clip_grad_norm_ inside the skip gate; clipping silently off.
TEST(NegativeControl, ClipInsideSkipGateIsFlagged) {
  harness::DeterminismGuard guard;
  const auto j = judge_named("single/clip-active/float32", "broken/clip-inside-skip-gate");
  EXPECT_TRUE(has_verdict(j, VerdictKind::fail));
  EXPECT_TRUE(any_reason_contains(j.verdict, "clip_grad_norm_ never ran")) << explain(j.verdict);
  EXPECT_TRUE(any_reason_contains(j.verdict, "gradients rel L2 error")) << explain(j.verdict);
}

// The third: the logged loss still divided by N on the skip path.
TEST(NegativeControl, LoggedLossDividedByNIsFlagged) {
  harness::DeterminismGuard guard;
  const auto j = judge_named("single/n5/float32", "broken/logged-loss-divided-by-n");
  EXPECT_TRUE(has_verdict(j, VerdictKind::fail));
  EXPECT_TRUE(any_reason_contains(j.verdict, "logged loss")) << explain(j.verdict);
  // Its gradients are right: only the loss check may fire.
  EXPECT_FALSE(any_reason_contains(j.verdict, "gradients")) << explain(j.verdict);
}

// ... and invisible where dividing by N changes nothing: the harness must not pretend.
TEST(NegativeControl, LoggedLossDividedByNIsInvisibleAtNEqualsOne) {
  harness::DeterminismGuard guard;
  const auto j = judge_named("single/n1/float32", "broken/logged-loss-divided-by-n");
  EXPECT_TRUE(has_verdict(j, VerdictKind::pass));
}

// A forgotten 1/N: gradients are token sums. The gradient check, and with clipping the
// norm check, must fire.
TEST(NegativeControl, DroppedScalePassIsFlaggedByGradientAndNormChecks) {
  harness::DeterminismGuard guard;
  const auto plain = judge_named("single/n5/float32", "broken/scale-pass-dropped");
  EXPECT_TRUE(has_verdict(plain, VerdictKind::fail));
  EXPECT_TRUE(any_reason_contains(plain.verdict, "gradients rel L2 error")) << explain(plain.verdict);
  const auto clipped = judge_named("single/clip-active/float32", "broken/scale-pass-dropped");
  EXPECT_TRUE(any_reason_contains(clipped.verdict, "grad norm")) << explain(clipped.verdict);
}

// Hiding NaN gradients as zeros turns "no gradient exists" into a silent update.
TEST(NegativeControl, ZeroedNonFiniteGradientsAreAnErrorMismatch) {
  harness::DeterminismGuard guard;
  const auto j = judge_named("single/all-masked-mean_ce/float32", "broken/non-finite-zeroed");
  EXPECT_TRUE(has_verdict(j, VerdictKind::error_mismatch));
}

// Every negative control is visible on at least one catalogue scenario and caught on every
// scenario where it is visible.
TEST(NegativeControl, EveryControlIsCaughtWhereverItsBugIsVisible) {
  harness::DeterminismGuard guard;
  for (const harness::VariantSpec& v : harness::variants()) {
    if (v.role != harness::Role::negative_control) continue;
    const oracles::Evaluation e = oracles::evaluate(scenarios::catalogue(), {v});
    int visible = 0;
    for (const oracles::EvaluationRow& row : e.rows) {
      if (row.expectation != oracles::Expectation::flag) continue;
      ++visible;
      EXPECT_TRUE(row.met) << v.name << " slipped through on " << row.scenario.name << ": "
                           << explain(row.verdict);
    }
    EXPECT_GT(visible, 0) << v.name << " is visible on no catalogue scenario";
  }
}

// Tampered observations: each numeric check fires on its own quantity, and only there.
class TamperedObservation : public ::testing::Test {
 protected:
  void SetUp() override {
    scenario_ = scenarios::find_scenario("single/clip-active/float32");
    judged_ = judge_named(scenario_, "baseline");
    ASSERT_TRUE(has_verdict(judged_, VerdictKind::pass));
    // Ten times the tolerance: well outside it, well inside what a real bug produces.
    factor_ = 1 + 10 * oracles::tolerance_for(scenario_.dtype).scalar_rel;
  }
  oracles::Verdict rejudge(const harness::Observation& o) const {
    return oracles::judge(scenario_, o, judged_.oracle, judged_.reference);
  }
  harness::DeterminismGuard guard_;
  scenarios::Scenario scenario_;
  testing_support::Judged judged_;
  double factor_ = 1;
};

TEST_F(TamperedObservation, GradientsScaledBeyondToleranceFail) {
  harness::Observation o = judged_.observation;
  // 1% is a thousand times float32's 1e-5 bound and far below any real normalisation bug.
  for (auto& g : o.steps[0].gradients) g.value = g.value * 1.01;
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::fail);
  EXPECT_TRUE(any_reason_contains(v, "gradients rel L2 error")) << explain(v);
  EXPECT_FALSE(any_reason_contains(v, "parameter update")) << explain(v);
}

TEST_F(TamperedObservation, ParametersMovedBeyondToleranceFail) {
  harness::Observation o = judged_.observation;
  for (std::size_t i = 0; i < o.steps[0].parameters_after.size(); ++i) {
    const at::Tensor before = o.initial_parameters[i].value;
    o.steps[0].parameters_after[i].value = before + (o.steps[0].parameters_after[i].value - before) * 2;
  }
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::fail);
  EXPECT_TRUE(any_reason_contains(v, "parameter update")) << explain(v);
}

TEST_F(TamperedObservation, LoggedLossBeyondToleranceFails) {
  harness::Observation o = judged_.observation;
  *o.steps[0].logged_loss *= factor_;
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::fail);
  EXPECT_TRUE(any_reason_contains(v, "logged loss")) << explain(v);
}

TEST_F(TamperedObservation, GradNormBeyondToleranceFails) {
  harness::Observation o = judged_.observation;
  *o.steps[0].grad_norm *= factor_;
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::fail);
  EXPECT_TRUE(any_reason_contains(v, "grad norm")) << explain(v);
}

TEST_F(TamperedObservation, NaNGradientFails) {
  harness::Observation o = judged_.observation;
  o.steps[0].gradients[0].value = o.steps[0].gradients[0].value.clone();
  o.steps[0].gradients[0].value.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::fail);
  EXPECT_TRUE(any_reason_contains(v, "non-finite gradients")) << explain(v);
}

TEST_F(TamperedObservation, UnexpectedErrorIsAMismatch) {
  harness::Observation o = judged_.observation;
  o.error = harness::ErrorRecord{"c10::Error", "boom"};
  EXPECT_EQ(rejudge(o).kind, VerdictKind::error_mismatch);
}

TEST_F(TamperedObservation, MissingStepFails) {
  harness::Observation o = judged_.observation;
  o.steps.clear();
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::fail);
  EXPECT_TRUE(any_reason_contains(v, "completed 0 of 1 steps")) << explain(v);
}

TEST_F(TamperedObservation, NaNParameterFails) {
  harness::Observation o = judged_.observation;
  o.steps[0].parameters_after[0].value = o.steps[0].parameters_after[0].value.clone();
  o.steps[0].parameters_after[0].value.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::fail);
  EXPECT_TRUE(any_reason_contains(v, "non-finite parameters")) << explain(v);
}

TEST_F(TamperedObservation, MissingLoggedLossFails) {
  harness::Observation o = judged_.observation;
  o.steps[0].logged_loss.reset();
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::fail);
  EXPECT_TRUE(any_reason_contains(v, "no loss was logged")) << explain(v);
}

TEST_F(TamperedObservation, RefusalWhereTheReferenceStepsIsAMismatch) {
  harness::Observation o = judged_.observation;
  o.steps.clear();
  o.error = harness::ErrorRecord{"refusal", "refused for no reason"};
  const auto v = rejudge(o);
  EXPECT_EQ(v.kind, VerdictKind::error_mismatch);
  EXPECT_TRUE(any_reason_contains(v, "where the oracle has a gradient")) << explain(v);
}

TEST_F(TamperedObservation, UntouchedObservationPasses) {
  EXPECT_EQ(rejudge(judged_.observation).kind, VerdictKind::pass);
}

// A model that never moves is flagged on every catalogue scenario where the update check
// can be made; where storage cannot resolve the update the verdict says so in a note.
TEST(NegativeControl, FrozenParametersAreFlaggedOrTheCheckIsDeclaredNotMade) {
  harness::DeterminismGuard guard;
  int flagged = 0, not_made = 0;
  for (const scenarios::Scenario& s : scenarios::catalogue()) {
    if (s.world_size != 1) continue;
    const auto j = judge_named(s, "baseline");
    if (j.verdict.kind != VerdictKind::pass) continue;
    harness::Observation frozen = j.observation;
    for (std::size_t step = 0; step < frozen.steps.size(); ++step) {
      frozen.steps[step].parameters_after = frozen.initial_parameters;
    }
    const auto v = oracles::judge(s, frozen, j.oracle, j.reference);
    if (any_reason_contains(v, "parameter update")) {
      ++flagged;
      EXPECT_EQ(v.kind, VerdictKind::fail) << s.name;
    } else {
      ++not_made;
      EXPECT_FALSE(v.notes.empty()) << s.name << ": a frozen model passed silently: " << explain(v);
    }
  }
  EXPECT_GT(flagged, 40);
  EXPECT_GT(not_made, 0);  // bfloat16 with clipping: the note path is exercised too
}

// Across ranks: a run with the wrong number of ranks, or a faulted reference, is never a pass.
TEST(ErrorContract, MissingRanksOrAFaultedReferenceIsNeverAPass) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario& s = scenarios::find_scenario("dist/4-4/float32");
  const auto oracle = oracles::run_oracle(s, harness::model_config_for(harness::find_variant("baseline"), s));
  const harness::RankedRun good = harness::run_in_threads(harness::find_variant("baseline"), s);
  ASSERT_EQ(oracles::judge_ranks(s, good, oracle, good).kind, VerdictKind::pass);
  const harness::RankedRun empty;
  EXPECT_EQ(oracles::judge_ranks(s, empty, oracle, good).kind, VerdictKind::error_mismatch);
  harness::RankedRun faulted = good;
  faulted.fault = "rank 1 threw: boom";
  const auto v = oracles::judge_ranks(s, good, oracle, faulted);
  EXPECT_EQ(v.kind, VerdictKind::error_mismatch);
  EXPECT_TRUE(any_reason_contains(v, "the reference run aborted")) << explain(v);
}

// The error contract: with N == 0, finite output is a mismatch even if the reference is
// finite too, and a different non-finite pattern from the reference is a mismatch.
TEST(ErrorContract, FiniteOutputWhereNoGradientExistsIsAMismatch) {
  harness::DeterminismGuard guard;
  const auto j = judge_named("single/all-masked-mean_ce/float32", "skip");
  harness::Observation finite = j.observation;
  finite.steps[0].logged_loss = 0.0;
  const auto v = oracles::judge(scenarios::find_scenario("single/all-masked-mean_ce/float32"), finite, j.oracle, finite);
  EXPECT_EQ(v.kind, VerdictKind::error_mismatch);
  EXPECT_TRUE(any_reason_contains(v, "silent update")) << explain(v);
}

TEST(ErrorContract, SameNonFinitePatternAsTheReferenceIsExpected) {
  harness::DeterminismGuard guard;
  const auto j = judge_named("single/all-masked-mean_ce/float32", "baseline");
  EXPECT_EQ(oracles::judge(scenarios::find_scenario("single/all-masked-mean_ce/float32"), j.observation, j.oracle, j.reference).kind,
            VerdictKind::expected_error);
}

TEST(ErrorContract, RefusalMatchesAReferenceRefusal) {
  harness::DeterminismGuard guard;
  const auto j = judge_named("single/in-bwd-clip-refused/float32", "skip");
  EXPECT_TRUE(has_verdict(j, VerdictKind::expected_error));
  ASSERT_TRUE(j.observation.error);
  EXPECT_EQ(j.observation.error->type, "refusal");
  EXPECT_NE(j.observation.error->message.find("clipping"), std::string::npos);
  const auto accum = judge_named("single/in-bwd-accum2-refused/float32", "optimizer-in-backward");
  ASSERT_TRUE(accum.observation.error);
  EXPECT_NE(accum.observation.error->message.find("accumulation"), std::string::npos);
}

}  // namespace
}  // namespace gradnorm
