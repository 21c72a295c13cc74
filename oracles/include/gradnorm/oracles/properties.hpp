#pragma once
// The harness's properties, written once for rapidcheck: ctest runs them with a bounded,
// seeded number of cases; `gradnorm fuzz` runs them for as long as asked. Header-only so
// the oracles library itself does not depend on rapidcheck. Each takes a generated scenario
// and fails through RC_ASSERT, logging the verdict so a counter-example explains itself.

#include <rapidcheck.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gradnorm/harness/runner.hpp"
#include "gradnorm/oracles/judgement.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/oracles/token_weights.hpp"
#include "gradnorm/oracles/verdict.hpp"

namespace gradnorm::oracles::properties {

inline Verdict judge_variant(const scenarios::Scenario& s, const std::string& name) {
  const harness::VariantSpec& v = harness::find_variant(name);
  const harness::RankedRun run = harness::run_in_threads(v, s);
  const harness::RankedRun reference = harness::run_in_threads(harness::find_variant(v.reference), s);
  const harness::Observation* anchor = run.ranks.empty() ? nullptr : &run.ranks.front();
  const Verdict verdict =
      judge_ranks(s, run, run_oracle(s, harness::model_config_for(v, s), v.objective, anchor), reference);
  RC_LOG() << name << ": " << to_string(verdict.kind) << " (" << verdict.outcome << ")";
  for (const std::string& reason : verdict.reasons) RC_LOG() << "; " << reason;
  RC_LOG() << "\n";
  return verdict;
}

inline bool has_empty_micro_batch(const scenarios::Scenario& s) {
  for (const auto& row : s.valid_tokens) {
    for (int count : row) {
      if (count == 0) return true;
    }
  }
  return false;
}

// Today's recipe agrees with the oracle on any window with tokens, except for what an
// all-masked micro-batch does to it: with a mean-forming loss only the logged loss goes
// wrong (NaN * 0 in running_loss); with a graph-less zero, backward raises. With no token at
// all the step must signal an error.
inline void baseline_agrees_with_the_oracle(const scenarios::Scenario& s) {
  const Verdict v = judge_variant(s, "baseline");
  if (s.global_token_count() == 0) {
    RC_ASSERT(v.kind == VerdictKind::expected_error);
  } else if (!has_empty_micro_batch(s)) {
    RC_ASSERT(v.kind == VerdictKind::pass);
  } else if (s.loss == scenarios::LossKind::linear_ce) {
    RC_ASSERT(v.kind == VerdictKind::error_mismatch);
  } else {
    RC_ASSERT(v.kind == VerdictKind::fail);
    RC_ASSERT(v.failed_checks == std::vector<std::string>{"logged-loss"});
  }
}

// The same on any multi-rank step (accumulation, empty micro-batches and ranks, every
// optimizer, clipping across ranks): an empty micro-batch or rank, anywhere, reaches every
// rank's logged loss through the all-reduce, or makes that rank's backward raise.
inline void baseline_agrees_with_the_oracle_on_ranks(const scenarios::Scenario& s) {
  RC_CLASSIFY(s.world_size > 8, "W > 8");
  RC_CLASSIFY(s.accumulation_steps > 1, "accumulation");
  RC_CLASSIFY(has_empty_micro_batch(s), "an empty micro-batch");
  RC_CLASSIFY(s.steps > 1, "several steps");
  baseline_agrees_with_the_oracle(s);
}

// The pull request's claim on one device: skip agrees with the oracle whenever every
// micro-batch holds a token.
inline void skip_agrees_on_one_device(const scenarios::Scenario& s) {
  RC_PRE(s.world_size == 1 && !has_empty_micro_batch(s));
  RC_ASSERT(judge_variant(s, "skip").kind == VerdictKind::pass);
}

// Negative control for both: a dropped scale W/N is flagged exactly when it is not 1.
inline void dropped_scale_flagged_exactly_when_visible(const scenarios::Scenario& s) {
  RC_PRE(!has_empty_micro_batch(s));
  const Verdict v = judge_variant(s, "broken/scale-pass-dropped");
  const bool visible = s.global_token_count() != s.world_size;
  RC_CLASSIFY(visible, "N != W");
  RC_ASSERT((v.kind == VerdictKind::fail) == visible);
  RC_ASSERT((v.kind == VerdictKind::pass) == !visible);
}

// docs/design.md §1 read off the token-weight probe: a token on rank r weighs 1/N under
// baseline and global-prenorm, 1/(W n_r) under skip, 1/n_r under world-size-only.
inline void token_weights_follow_the_arithmetic(const scenarios::Scenario& s) {
  const double n = static_cast<double>(s.global_token_count());
  const double w = static_cast<double>(s.world_size);
  for (const std::string variant : {"baseline", "skip", "world-size-only", "global-prenorm"}) {
    const TokenWeightReport report = probe_token_weights(s, harness::find_variant(variant));
    RC_ASSERT(report.outcome == std::string("ok"));
    for (const RankTokenWeights& rank : report.ranks) {
      const double n_r = static_cast<double>(rank.tokens);
      const double expected = variant == "skip"              ? 1.0 / (w * n_r)
                              : variant == "world-size-only" ? 1.0 / n_r
                                                             : 1.0 / n;
      for (double weight : rank.weights) {
        // float64 gradients; the baseline's scale W/N is a float32 scalar made the recipe's
        // way, a reciprocal and then a product (number_over): two float32 roundings, at most
        // 2^-23 = 1.19e-7 relative (measured 1.013e-7 at W = 5, N = 244).
        RC_ASSERT(std::abs(weight - expected) <= 0x1p-23 * expected);
      }
    }
  }
}

// Skip agrees with the oracle exactly when every rank holds the same count (docs/design.md §1),
// measured on the probe model where per-token gradients cannot cancel.
inline void skip_passes_iff_ranks_are_balanced(const scenarios::Scenario& s) {
  bool balanced = true;
  for (const auto& row : s.valid_tokens) balanced = balanced && row == s.valid_tokens.front();
  RC_CLASSIFY(balanced, "balanced");
  scenarios::Scenario probe = s;
  probe.model = scenarios::ModelKind::token_probe;
  RC_ASSERT((judge_variant(probe, "skip").kind == VerdictKind::pass) == balanced);
}

// How many cases held a step to each check, and how many of those it failed: a property
// that judged a check on no case proved nothing about it, and says so. Counting stops at
// the first counter-example, so rapidcheck's shrinking runs are not counted as cases.
struct CheckTally {
  long cases = 0;
  bool found_counter_example = false;
  std::map<std::string, long> judged;  // by scenarios::kCheckNames
  std::map<std::string, long> failed;
  void count(const Judgement& judgement) { count(judgement.judged_checks(), judgement.disagreements()); }
  // The same from a judgement made elsewhere (fuzz --nproc: rank 0 of the case's processes).
  void count(const std::vector<std::string>& judged_checks, const std::vector<std::string>& disagreements) {
    if (found_counter_example) return;
    ++cases;
    for (const std::string& check : judged_checks) ++judged[check];
    for (const std::string& check : disagreements) ++failed[check];
    found_counter_example = !disagreements.empty();
  }
};

// "on 200 cases: steps 187, gradients 187, ..., logged-loss 16 (1 failed)", every check in
// kCheckNames order.
inline std::string describe(const CheckTally& tally) {
  std::string out = tally.found_counter_example
                        ? "on the " + std::to_string(tally.cases) + " cases up to the counter-example: "
                        : "on " + std::to_string(tally.cases) + " cases: ";
  bool first = true;
  for (std::string_view name : scenarios::kCheckNames) {
    const std::string check(name);
    const auto judged = tally.judged.find(check);
    const auto failed = tally.failed.find(check);
    if (!first) out += ", ";
    first = false;
    out += check + " " + std::to_string(judged == tally.judged.end() ? 0 : judged->second);
    if (failed != tally.failed.end()) out += " (" + std::to_string(failed->second) + " failed)";
  }
  if (const auto aborted = tally.failed.find("run"); aborted != tally.failed.end()) {
    out += ", the step's run aborted on " + std::to_string(aborted->second);
  }
  return out;
}

// Any step, built-in or a user's: it agrees with the oracle on every check its reference
// agrees on (Judgement::judged_checks). A check the reference itself fails (a documented
// weakness of the recipe, usually its NaN logged loss after an empty micro-batch) is not
// the step's fault and is not judged on that case; every other check still is. `tally`,
// when given, counts the cases that judged each check.
inline void agrees_where_reference_does(const std::string& variant, const scenarios::Scenario& s,
                                        CheckTally* tally = nullptr) {
  const Judgement judgement = judge_step(variant, s);
  if (tally) tally->count(judgement);
  RC_CLASSIFY(!judgement.reference_agrees(), "reference itself disagrees on some check");
  const std::vector<std::string> disagreements = judgement.disagreements();
  if (!disagreements.empty()) {
    RC_LOG() << explain(judgement);
    std::string checks;
    for (const std::string& check : disagreements) checks += (checks.empty() ? "" : ", ") + check;
    RC_FAIL(variant + " disagrees with the oracle on " + checks + ", where its reference agrees");
  }
}

}  // namespace gradnorm::oracles::properties
