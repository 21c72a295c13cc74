#include <fmt/format.h>

#include <map>

#include "format.hpp"
#include "gradnorm/reports/diff.hpp"
#include "gradnorm/reports/report.hpp"

namespace gradnorm::reports {

// A pull-request comment: the summary first, then what a reviewer must read (unexpected
// rows), then the documented findings and negative controls grouped, one line per reason
// or variant. It fits one comment (kCommentLimit) whatever the matrix: rows that do not
// fit are counted and left to the JSON report, which holds every figure.
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
  std::string judged;  // which framework code ran, and its version
  for (const auto& [name, runs] : framework_code(evaluation)) {
    judged += fmt::format("- `{}` is {}, unmodified\n", detail::markdown_cell(name), detail::markdown_cell(runs));
  }
  if (!judged.empty()) out += judged + "\n";
  const std::string closing =
      "\nEvery row's figures (errors against the oracle, ULP distances, digests, reasons) are "
      "in the JSON report (`--json`) and the JUnit file (`--junit`).\n";
  const std::size_t budget = kCommentLimit - closing.size() - 512;
  detail::Budget writer(out, budget);
  auto add = [&writer](const std::string& text) { return writer.add(text); };

  // Unexpected rows, each with its first reason: what a reviewer must read.
  std::string unexpected;
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    if (row.met) continue;
    std::string why = row.verdict.reasons.empty() ? row.verdict.outcome : row.verdict.reasons.front();
    if (!row.applicability.empty()) why += " (" + row.applicability + ")";
    if (unexpected.empty()) {
      add(fmt::format("### Unexpected ({})\n\n| scenario | variant | verdict | expected | detail |\n|---|---|---|---|---|\n",
                      s.unmet));
      unexpected = "open";
    }
    add(fmt::format("| `{}` | `{}` | {} | {} | {} |\n", detail::markdown_cell(row.scenario.name), detail::markdown_cell(row.variant.name),
                    oracles::to_string(row.verdict.kind), oracles::to_string(row.expectation), detail::markdown_cell(why)));
  }
  if (!unexpected.empty()) out += "\n";

  // Documented findings, grouped by variant and documented reason: the reason once, with
  // how many rows reproduce it and the first few scenarios.
  struct Group {
    std::string verdict;
    std::vector<std::string> scenarios;
  };
  std::map<std::pair<std::string, std::string>, Group> findings;
  std::vector<std::pair<std::string, std::string>> order;
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    if (!row.met || row.expectation != oracles::Expectation::finding) continue;
    const auto key = std::make_pair(row.variant.name, row.applicability);
    auto [it, inserted] = findings.try_emplace(key, Group{std::string(oracles::to_string(row.verdict.kind)), {}});
    if (inserted) order.push_back(key);
    it->second.scenarios.push_back(row.scenario.name);
  }
  if (!order.empty()) {
    out += fmt::format("<details><summary>Documented findings reproduced: {} row{} in {} group{}</summary>\n\n"
                       "| variant | rows | verdict | documented reason | scenarios |\n|---|---|---|---|---|\n",
                       s.findings, s.findings == 1 ? "" : "s", order.size(), order.size() == 1 ? "" : "s");
    for (const auto& key : order) {
      const Group& g = findings.at(key);
      std::string names;
      for (std::size_t i = 0; i < g.scenarios.size() && i < 3; ++i) {
        names += (i ? ", `" : "`") + detail::markdown_cell(g.scenarios[i]) + "`";
      }
      if (g.scenarios.size() > 3) names += fmt::format(" and {} more", g.scenarios.size() - 3);
      add(fmt::format("| `{}` | {} | {} | {} | {} |\n", detail::markdown_cell(key.first), g.scenarios.size(), g.verdict,
                      detail::markdown_cell(key.second), names));
    }
    out += "\n</details>\n\n";
  }

  // Per variant: the verdict tally and, for negative controls, how many were caught.
  std::map<std::string, Summary> tallies;
  std::vector<std::string> variants;
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    auto [it, inserted] = tallies.try_emplace(row.variant.name);
    if (inserted) variants.push_back(row.variant.name);
    count_row(it->second, row);
  }
  out += "<details><summary>Per variant</summary>\n\n"
         "| variant | rows | pass | fail | expected-error | error-mismatch | controls caught | unexpected |\n"
         "|---|---|---|---|---|---|---|---|\n";
  for (const std::string& name : variants) {
    const Summary& t = tallies.at(name);
    add(fmt::format("| `{}` | {} | {} | {} | {} | {} | {} | {} |\n", detail::markdown_cell(name), t.rows, t.passed,
                    t.failed, t.expected_errors, t.error_mismatches,
                    t.controls_visible ? fmt::format("{}/{}", t.controls_caught, t.controls_visible) : std::string("-"),
                    t.unmet));
  }
  out += "\n</details>\n";
  if (const std::size_t left_out = writer.left_out(); left_out > 0) {
    out += fmt::format("\n{} more lines left out to fit one pull-request comment.\n", left_out);
  }
  out += closing;
  return out;
}

}  // namespace gradnorm::reports
