#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "format.hpp"
#include "gradnorm/reports/report.hpp"

namespace gradnorm::reports {

namespace {

// What a failing row's code printed, as pytest shows a failing test's captured output: its
// last kShownLines lines (a traceback's end, the warning before the failure).
constexpr std::size_t kShownLines = 20;
std::string captured_output(std::string_view text) {
  if (text.empty()) return {};
  std::vector<std::string_view> lines;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  const std::size_t shown = std::min(lines.size(), kShownLines);
  std::string out = shown == lines.size()
                        ? fmt::format("    its code printed ({} line{}):\n", lines.size(),
                                      lines.size() == 1 ? "" : "s")
                        : fmt::format("    its code printed ({} lines, the last {} here; --log PATH "
                                      "keeps them all):\n",
                                      lines.size(), shown);
  for (std::size_t i = lines.size() - shown; i < lines.size(); ++i) out += fmt::format("      | {}\n", lines[i]);
  return out;
}

}  // namespace

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
    out += captured_output(row.output);
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
