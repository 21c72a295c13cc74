#pragma once
// GoogleTest assertions that judge a registered step against the float64 oracle.
//
//   EXPECT_STEP_AGREES("my-step", gradnorm::scenarios::find_scenario("dist/5-3/float32"));
//
// On failure the message names the verdict and its reasons, the worst gradient element and
// the per-token weights each rank gave against the contract's 1/N (docs/design.md §6).

#include <gtest/gtest.h>

#include <string>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/judgement.hpp"

namespace gradnorm::testing {

// Predicate-formatter form: use through EXPECT_STEP_AGREES / ASSERT_STEP_AGREES.
inline ::testing::AssertionResult StepAgreesWithOracle(const char* variant_text,
                                                       const char* scenario_text,
                                                       const std::string& variant,
                                                       const scenarios::Scenario& scenario) {
  harness::DeterminismGuard guard;
  const oracles::Judgement judgement = oracles::judge_step(variant, scenario);
  if (judgement.agrees()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << variant_text << " on " << scenario_text << " does not agree with the oracle:\n"
         << oracles::explain(judgement);
}

}  // namespace gradnorm::testing

#define EXPECT_STEP_AGREES(variant, scenario) \
  EXPECT_PRED_FORMAT2(::gradnorm::testing::StepAgreesWithOracle, variant, scenario)
#define ASSERT_STEP_AGREES(variant, scenario) \
  ASSERT_PRED_FORMAT2(::gradnorm::testing::StepAgreesWithOracle, variant, scenario)
