// Properties over generated single-device scenarios (bounded and seeded in ctest through
// RC_PARAMS; a counter-example prints as a scenario).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/tolerance.hpp"
#include "gradnorm/oracles/token_weights.hpp"
#include "gradnorm/scenarios/generators.hpp"
#include "test_support.hpp"

namespace gradnorm {
namespace {

using oracles::VerdictKind;

// Today's recipe agrees with the oracle on any window with tokens, except for what an
// all-masked micro-batch does to it: with a mean-forming loss only the logged loss goes
// wrong (NaN * 0 in running_loss); with a graph-less zero, backward raises. With no token at
// all the step must signal an error.
RC_GTEST_PROP(Properties, BaselineAgreesWithTheOracle, ()) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario s = *scenarios::single_device_scenarios();
  const auto j = testing_support::judge_named(s, "baseline");
  RC_TAG(scenarios::to_string(s.dtype));
  RC_LOG() << testing_support::explain(j.verdict) << "\n";
  bool empty_micro_batch = false;
  for (int count : s.valid_tokens[0]) empty_micro_batch = empty_micro_batch || count == 0;
  if (s.global_token_count() == 0) {
    RC_ASSERT(j.verdict.kind == VerdictKind::expected_error);
  } else if (!empty_micro_batch) {
    RC_ASSERT(j.verdict.kind == VerdictKind::pass);
  } else if (s.loss == scenarios::LossKind::linear_ce) {
    RC_ASSERT(j.verdict.kind == VerdictKind::error_mismatch);
  } else {
    RC_ASSERT(j.verdict.kind == VerdictKind::fail);
    for (const std::string& reason : j.verdict.reasons) {
      RC_ASSERT(reason.find("logged loss") != std::string::npos);
    }
  }
}

// The pull request's claim, as a property: on a single device the skip path's numbers agree
// with the oracle whenever every micro-batch holds a token.
RC_GTEST_PROP(Properties, SkipAgreesWithTheOracleWhenTokensExist, ()) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario s = *scenarios::single_device_scenarios(scenarios::GeneratorOptions{.min_count = 1});
  const auto j = testing_support::judge_named(s, "skip");
  RC_LOG() << testing_support::explain(j.verdict) << "\n";
  RC_ASSERT(j.verdict.kind == VerdictKind::pass);
}

// Negative control for both properties: a dropped 1/N is flagged on every window with
// N > 1, and invisible (a pass) at N == 1 where 1/N is 1.
RC_GTEST_PROP(Properties, DroppedScalePassIsFlaggedExactlyWhenNExceedsOne, ()) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario s =
      *scenarios::single_device_scenarios(scenarios::GeneratorOptions{.min_count = 1});
  const auto j = testing_support::judge_named(s, "broken/scale-pass-dropped");
  RC_LOG() << testing_support::explain(j.verdict) << "\n";
  RC_CLASSIFY(s.global_token_count() > 1, "N > 1");
  if (s.global_token_count() > 1) {
    RC_ASSERT(j.verdict.kind == VerdictKind::fail);
  } else {
    RC_ASSERT(j.verdict.kind == VerdictKind::pass);
  }
}

}  // namespace
}  // namespace gradnorm

namespace gradnorm {
namespace {

// Random ragged ranks (accumulation 1, every rank holding a token), float64 throughout.
rc::Gen<scenarios::Scenario> ragged_ranks() {
  return rc::gen::exec([] {
    scenarios::Scenario s;
    s.name = "generated-ranks";
    s.world_size = *rc::gen::inRange(2, 5);
    s.accumulation_steps = 1;
    s.micro_batch_size = *rc::gen::inRange(1, 3);
    s.sequence_length = *rc::gen::inRange(2, 8);
    s.dtype = scenarios::DType::float64;
    s.valid_tokens.clear();
    for (int rank = 0; rank < s.world_size; ++rank) {
      s.valid_tokens.push_back({*rc::gen::inRange(1, s.micro_batch_capacity() + 1)});
    }
    s.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
    return s;
  });
}

// DESIGN.md §1 as a property, read off the token-weight probe: a token on rank r weighs
// 1/N under baseline and global-prenorm, 1/(W n_r) under skip, 1/n_r under world-size-only.
RC_GTEST_PROP(Properties, TokenWeightsFollowTheArithmetic, ()) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario s = *ragged_ranks();
  const double n = static_cast<double>(s.global_token_count());
  const double w = static_cast<double>(s.world_size);
  for (const char* name : {"baseline", "skip", "world-size-only", "global-prenorm"}) {
    const auto report = oracles::probe_token_weights(s, harness::find_variant(name));
    RC_ASSERT(report.outcome == std::string("ok"));
    for (const auto& rank : report.ranks) {
      const double n_r = static_cast<double>(rank.tokens);
      const std::string variant = name;
      const double expected = variant == "skip"              ? 1.0 / (w * n_r)
                              : variant == "world-size-only" ? 1.0 / n_r
                                                             : 1.0 / n;
      for (double weight : rank.weights) {
        // float64 gradients; the baseline's scale W/N is a float32 scalar (2^-24 relative).
        RC_ASSERT(std::abs(weight - expected) <= 1e-7 * expected);
      }
    }
  }
}

// Skip agrees with the oracle exactly when every rank holds the same count (DESIGN.md §1).
RC_GTEST_PROP(Properties, SkipPassesIffRanksAreBalanced, ()) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario s = *ragged_ranks();
  bool balanced = true;
  for (const auto& row : s.valid_tokens) balanced = balanced && row[0] == s.valid_tokens[0][0];
  RC_CLASSIFY(balanced, "balanced");
  scenarios::Scenario probe = s;
  probe.model = scenarios::ModelKind::token_probe;
  const harness::RankedRun skip = harness::run_in_threads(harness::find_variant("skip"), probe);
  const harness::RankedRun base = harness::run_in_threads(harness::find_variant("baseline"), probe);
  const auto oracle = oracles::run_oracle(probe, harness::model_config_for(harness::find_variant("skip"), probe));
  const auto verdict = oracles::judge_ranks(probe, skip, oracle, base);
  RC_LOG() << testing_support::explain(verdict) << "\n";
  RC_ASSERT((verdict.kind == VerdictKind::pass) == balanced);
}

}  // namespace
}  // namespace gradnorm
