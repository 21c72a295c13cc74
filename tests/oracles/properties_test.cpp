// The harness's properties (oracles/properties.hpp), bounded and seeded in ctest through
// RC_PARAMS; `gradnorm fuzz` runs the same ones longer. A counter-example prints as a
// scenario.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/judgement.hpp"
#include "gradnorm/oracles/properties.hpp"
#include "gradnorm/scenarios/catalogue.hpp"
#include "gradnorm/scenarios/generators.hpp"

namespace gradnorm {
namespace {

namespace p = oracles::properties;

RC_GTEST_PROP(Properties, BaselineAgreesWithTheOracle, ()) {
  harness::DeterminismGuard guard;
  p::baseline_agrees_with_the_oracle(*scenarios::single_device_scenarios());
}

RC_GTEST_PROP(Properties, BaselineAgreesWithTheOracleOnAnyRanks, ()) {
  harness::DeterminismGuard guard;
  p::baseline_agrees_with_the_oracle_on_ranks(*scenarios::multi_rank_scenarios());
}

RC_GTEST_PROP(Properties, SkipAgreesWithTheOracleWhenTokensExist, ()) {
  harness::DeterminismGuard guard;
  p::skip_agrees_on_one_device(
      *scenarios::single_device_scenarios(scenarios::GeneratorOptions{.min_count = 1}));
}

RC_GTEST_PROP(Properties, DroppedScalePassIsFlaggedExactlyWhenVisible, ()) {
  harness::DeterminismGuard guard;
  p::dropped_scale_flagged_exactly_when_visible(
      *scenarios::single_device_scenarios(scenarios::GeneratorOptions{.min_count = 1}));
}

RC_GTEST_PROP(Properties, DroppedScalePassOnRaggedRanks, ()) {
  harness::DeterminismGuard guard;
  p::dropped_scale_flagged_exactly_when_visible(*scenarios::ragged_rank_scenarios());
}

RC_GTEST_PROP(Properties, TokenWeightsFollowTheArithmetic, ()) {
  harness::DeterminismGuard guard;
  p::token_weights_follow_the_arithmetic(*scenarios::ragged_rank_scenarios());
}

RC_GTEST_PROP(Properties, SkipPassesIffRanksAreBalanced, ()) {
  harness::DeterminismGuard guard;
  p::skip_passes_iff_ranks_are_balanced(*scenarios::ragged_rank_scenarios());
}

// Fuzzing keeps judging where the reference has a weakness: the recipe's NaN logged loss
// after an empty micro-batch removes only the logged-loss check. A step that drops the
// scale W/N (here 1/5) is caught on its gradients and update on that very case, which the
// all-or-nothing rule (judge only where the reference agrees on everything) let through.
TEST(CheckByCheck, AReferencesFailedCheckRemovesOnlyThatCheck) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario& s = scenarios::find_scenario("single/accum2-empty-first-mean_ce/float64");
  const oracles::Judgement dropped = oracles::judge_step("broken/scale-pass-dropped", s);
  ASSERT_TRUE(dropped.reference_row.has_value());
  EXPECT_EQ(dropped.reference_row->verdict.failed_checks, std::vector<std::string>{"logged-loss"});
  EXPECT_FALSE(dropped.reference_agrees());
  // W = 1 and no clipping: ranks-agree and grad-norm have nothing to judge.
  const std::vector<std::string> judged = {"steps", "gradients", "parameter-update", "error-behaviour"};
  EXPECT_EQ(dropped.judged_checks(), judged);
  EXPECT_EQ(dropped.disagreements(), (std::vector<std::string>{"gradients", "parameter-update"}));

  // Its control: a correct step on the same case is judged on the same checks and agrees,
  // though it shares the recipe's NaN logged loss.
  const oracles::Judgement prenorm = oracles::judge_step("global-prenorm", s);
  EXPECT_EQ(prenorm.judged_checks(), judged);
  EXPECT_TRUE(prenorm.disagreements().empty());
  EXPECT_FALSE(prenorm.agrees());
}

// A step that is its own reference is held to every check; N = 0 leaves error behaviour
// alone to judge (no gradient exists), and the tally says so.
TEST(CheckByCheck, NoGradientJudgesOnlyTheErrorBehaviourAndTheTallyCountsIt) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario& empty = scenarios::find_scenario("single/all-masked-mean_ce/float64");
  const oracles::Judgement baseline = oracles::judge_step("baseline", empty);
  EXPECT_FALSE(baseline.reference_row.has_value());
  EXPECT_EQ(baseline.judged_checks(), std::vector<std::string>{"error-behaviour"});
  EXPECT_TRUE(baseline.disagreements().empty());

  p::CheckTally tally;
  tally.count(baseline);
  tally.count(oracles::judge_step("baseline", scenarios::find_scenario("single/accum2-empty-first-mean_ce/float64")));
  EXPECT_TRUE(tally.found_counter_example);  // baseline's own NaN logged loss
  tally.count(oracles::judge_step("baseline", scenarios::find_scenario("single/n3/float64")));  // not counted
  EXPECT_EQ(p::describe(tally),
            "on the 2 cases up to the counter-example: steps 1, gradients 1, parameter-update 1, "
            "logged-loss 1 (1 failed), grad-norm 0, ranks-agree 0, error-behaviour 2");
}

}  // namespace
}  // namespace gradnorm
