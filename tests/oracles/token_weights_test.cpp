// The token-weight probe reads the weight every valid token received in the gradient the
// optimizer consumed. docs/design.md §1: baseline and global-prenorm give 1/N, skip gives
// 1/(W n_r), world-size-only gives 1/n_r; on one device all of them give 1/n.
#include "gradnorm/oracles/token_weights.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm {
namespace {

using oracles::TokenWeightReport;

TokenWeightReport probe(const std::string& scenario, const std::string& variant) {
  return oracles::probe_token_weights(scenarios::find_scenario(scenario),
                                      harness::find_variant(variant));
}

// Every weight of `rank` equals `expected` to `rel` relative error; names the worst token.
// Default 1e-12: a float64 weight is one gradient entry divided by (1/V - 1), a few roundings
// of 1.1e-16; that is ~1e4 of them, yet 1e4 times finer than float32's 1.5e-8 rounding of 1/5.
::testing::AssertionResult rank_weights_near(const TokenWeightReport& report, int rank,
                                             double expected, double rel = 1e-12) {
  if (report.outcome != "ok") {
    return ::testing::AssertionFailure() << report.scenario << " x " << report.variant
                                         << ": outcome " << report.outcome;
  }
  if (rank >= static_cast<int>(report.ranks.size())) {
    return ::testing::AssertionFailure() << "no rank " << rank << " in the report";
  }
  const oracles::RankTokenWeights& weights = report.ranks[static_cast<std::size_t>(rank)];
  if (weights.rank != rank) {
    return ::testing::AssertionFailure() << "entry " << rank << " is rank " << weights.rank;
  }
  if (static_cast<long>(weights.weights.size()) != weights.tokens) {
    return ::testing::AssertionFailure() << "rank " << rank << ": " << weights.weights.size()
                                         << " weights for " << weights.tokens << " tokens";
  }
  double worst = 0;
  std::size_t worst_token = 0;
  for (std::size_t i = 0; i < weights.weights.size(); ++i) {
    const double error = std::abs(weights.weights[i] - expected) / std::abs(expected);
    if (!(error <= worst)) {
      worst = error;
      worst_token = i;
    }
  }
  if (worst <= rel) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << report.scenario << " x " << report.variant << " rank " << rank << " token "
         << worst_token << ": weight " << weights.weights[worst_token] << ", want " << expected
         << " (rel error " << worst << " > " << rel << ")";
}

// ||w - 1/N|| / ||1/N|| for `counts[r]` tokens of weight `weights[r]` on rank r.
double closed_form_rel_l2(const std::vector<long>& counts, const std::vector<double>& weights) {
  long total = 0;
  for (long n : counts) total += n;
  const double contract = 1.0 / static_cast<double>(total);
  double squares = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    squares += static_cast<double>(counts[r]) * std::pow(weights[r] - contract, 2);
  }
  return std::sqrt(squares) / std::sqrt(static_cast<double>(total) * contract * contract);
}

// The helper itself can fail: a weight 1e-9 off is caught at 1e-12.
TEST(TokenWeights, NegativeControlHelperCatchesAnOffWeight) {
  TokenWeightReport report;
  report.outcome = "ok";
  report.ranks.push_back({0, 2, {0.125, 0.125 * (1 + 1e-9)}});
  EXPECT_FALSE(rank_weights_near(report, 0, 0.125));
  // 1e-8: a bound just above the 1e-9 offset, so the verdict follows the bound passed in.
  EXPECT_TRUE(rank_weights_near(report, 0, 0.125, 1e-8));
  EXPECT_FALSE(rank_weights_near(report, 1, 0.125));
}

TEST(TokenWeights, RaggedFiveThreeWeightsFollowEachArithmetic) {
  harness::DeterminismGuard guard;
  struct Case {
    const char* variant;
    double rank0;
    double rank1;
  };
  for (const Case& c : {Case{"baseline", 1.0 / 8, 1.0 / 8}, Case{"global-prenorm", 1.0 / 8, 1.0 / 8},
                        Case{"skip", 1.0 / (2 * 5), 1.0 / (2 * 3)},
                        Case{"world-size-only", 1.0 / 5, 1.0 / 3}}) {
    const TokenWeightReport report = probe("dist/5-3/float64", c.variant);
    ASSERT_EQ(report.outcome, "ok") << c.variant;
    EXPECT_EQ(report.global_token_count, 8);
    EXPECT_DOUBLE_EQ(report.expected_weight, 1.0 / 8);
    ASSERT_EQ(report.ranks.size(), 2u);
    EXPECT_EQ(report.ranks[0].tokens, 5);
    EXPECT_EQ(report.ranks[1].tokens, 3);
    EXPECT_TRUE(rank_weights_near(report, 0, c.rank0));
    EXPECT_TRUE(rank_weights_near(report, 1, c.rank1));
    // Weights within 1e-12 relative move rel_l2 by at most 1e-12 x (1 + rel_l2) <= 2.2e-12
    // (rel_l2 is at most 1.13 here); 1e-9 leaves room for the float64 sums over 8 tokens.
    EXPECT_NEAR(report.rel_l2_error, closed_form_rel_l2({5, 3}, {c.rank0, c.rank1}), 1e-9)
        << c.variant;
  }
}

TEST(TokenWeights, SkipErrorOnFiveThreeMatchesTheClosedForm) {
  harness::DeterminismGuard guard;
  const double closed = std::sqrt(5 * std::pow(0.1 - 0.125, 2) + 3 * std::pow(1.0 / 6 - 0.125, 2)) /
                        std::sqrt(8 * 0.125 * 0.125);
  // Exactly 1/sqrt(15): 5 x (1/40)^2 + 3 x (1/24)^2 = 1/120 over 8 x (1/8)^2 = 1/8. Both sides
  // are float64 evaluations of a few squares and a sqrt: a few roundings of 1.1e-16.
  ASSERT_NEAR(closed, 1 / std::sqrt(15.0), 1e-12);
  const TokenWeightReport report = probe("dist/5-3/float64", "skip");
  // As in the test above: weights within 1e-12 move rel_l2 by ~1e-12, 1e-9 leaves room.
  EXPECT_NEAR(report.rel_l2_error, closed, 1e-9);
}

