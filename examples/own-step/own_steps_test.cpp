// The helpers pass the right step and catch the subtly wrong one.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <gradnorm/scenarios/catalogue.hpp>
#include <gradnorm/testing/gtest.hpp>
#include <gradnorm/testing/rapidcheck.hpp>

#include "own_steps.hpp"

namespace {

using gradnorm::scenarios::find_scenario;

class Registered : public ::testing::Environment {
 public:
  void SetUp() override { own_step::register_steps(); }
};
const auto* const kRegistered = ::testing::AddGlobalTestEnvironment(new Registered);

TEST(OwnSteps, TokenSumAgreesOnOneDeviceAndOnRaggedRanks) {
  EXPECT_STEP_AGREES("own/token-sum", find_scenario("single/n5/float32"));
  EXPECT_STEP_AGREES("own/token-sum", find_scenario("single/accum2-ragged/float32"));
  EXPECT_STEP_AGREES("own/token-sum", find_scenario("dist/5-3/float32"));
  EXPECT_STEP_AGREES("own/token-sum", find_scenario("dist/1-64/float32"));
}

TEST(OwnSteps, LocalMeanLooksRightOnOneDevice) {
  EXPECT_STEP_AGREES("own/local-mean", find_scenario("single/accum2-ragged/float32"));
  EXPECT_STEP_AGREES("own/local-mean", find_scenario("dist/4-4/float32"));
}

TEST(OwnSteps, LocalMeanIsCaughtOnRaggedRanksWithItsTokenWeights) {
  // [5, 3]: rank 0's tokens weigh 1/(2*5) = 0.1 and rank 1's 1/(2*3), instead of 1/8.
  EXPECT_NONFATAL_FAILURE(EXPECT_STEP_AGREES("own/local-mean", find_scenario("dist/5-3/float32")),
                          "rank 1: 3 tokens, weight 0.166667 (1.333 x 1/N)");
}

RC_GTEST_PROP(OwnSteps, TokenSumAgreesWhereTheRecipeDoes, ()) {
  gradnorm::testing::rc_assert_agrees_where_reference_does(
      "own/token-sum", *gradnorm::scenarios::ragged_rank_scenarios());
}

TEST(OwnSteps, FuzzingCatchesLocalMean) {
  EXPECT_FALSE(rc::check("own/local-mean on ragged ranks", [] {
    gradnorm::testing::rc_assert_agrees_where_reference_does(
        "own/local-mean", *gradnorm::scenarios::ragged_rank_scenarios());
  }));
}

}  // namespace
