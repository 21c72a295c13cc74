#include <fmt/format.h>

#include <map>

#include "format.hpp"
#include "gradnorm/reports/report.hpp"

namespace gradnorm::reports {

// A pull-request comment: the summary first, then what a reviewer must read (unexpected
// rows, documented findings, caught controls), then the full matrix folded away.
std::string render_markdown(const oracles::Evaluation& evaluation,
                            const harness::RunSettings& settings) {
  using detail::sci;
  const Summary s = summarize(evaluation);
  std::string out = "## gradnorm: loss and gradient normalisation check\n\n";
  out += fmt::format("**{}** — {} rows: {} pass, {} fail, {} expected-error, {} error-mismatch. "
                     "Negative controls caught {}/{}. Documented findings reproduced: {}.\n\n",
                     s.unmet == 0 ? "As expected" : fmt::format("{} unexpected", s.unmet), s.rows,
                     s.passed, s.failed, s.expected_errors, s.error_mismatches, s.controls_caught,
                     s.controls_visible, s.findings);
  out += fmt::format("LibTorch {}, ranks as {}, {} intra-op thread(s), deterministic algorithms {}.\n\n",
                     settings.torch_version, settings.transport, settings.intra_op_threads,
                     settings.deterministic_algorithms ? "on" : "off");
  auto section = [&](std::string title, auto predicate) {
    std::string body;
    for (const oracles::EvaluationRow& row : evaluation.rows) {
      if (!predicate(row)) continue;
      std::string why = row.verdict.reasons.empty() ? row.verdict.outcome : row.verdict.reasons.front();
      if (!row.applicability.empty()) why += " (" + row.applicability + ")";
      body += fmt::format("| `{}` | `{}` | {} | {} |\n", row.scenario.name, row.variant.name,
                          oracles::to_string(row.verdict.kind), why);
    }
    if (body.empty()) return;
    out += fmt::format("### {}\n\n| scenario | variant | verdict | detail |\n|---|---|---|---|\n{}\n",
                       title, body);
  };
  section("Unexpected", [](const auto& row) { return !row.met; });
  section("Documented findings",
          [](const auto& row) { return row.met && row.expectation == oracles::Expectation::finding; });

  out += "<details><summary>Full matrix</summary>\n\n"
         "| scenario | variant | N | verdict | expect | grad rel L2 | max ULP | loss rel | "
         "norm rel | bits = reference |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    const bool numbers = row.verdict.kind == oracles::VerdictKind::pass ||
                         row.verdict.kind == oracles::VerdictKind::fail;
    out += fmt::format("| `{}` | `{}` | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                       row.scenario.name, row.variant.name, row.global_token_count,
                       oracles::to_string(row.verdict.kind), oracles::to_string(row.expectation),
                       numbers ? sci(row.verdict.gradients.rel_l2_error) : "-",
                       numbers ? detail::ulps(row.verdict.gradients.max_ulp) : "-",
                       sci(row.verdict.logged_loss_rel_error), sci(row.verdict.grad_norm_rel_error),
                       row.variant.name == row.variant.reference ? "self"
                       : row.against_reference.bitwise_equal     ? "yes"
                                                                 : "no");
  }
  out += "\n</details>\n";
  return out;
}

}  // namespace gradnorm::reports
