#include <set>

#include "gradnorm/reports/report.hpp"

namespace gradnorm::reports {

void count_row(Summary& s, const oracles::EvaluationRow& row) {
  ++s.rows;
  switch (row.verdict.kind) {
    case oracles::VerdictKind::pass: ++s.passed; break;
    case oracles::VerdictKind::fail: ++s.failed; break;
    case oracles::VerdictKind::expected_error: ++s.expected_errors; break;
    case oracles::VerdictKind::error_mismatch: ++s.error_mismatches; break;
  }
  if (!row.met) ++s.unmet;
  if (row.expectation == oracles::Expectation::flag) {
    ++s.controls_visible;
    if (row.met) ++s.controls_caught;
  }
  if (row.expectation == oracles::Expectation::finding && row.met) ++s.findings;
}

std::vector<std::pair<std::string, std::string>> framework_code(const oracles::Evaluation& evaluation) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    if (!row.variant.runs.empty() && seen.insert(row.variant.name).second) {
      out.emplace_back(row.variant.name, row.variant.runs);
    }
  }
  return out;
}

Summary summarize(const oracles::Evaluation& evaluation) {
  Summary s;
  for (const oracles::EvaluationRow& row : evaluation.rows) count_row(s, row);
  return s;
}

}  // namespace gradnorm::reports
