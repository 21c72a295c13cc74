#include <fmt/format.h>

#include "format.hpp"
#include "gradnorm/reports/report.hpp"

namespace gradnorm::reports {

std::string render_table(const oracles::Evaluation& evaluation) {
  using detail::sci;
  std::string out = fmt::format("{:<36} {:<31} {:>3} {:<14} {:<7} {:>9} {:>9} {:>9} {:>9} {:>5}  {}\n",
                                "scenario", "variant", "N", "verdict", "expect", "grad-rel",
                                "max-ulp", "loss-rel", "norm-rel", "=ref", "status");
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    const bool numbers = row.verdict.kind == oracles::VerdictKind::pass ||
                         row.verdict.kind == oracles::VerdictKind::fail;
    std::string status = row.met ? "ok" : "UNEXPECTED";
    if (row.expectation == oracles::Expectation::flag && row.met) status = "caught";
    if (row.expectation == oracles::Expectation::finding && row.met) status = "known finding";
    out += fmt::format(
        "{:<36} {:<31} {:>3} {:<14} {:<7} {:>9} {:>9} {:>9} {:>9} {:>5}  {}\n", row.scenario.name,
        row.variant.name, row.global_token_count, oracles::to_string(row.verdict.kind),
        oracles::to_string(row.expectation),
        numbers ? sci(row.verdict.gradients.rel_l2_error) : "-",
        numbers ? detail::ulps(row.verdict.gradients.max_ulp) : "-",
        sci(row.verdict.logged_loss_rel_error), sci(row.verdict.grad_norm_rel_error),
        row.variant.name == row.variant.reference ? "self"
        : row.against_reference.bitwise_equal     ? "yes"
                                                  : "no",
        status);
  }
  bool header = false;
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    if (row.met) continue;
    if (!header) out += "\nUnexpected results:\n";
    header = true;
    out += fmt::format("  {} x {} (expected {}): {}\n", row.scenario.name, row.variant.name,
                       oracles::to_string(row.expectation), oracles::to_string(row.verdict.kind));
    for (const std::string& reason : row.verdict.reasons) out += fmt::format("    - {}\n", reason);
    if (row.verdict.reasons.empty()) out += fmt::format("    - outcome: {}\n", row.verdict.outcome);
  }
  std::string judged;  // which framework code ran, and its version
  for (const auto& [name, runs] : framework_code(evaluation)) {
    judged += fmt::format("{} is {}, unmodified\n", name, runs);
  }
  if (!judged.empty()) out += "\n" + judged;
  const Summary s = summarize(evaluation);
  out += fmt::format(
      "\n{} rows: {} pass, {} fail, {} expected-error, {} error-mismatch; negative controls "
      "caught {}/{}; documented findings reproduced {}; unexpected {}\n",
      s.rows, s.passed, s.failed, s.expected_errors, s.error_mismatches, s.controls_caught,
      s.controls_visible, s.findings, s.unmet);
  return out;
}

}  // namespace gradnorm::reports
