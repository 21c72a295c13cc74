#include "gradnorm/oracles/judgement.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "gradnorm/harness/runner.hpp"

namespace gradnorm::oracles {
namespace {

bool agreed(const EvaluationRow& row) {
  return !row.fault && (row.verdict.kind == VerdictKind::pass ||
                        row.verdict.kind == VerdictKind::expected_error);
}

}  // namespace

bool Judgement::agrees() const { return agreed(row); }
bool Judgement::reference_agrees() const { return reference_row ? agreed(*reference_row) : agrees(); }

namespace {

bool failed(const EvaluationRow& row, std::string_view check) {
  const auto& checks = row.verdict.failed_checks;
  return std::find(checks.begin(), checks.end(), check) != checks.end();
}

bool measurable(const EvaluationRow& step, std::string_view check) {
  if (check == "error-behaviour") return true;
  if (check == "ranks-agree") return step.world_size > 1;
  // The numbers: compared with the oracle only where a gradient exists and the step ran to
  // its end without raising (verdict.cpp returns before judge_numbers otherwise).
  const bool numbers = step.global_token_count > 0 && !step.fault && !step.observation.error;
  if (check == "grad-norm") return numbers && step.scenario.clip_max_norm.has_value();
  return numbers;
}

}  // namespace

std::vector<std::string> Judgement::judged_checks() const {
  std::vector<std::string> out;
  if (reference_row && (reference_row->fault || failed(*reference_row, "run"))) return out;
  for (std::string_view check : scenarios::kCheckNames) {
    if (reference_row && failed(*reference_row, check)) continue;
    if (measurable(row, check)) out.emplace_back(check);
  }
  return out;
}

std::vector<std::string> Judgement::disagreements() const {
  const std::vector<std::string> judged = judged_checks();
  if (reference_row && (reference_row->fault || failed(*reference_row, "run"))) return {};
  std::vector<std::string> out;
  if (row.fault || failed(row, "run")) out.emplace_back("run");
  for (const std::string& check : judged) {
    if (failed(row, check)) out.push_back(check);
  }
  return out;
}

Judgement judge_step(const std::string& variant, const scenarios::Scenario& scenario) {
  const harness::VariantSpec& spec = harness::find_variant(variant);
  if (auto why = harness::not_applicable(spec, scenario)) {
    throw scenarios::InvalidInput(fmt::format("variant '{}' cannot run scenario '{}': {}", variant,
                                              scenario.name, *why));
  }
  std::vector<harness::VariantSpec> pair{spec};
  if (spec.reference != spec.name) pair.insert(pair.begin(), harness::find_variant(spec.reference));
  // Findings document a built-in recipe's known failures; a user's step is judged plainly.
  Evaluation evaluation = evaluate({scenario}, pair, EvaluateOptions{.use_documented_findings = false});
  if (evaluation.rows.size() != pair.size()) {
    throw std::runtime_error(fmt::format("judging '{}' on '{}' stopped early: {}", variant,
                                         scenario.name, evaluation.fault.value_or("no reason")));
  }
  Judgement out;
  out.row = std::move(evaluation.rows.back());
  if (pair.size() == 2) out.reference_row = std::move(evaluation.rows.front());
  return out;
}

std::string explain_weights(const TokenWeightReport& report) {
  if (report.outcome != "ok") return fmt::format("per-token weights: {}\n", report.outcome);
  std::string out = fmt::format("per-token weights (token-probe model), contract 1/N = {:.6g}:\n",
                                report.expected_weight);
  for (const RankTokenWeights& rank : report.ranks) {
    if (rank.weights.empty()) {
      out += fmt::format("  rank {}: no valid token\n", rank.rank);
      continue;
    }
    const auto [low, high] = std::minmax_element(rank.weights.begin(), rank.weights.end());
    const std::string range = *low == *high ? fmt::format("{:.6g}", *low)
                                            : fmt::format("{:.6g} .. {:.6g}", *low, *high);
    out += fmt::format("  rank {}: {} tokens, weight {} ({:.4g} x 1/N)\n", rank.rank, rank.tokens,
                       range, *high / report.expected_weight);
  }
  out += fmt::format("  weights rel L2 error {:.4g}\n", report.rel_l2_error);
  return out;
}

std::string explain(const Judgement& j, bool probe_weights) {
  const EvaluationRow& row = j.row;
  const Verdict& v = row.verdict;
  std::string out = fmt::format("step '{}' on {}\n", row.variant.name, scenarios::describe(row.scenario));
  out += fmt::format("verdict {} (outcome: {})\n", to_string(v.kind), v.outcome);
  if (row.fault) out += fmt::format("run aborted: {}\n", *row.fault);
  for (const std::string& reason : v.reasons) out += "  " + reason + "\n";
  if (v.kind == VerdictKind::fail) {
    out += fmt::format("gradients: rel L2 error {:.3g}, max {} ULP; worst element {}\n",
                       v.gradients.rel_l2_error, v.gradients.max_ulp, v.gradients.worst);
  }
  if (j.reference_row) {
    out += fmt::format("its reference '{}': {}\n", j.reference_row->variant.name,
                       to_string(j.reference_row->verdict.kind));
  }
  if (probe_weights && row.global_token_count > 0) {
    try {
      out += explain_weights(probe_token_weights(row.scenario, row.variant));
    } catch (const std::exception& error) {
      out += fmt::format("per-token weights could not be read: {}\n", error.what());
    }
  }
  return out;
}

}  // namespace gradnorm::oracles