// The seed's extreme case: the lone token on rank 0 weighs 0.5 instead of 1/65.
TEST(TokenWeights, ExtremeOneSixtyFourSkipWeights) {
  harness::DeterminismGuard guard;
  const TokenWeightReport report = probe("dist/1-64/float64", "skip");
  ASSERT_EQ(report.outcome, "ok");
  EXPECT_EQ(report.global_token_count, 65);
  ASSERT_EQ(report.ranks.size(), 2u);
  EXPECT_EQ(report.ranks[0].tokens, 1);
  EXPECT_EQ(report.ranks[1].tokens, 64);
  EXPECT_TRUE(rank_weights_near(report, 0, 0.5));
  EXPECT_TRUE(rank_weights_near(report, 1, 1.0 / 128));
  const double contract = 1.0 / 65;
  const double closed = std::sqrt(std::pow(0.5 - contract, 2) + 64 * std::pow(1.0 / 128 - contract, 2)) /
                        std::sqrt(65 * contract * contract);
  // Exactly 63/16 (the squares sum to 3969 x 65 / 1081600, times 65 is (63/16)^2); float64
  // evaluation of a few squares and a sqrt: a few roundings of 1.1e-16 relative to ~4.
  ASSERT_NEAR(closed, 63.0 / 16, 1e-12);
  // Weights within 1e-12 move rel_l2 by at most 1e-12 x (1 + 3.94) = 5e-12; 1e-9 leaves room.
  EXPECT_NEAR(report.rel_l2_error, closed, 1e-9);
}

// On one device the skip path's 1/n is the contract's 1/N. The baseline scales by
// `1 / num_tokens` on an int64 tensor, a float32 scalar even for float64 gradients (as the
// recipe does), so its weight is 1/5 rounded to float32: exact to that rounding, and within
// float32's resolution of 1/5.
TEST(TokenWeights, SingleDeviceBaselineAndSkipGiveOneOverN) {
  harness::DeterminismGuard guard;
  const double float32_fifth = static_cast<double>(1.0f / 5.0f);
  ASSERT_NE(float32_fifth, 1.0 / 5);
  struct Case {
    const char* variant;
    double weight;
  };
  for (const Case& c : {Case{"baseline", float32_fifth}, Case{"skip", 1.0 / 5}}) {
    const TokenWeightReport report = probe("single/n5/float64", c.variant);
    ASSERT_EQ(report.outcome, "ok") << c.variant;
    EXPECT_EQ(report.global_token_count, 5);
    ASSERT_EQ(report.ranks.size(), 1u);
    EXPECT_EQ(report.ranks[0].tokens, 5);
    EXPECT_TRUE(rank_weights_near(report, 0, c.weight));
    // 1e-7: the baseline's weight is 1/5 rounded to float32, 1.5e-8 relative off; 1e-7 is
    // float32's epsilon (1.2e-7) rounded down, so nothing coarser than float32 passes.
    EXPECT_TRUE(rank_weights_near(report, 0, 1.0 / 5, 1e-7));
    // Every weight is 1.5e-8 (or less) off, so rel_l2 is too; same float32 bound.
    EXPECT_LT(report.rel_l2_error, 1e-7) << c.variant;
  }
  // Skip computes 1/5 in float64: a few roundings of 1.1e-16, so float64's 1e-12 bound holds
  // where the baseline's float32 1.5e-8 would not.
  EXPECT_LT(probe("single/n5/float64", "skip").rel_l2_error, 1e-12);
  EXPECT_GT(probe("single/n5/float64", "baseline").rel_l2_error, 1e-12);
}

TEST(TokenWeights, AllMaskedStepHasNoWeights) {
  harness::DeterminismGuard guard;
  for (const char* scenario :
       {"single/all-masked-mean_ce/float64", "single/all-masked-linear_ce/float32"}) {
    const TokenWeightReport report = probe(scenario, "baseline");
    EXPECT_NE(report.outcome.find("N == 0"), std::string::npos) << scenario << ": " << report.outcome;
    EXPECT_EQ(report.global_token_count, 0);
    EXPECT_TRUE(report.ranks.empty()) << scenario;
  }
}

// Negative control: skip on ragged ranks puts wrong weights, and the probe's error says so
// where the baseline's does not; on balanced ranks the same skip is right.
TEST(TokenWeights, NegativeControlSkipOnRaggedRanksIsFarOff) {
  harness::DeterminismGuard guard;
  const TokenWeightReport skip = probe("dist/5-3/float64", "skip");
  const TokenWeightReport baseline = probe("dist/5-3/float64", "baseline");
  // Skip's closed-form error is 1/sqrt(15) = 0.26 on 5-3 and 0.88 on 8-ranks-ragged; 0.1 is
  // well below both and eight orders above the 1e-9 the contract-following runs meet.
  EXPECT_GT(skip.rel_l2_error, 0.1);
  // Contract met: only float64 roundings over 8 weights (~1e-16 each), far below 1e-9.
  EXPECT_LT(baseline.rel_l2_error, 1e-9);
  EXPECT_LT(probe("dist/4-4/float64", "skip").rel_l2_error, 1e-9);
  EXPECT_GT(probe("dist/8-ranks-ragged/float64", "skip").rel_l2_error, 0.1);
}

}  // namespace
}  // namespace gradnorm
