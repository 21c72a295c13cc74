// The harness's properties (oracles/properties.hpp), bounded and seeded in ctest through
// RC_PARAMS; `gradnorm fuzz` runs the same ones longer. A counter-example prints as a
// scenario.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/properties.hpp"
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

}  // namespace
}  // namespace gradnorm
