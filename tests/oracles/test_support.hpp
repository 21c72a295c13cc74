#pragma once
// Small helpers shared by the oracle-level tests: run one catalogue scenario x variant and
// judge it, with messages that name the scenario, variant and figures.

#include <gtest/gtest.h>

#include <string>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/oracles/verdict.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm::testing_support {

struct Judged {
  harness::Observation observation;
  harness::Observation reference;
  oracles::OracleResult oracle;
  oracles::Verdict verdict;
};

inline Judged judge_named(const scenarios::Scenario& s, const std::string& variant_name) {
  const harness::VariantSpec& v = harness::find_variant(variant_name);
  Judged out;
  out.observation = harness::run_single_device(v, s);
  out.reference = harness::run_single_device(harness::find_variant(v.reference), s);
  out.oracle = oracles::run_oracle(s, harness::model_config_for(v, s));
  out.verdict = oracles::judge(s, out.observation, out.oracle, out.reference);
  return out;
}

inline Judged judge_named(const std::string& scenario, const std::string& variant_name) {
  return judge_named(scenarios::find_scenario(scenario), variant_name);
}

inline std::string explain(const oracles::Verdict& v) {
  std::string text = std::string(oracles::to_string(v.kind)) + " (" + v.outcome + ")";
  for (const std::string& reason : v.reasons) text += "; " + reason;
  return text;
}

inline ::testing::AssertionResult has_verdict(const Judged& j, oracles::VerdictKind kind) {
  if (j.verdict.kind == kind) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << j.observation.scenario << " x " << j.observation.variant << ": expected "
         << oracles::to_string(kind) << ", got " << explain(j.verdict);
}

inline bool any_reason_contains(const oracles::Verdict& v, const std::string& needle) {
  for (const std::string& reason : v.reasons) {
    if (reason.find(needle) != std::string::npos) return true;
  }
  return false;
}

}  // namespace gradnorm::testing_support
