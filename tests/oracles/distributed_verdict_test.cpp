// Multi-rank verdicts: every rank judged against the float64 oracle, ranks required to hold
// bit-identical replicas, faults reported as error mismatches. The expected verdicts are the
// measured ones documented in scenarios/src/catalogue.cpp (expected_verdicts).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/oracles/verdict.hpp"
#include "gradnorm/scenarios/catalogue.hpp"
#include "test_support.hpp"

namespace gradnorm {
namespace {

using oracles::VerdictKind;
using testing_support::any_reason_contains;
using testing_support::explain;

constexpr const char* kDTypes[] = {"float64", "float32", "bfloat16"};

struct RankedJudgement {
  scenarios::Scenario scenario;
  harness::RankedRun run;
  harness::RankedRun reference;
  oracles::OracleResult oracle;
  oracles::Verdict verdict;
};

// Runs `variant` and its reference on every rank as threads and judges the run.
RankedJudgement judge_threads(const std::string& scenario, const std::string& variant) {
  const harness::VariantSpec& v = harness::find_variant(variant);
  RankedJudgement out;
  out.scenario = scenarios::find_scenario(scenario);
  out.run = harness::run_in_threads(v, out.scenario);
  out.reference = harness::run_in_threads(harness::find_variant(v.reference), out.scenario);
  out.oracle = oracles::run_oracle(out.scenario, harness::model_config_for(v, out.scenario));
  out.verdict = oracles::judge_ranks(out.scenario, out.run, out.oracle, out.reference);
  return out;
}

oracles::Verdict rejudge(const RankedJudgement& j, const harness::RankedRun& run) {
  return oracles::judge_ranks(j.scenario, run, j.oracle, j.reference);
}

::testing::AssertionResult has_verdict(const RankedJudgement& j, VerdictKind kind) {
  if (j.verdict.kind == kind) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << j.scenario.name << " x " << j.run.ranks.front().variant
                                       << ": expected " << oracles::to_string(kind) << ", got "
                                       << explain(j.verdict);
}

bool every_reason_contains(const oracles::Verdict& v, const std::string& needle) {
  for (const std::string& reason : v.reasons) {
    if (reason.find(needle) == std::string::npos) return false;
  }
  return true;
}

// The seed's mild ragged case: the contract's arithmetic passes, the skip path weighs a
// token by 1/(W n_r) and fails on its gradients, and scaling by W alone fails too.
TEST(DistributedVerdict, RaggedFiveThreeSplitsTheVariants) {
  harness::DeterminismGuard guard;
  for (const char* dtype : {"float64", "float32"}) {
    const std::string name = std::string("dist/5-3/") + dtype;
    for (const char* variant : {"baseline", "global-prenorm"}) {
      const auto j = judge_threads(name, variant);
      EXPECT_TRUE(has_verdict(j, VerdictKind::pass));
      EXPECT_TRUE(j.verdict.reasons.empty()) << explain(j.verdict);
      EXPECT_EQ(j.oracle.global_token_count, 8);
    }
    for (const char* variant : {"skip", "world-size-only"}) {
      const auto j = judge_threads(name, variant);
      EXPECT_TRUE(has_verdict(j, VerdictKind::fail));
      EXPECT_TRUE(any_reason_contains(j.verdict, "gradients rel L2 error"))
          << name << " x " << variant << ": " << explain(j.verdict);
      // Both ranks hold the same wrong replica: the failure is arithmetic, not disagreement.
      EXPECT_FALSE(any_reason_contains(j.verdict, "ranks disagree")) << explain(j.verdict);
    }
  }
}

// Balanced ranks: skip's 1/(W n_r) equals 1/N; scaling by W alone is still wrong by W.
TEST(DistributedVerdict, BalancedFourFourPassesSkipAndFailsWorldSizeOnly) {
  harness::DeterminismGuard guard;
  for (const char* dtype : kDTypes) {
    const std::string name = std::string("dist/4-4/") + dtype;
    const auto skip = judge_threads(name, "skip");
    EXPECT_TRUE(has_verdict(skip, VerdictKind::pass));
    const auto scaled = judge_threads(name, "world-size-only");
    EXPECT_TRUE(has_verdict(scaled, VerdictKind::fail));
    EXPECT_TRUE(any_reason_contains(scaled.verdict, "gradients")) << explain(scaled.verdict);
  }
}

// Accumulation 2 closes the pull request's gate: skip behaves as the baseline and passes
// although the ranks are ragged.
TEST(DistributedVerdict, RaggedAccumulationKeepsTheSkipGateClosed) {
  harness::DeterminismGuard guard;
  for (const char* dtype : kDTypes) {
    const std::string name = std::string("dist/accum2-ragged/") + dtype;
    ASSERT_GT(scenarios::find_scenario(name).accumulation_steps, 1);  // the skip gate is closed
    EXPECT_TRUE(has_verdict(judge_threads(name, "skip"), VerdictKind::pass));
    EXPECT_TRUE(has_verdict(judge_threads(name, "baseline"), VerdictKind::pass));
  }
}

// An empty rank beside a full one: its 0/0 mean times 0 is NaN, and the all-reduce carries
// it into every rank's logged loss. The gradients stay right, so only the loss is flagged.
TEST(DistributedVerdict, EmptyRankPoisonsOnlyTheBaselinesLoggedLoss) {
  harness::DeterminismGuard guard;
  const auto j = judge_threads("dist/0-8/float32", "baseline");
  EXPECT_TRUE(has_verdict(j, VerdictKind::fail));
  ASSERT_FALSE(j.verdict.reasons.empty());
  EXPECT_TRUE(every_reason_contains(j.verdict, "logged loss")) << explain(j.verdict);
  for (const harness::Observation& rank : j.run.ranks) {
    ASSERT_EQ(rank.steps.size(), 1u) << "rank " << rank.rank;
    ASSERT_TRUE(rank.steps[0].logged_loss);
    EXPECT_TRUE(std::isnan(*rank.steps[0].logged_loss)) << "rank " << rank.rank;
  }
}

// Dividing by W before or after the sum rounds differently; the baseline passes either way.
TEST(DistributedVerdict, BaselinePassesWithEitherPlacementOfTheRankAverage) {
  harness::DeterminismGuard guard;
  for (const char* dtype : kDTypes) {
    for (const char* base : {"dist/5-3/", "dist/5-3-divide-before-sum/"}) {
      const std::string name = std::string(base) + dtype;
      const auto j = judge_threads(name, "baseline");
      EXPECT_TRUE(has_verdict(j, VerdictKind::pass));
    }
  }
  EXPECT_EQ(scenarios::find_scenario("dist/5-3-divide-before-sum/float32").rank_average,
            scenarios::RankAverage::divide_before_sum);
  EXPECT_EQ(scenarios::find_scenario("dist/5-3/float32").rank_average,
            scenarios::RankAverage::divide_after_sum);
}

// Negative control for the cross-rank check: one ULP on one parameter of rank 1 is within
// every tolerance against the oracle, so only the replica check can catch it, and does.
TEST(DistributedVerdict, NegativeControlRankOffByOneUlpDisagrees) {
  harness::DeterminismGuard guard;
  const auto j = judge_threads("dist/5-3/float32", "baseline");
  ASSERT_TRUE(has_verdict(j, VerdictKind::pass));

  harness::RankedRun tampered = j.run;
  at::Tensor& value = tampered.ranks[1].steps[0].parameters_after[0].value;
  value = value.clone();  // the copy shares storage with j.run until here
  const float first = value.reshape({-1})[0].item<float>();
  value.reshape({-1})[0] = std::nextafter(first, std::numeric_limits<float>::infinity());
  const oracles::Verdict v = rejudge(j, tampered);
  EXPECT_NE(v.kind, VerdictKind::pass) << explain(v);
  EXPECT_EQ(v.kind, VerdictKind::fail) << explain(v);
  EXPECT_TRUE(any_reason_contains(v, "ranks disagree")) << explain(v);
  EXPECT_TRUE(any_reason_contains(v, "rank 1")) << explain(v);

  // A gradient scaled on one rank only is caught the same way.
  harness::RankedRun scaled = j.run;
  at::Tensor& gradient = scaled.ranks[1].steps[0].gradients[0].value;
  gradient = gradient * (1 + 1e-6);
  const oracles::Verdict g = rejudge(j, scaled);
  EXPECT_NE(g.kind, VerdictKind::pass) << explain(g);
  EXPECT_TRUE(any_reason_contains(g, "ranks disagree")) << explain(g);

  // And the untouched run still passes: the tampering did not leak into it.
  EXPECT_EQ(rejudge(j, j.run).kind, VerdictKind::pass) << explain(rejudge(j, j.run));
}

// Each rank is judged on its own observation: a logged loss wrong on rank 1 only fails the
// logged-loss check for rank 1, and the reason names rank 1. (Rank 0's verdict copied to every
// rank would leave only the replica check's "ranks disagree", with no logged-loss check.)
TEST(DistributedVerdict, EachRankIsJudgedOnItsOwnObservation) {
  harness::DeterminismGuard guard;
  const auto j = judge_threads("dist/5-3/float32", "baseline");
  ASSERT_TRUE(has_verdict(j, VerdictKind::pass));
  ASSERT_TRUE(j.run.ranks[1].steps[0].logged_loss.has_value());

  harness::RankedRun tampered = j.run;
  tampered.ranks[1].steps[0].logged_loss = *tampered.ranks[1].steps[0].logged_loss * 1.01;
  const oracles::Verdict v = rejudge(j, tampered);
  EXPECT_EQ(v.kind, VerdictKind::fail) << explain(v);
  EXPECT_NE(std::find(v.failed_checks.begin(), v.failed_checks.end(), "logged-loss"),
            v.failed_checks.end())
      << explain(v);
  EXPECT_TRUE(any_reason_contains(v, "rank 1: step 0: logged loss")) << explain(v);
  EXPECT_FALSE(any_reason_contains(v, "rank 0: step 0: logged loss")) << explain(v);
  EXPECT_FALSE(any_reason_contains(v, "every rank")) << explain(v);
}

// A run that faulted is never a verdict on the arithmetic: it is an error mismatch that
// carries the fault's text.
TEST(DistributedVerdict, FaultedRunIsAnErrorMismatchNamingTheFault) {
  harness::DeterminismGuard guard;
  const auto j = judge_threads("dist/5-3/float32", "baseline");
  ASSERT_TRUE(has_verdict(j, VerdictKind::pass));

  harness::RankedRun faulted = j.run;
  faulted.fault = "rank 1 threw: injected fault: rank 1 throws";
  const oracles::Verdict v = rejudge(j, faulted);
  EXPECT_EQ(v.kind, VerdictKind::error_mismatch) << explain(v);
  EXPECT_TRUE(any_reason_contains(v, *faulted.fault)) << explain(v);

  harness::RunOptions options;
  options.timeout = std::chrono::seconds(10);  // the exit aborts the room at once
  options.fault = harness::parse_fault("1:exit");
  const harness::RankedRun exited =
      harness::run_in_threads(harness::find_variant("baseline"), j.scenario, options);
  ASSERT_TRUE(exited.fault);
  const oracles::Verdict e = rejudge(j, exited);
  EXPECT_EQ(e.kind, VerdictKind::error_mismatch) << explain(e);
  EXPECT_TRUE(any_reason_contains(e, *exited.fault)) << explain(e);
}

// The whole dist/* catalogue against every variant reproduces the documented verdicts, and
// no run faults.
TEST(DistributedVerdict, EveryDistributedScenarioMeetsItsExpectations) {
  harness::DeterminismGuard guard;
  const oracles::Evaluation e =
      oracles::evaluate(scenarios::select_scenarios("dist/*"), harness::variants());
  ASSERT_FALSE(e.rows.empty());
  int faults = 0;
  for (const oracles::EvaluationRow& row : e.rows) {
    EXPECT_GT(row.world_size, 1) << row.scenario.name;
    if (row.fault) {
      ++faults;
      ADD_FAILURE() << row.scenario.name << " x " << row.variant.name << " faulted: " << *row.fault;
    }
    EXPECT_TRUE(row.met) << row.scenario.name << " x " << row.variant.name << " ("
                         << oracles::to_string(row.expectation) << ", " << row.applicability
                         << "): " << explain(row.verdict);
  }
  EXPECT_EQ(faults, 0);
  EXPECT_TRUE(e.all_met()) << e.count_unmet() << " rows unmet";
  // Left out, never judged: the single-device distillation recipe on every scenario, and
  // global-prenorm (a token-sum-path candidate) where the optimizer steps in backward.
  std::size_t in_backward = 0;
  for (const scenarios::Scenario& sc : scenarios::select_scenarios("dist/*")) {
    in_backward += sc.optimizer_in_backward ? 1 : 0;
  }
  for (const oracles::SkippedPair& skipped : e.skipped) {
    EXPECT_TRUE(skipped.variant == "kd-single-device" ||
                (skipped.variant == "global-prenorm" &&
                 scenarios::find_scenario(skipped.scenario).optimizer_in_backward))
        << skipped.scenario << " x " << skipped.variant << ": " << skipped.why;
  }
  EXPECT_EQ(e.skipped.size(), scenarios::select_scenarios("dist/*").size() + in_backward);
}

// The documented findings are exercised, not vacuous: on dist/5-3 they are what the
// evaluation reports for skip and world-size-only.
TEST(DistributedVerdict, DocumentedFindingsAreReproduced) {
  harness::DeterminismGuard guard;
  const oracles::Evaluation e =
      oracles::evaluate(scenarios::select_scenarios("dist/5-3/float32"),
                        {harness::find_variant("skip"), harness::find_variant("world-size-only"),
                         harness::find_variant("baseline")});
  ASSERT_EQ(e.rows.size(), 3u);
  EXPECT_EQ(e.rows[0].expectation, oracles::Expectation::finding);
  EXPECT_EQ(e.rows[1].expectation, oracles::Expectation::finding);
  EXPECT_EQ(e.rows[2].expectation, oracles::Expectation::agree);
  for (const oracles::EvaluationRow& row : e.rows) {
    EXPECT_TRUE(row.met) << row.variant.name << ": " << explain(row.verdict);
  }
  // Without the documented findings the same rows are unmet: the findings carry weight.
  oracles::EvaluateOptions strict;
  strict.use_documented_findings = false;
  const oracles::Evaluation s =
      oracles::evaluate(scenarios::select_scenarios("dist/5-3/float32"),
                        {harness::find_variant("skip"), harness::find_variant("world-size-only")},
                        strict);
  EXPECT_EQ(s.count_unmet(), 2);
}

}  // namespace
}  // namespace gradnorm
