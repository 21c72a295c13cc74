#include "gradnorm/reports/diff.hpp"
#include "gradnorm/scenarios/files.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "format.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::reports {
namespace {

using nlohmann::json;

constexpr std::array kChanges{Change::regression, Change::control_lost,   Change::finding_lost,
                              Change::still_unexpected, Change::fixed,    Change::verdict_changed,
                              Change::drift,        Change::bits_changed, Change::added,
                              Change::removed,      Change::unchanged};

// The checks every report must pass before its rows are read; `which` names it ("base").
void check_report(const json& report, const std::string& which) {
  auto bad = [&which](const std::string& why) {
    return scenarios::InvalidInput(fmt::format("{} report: {}", which, why));
  };
  if (!report.is_object() || report.value("tool", "") != "gradnorm") {
    throw bad("not a gradnorm report (no \"tool\": \"gradnorm\"); write one with gradnorm run --json");
  }
  if (!report.contains("schema") || !report["schema"].is_number_integer()) {
    throw bad("has no integer \"schema\" version");
  }
  if (!report.contains("records") || !report["records"].is_array()) {
    throw bad("has no \"records\" array");
  }
  std::size_t index = 0;
  for (const json& r : report["records"]) {
    if (!r.is_object() || !r.contains("scenario") || !r["scenario"].is_string() ||
        !r.contains("variant") || !r["variant"].is_string() || !r.contains("verdict") ||
        !r["verdict"].is_string() || !r.contains("met") || !r["met"].is_boolean() ||
        !r.contains("expectation") || !r["expectation"].is_string()) {
      throw bad(fmt::format("record {} lacks scenario, variant, verdict, expectation or met", index));
    }
    ++index;
  }
}

std::string key_of(const json& record) {
  return record["scenario"].get<std::string>() + '\n' + record["variant"].get<std::string>();
}

// A number field, or nullopt when it is null, absent or not a number ("max" ULPs read as the
// largest value).
std::optional<double> number_at(const json& record, const char* field) {
  if (!record.contains(field)) return std::nullopt;
  const json& v = record[field];
  if (v.is_number()) return v.get<double>();
  if (v.is_string() && v.get<std::string>() == "max") return std::numeric_limits<double>::infinity();
  return std::nullopt;
}

std::string ulp_text(const std::optional<double>& v) {
  if (!v) return "-";
  if (std::isinf(*v)) return "max";
  return fmt::format("{:.0f}", *v);
}

std::string first_reason(const json& record) {
  if (record.contains("reasons") && record["reasons"].is_array() && !record["reasons"].empty() &&
      record["reasons"][0].is_string()) {
    return record["reasons"][0].get<std::string>();
  }
  return "";
}

std::string verdict_line(const json& record) {
  std::string out = record["verdict"].get<std::string>();
  if (const auto rel = number_at(record, "rel_l2_error")) out += ", grad rel L2 " + detail::sci(*rel);
  return out;
}

// Classifies one matched row.
DiffRow compare(const json& base, const json& head, const DiffOptions& options) {
  DiffRow row{head["scenario"], head["variant"], Change::unchanged, "", base, head};
  const bool base_met = base["met"].get<bool>();
  const bool head_met = head["met"].get<bool>();
  const std::string expectation = head["expectation"].get<std::string>();
  const std::string base_verdict = base["verdict"].get<std::string>();
  const std::string head_verdict = head["verdict"].get<std::string>();
  const std::string reason = first_reason(head);
  const std::string transition = fmt::format("{} -> {}", verdict_line(base), verdict_line(head));
  if (base_met && !head_met) {
    row.change = expectation == "flag"      ? Change::control_lost
                 : expectation == "finding" ? Change::finding_lost
                                            : Change::regression;
    row.detail = reason.empty() ? transition : fmt::format("{}: {}", transition, reason);
    return row;
  }
  if (!base_met && !head_met) {
    row.change = Change::still_unexpected;
    row.detail = reason.empty() ? transition : fmt::format("{}: {}", transition, reason);
    return row;
  }
  if (!base_met && head_met) {
    row.change = Change::fixed;
    row.detail = transition;
    return row;
  }
  if (base_verdict != head_verdict) {
    row.change = Change::verdict_changed;
    row.detail = transition;
    return row;
  }
  if (head_verdict == "pass") {
    const auto base_ulp = number_at(base, "max_ulp");
    const auto head_ulp = number_at(head, "max_ulp");
    const auto base_rel = number_at(base, "rel_l2_error");
    const auto head_rel = number_at(head, "rel_l2_error");
    double tolerance = 0;
    if (head.contains("tolerance") && head["tolerance"].is_object()) {
      tolerance = head["tolerance"].value("tensor_rel_l2", 0.0);
    }
    const bool ulp_drift = base_ulp && head_ulp && *head_ulp - *base_ulp > static_cast<double>(options.drift_ulp);
    const bool rel_drift = base_rel && head_rel && *head_rel > options.drift_factor * *base_rel &&
                           *head_rel >= options.drift_floor * tolerance;
    if (ulp_drift || rel_drift) {
      row.change = Change::drift;
      row.detail = fmt::format("grad rel L2 {} -> {} (tolerance {}), max ULP {} -> {}",
                               base_rel ? detail::sci(*base_rel) : "-", head_rel ? detail::sci(*head_rel) : "-",
                               detail::sci(tolerance), ulp_text(base_ulp), ulp_text(head_ulp));
      return row;
    }
  }
  if (base.value("observation_digest", "") != head.value("observation_digest", "")) {
    row.change = Change::bits_changed;
    row.detail = fmt::format("{}; observation digest {} -> {}", head_verdict,
                             base.value("observation_digest", "-"), head.value("observation_digest", "-"));
  }
  return row;
}

std::string shell_quote(const std::string& word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
  });
  if (plain) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}


std::string title_of(Change change) {
  switch (change) {
    case Change::regression: return "Regressions";
    case Change::control_lost: return "Negative controls no longer caught";
    case Change::finding_lost: return "Documented findings that no longer reproduce";
    case Change::still_unexpected: return "Unexpected in base and head";
    case Change::fixed: return "Fixed";
    case Change::verdict_changed: return "Verdicts changed (as expected in both)";
    case Change::drift: return "Drift within tolerance";
    case Change::bits_changed: return "Same verdict, other bits";
    case Change::added: return "Added rows";
    case Change::removed: return "Removed rows";
    case Change::unchanged: return "Unchanged";
  }
  return "";
}

}  // namespace

std::string_view to_string(Change change) {
  switch (change) {
    case Change::regression: return "regression";
    case Change::control_lost: return "control-lost";
    case Change::finding_lost: return "finding-lost";
    case Change::still_unexpected: return "still-unexpected";
    case Change::fixed: return "fixed";
    case Change::verdict_changed: return "verdict-changed";
    case Change::drift: return "drift";
    case Change::bits_changed: return "bits-changed";
    case Change::added: return "added";
    case Change::removed: return "removed";
    case Change::unchanged: return "unchanged";
  }
  return "<unknown>";
}

int Diff::count(Change change) const {
  return static_cast<int>(std::count_if(rows.begin(), rows.end(), [change](const DiffRow& r) { return r.change == change; }));
}

bool Diff::head_shares_no_row() const {
  return base_rows > 0 && head_rows > 0 && std::none_of(rows.begin(), rows.end(), [](const DiffRow& row) {
           return !row.base.is_null() && !row.head.is_null();
         });
}

bool Diff::has_regression() const {
  return count(Change::regression) > 0 || count(Change::control_lost) > 0 || head_lost_every_row() ||
         head_shares_no_row();
}

std::vector<std::string> report_contradictions(const json& report) {
  std::vector<std::string> found;
  if (!report.is_object() || !report.contains("records") || !report["records"].is_array()) return found;
  const json& records = report["records"];
  std::map<std::string, int> seen;
  std::map<std::string, long> verdicts;
  long unexpected = 0;
  for (const json& r : records) {
    if (!r.is_object()) continue;
    if (r.contains("scenario") && r["scenario"].is_string() && r.contains("variant") && r["variant"].is_string()) {
      if (++seen[key_of(r)] == 2) {
        found.push_back(fmt::format("row ({}, {}) appears more than once", r["scenario"].get<std::string>(),
                                    r["variant"].get<std::string>()));
      }
    }
    if (r.contains("verdict") && r["verdict"].is_string()) ++verdicts[r["verdict"].get<std::string>()];
    if (r.contains("met") && r["met"].is_boolean() && !r["met"].get<bool>()) ++unexpected;
  }
  if (!report.contains("summary") || !report["summary"].is_object()) return found;
  const json& summary = report["summary"];
  const std::pair<const char*, long> counts[] = {
      {"rows", static_cast<long>(records.size())}, {"pass", verdicts["pass"]},
      {"fail", verdicts["fail"]}, {"expected_error", verdicts["expected-error"]},
      {"error_mismatch", verdicts["error-mismatch"]}, {"unexpected", unexpected}};
  for (const auto& [field, actual] : counts) {
    if (summary.contains(field) && summary[field].is_number_integer() && summary[field].get<long>() != actual) {
      found.push_back(fmt::format("summary.{} is {}, but the records hold {}", field,
                                  summary[field].get<long>(), actual));
    }
  }
  return found;
}

json read_json_report(const std::string& path) {
  // 1 GiB bounds what one report may make gradnorm hold in memory (a folder, a device or a
  // FIFO is refused before it is opened).
  constexpr std::uintmax_t kMaxReportBytes = std::uintmax_t{1} << 30;
  const std::string text = scenarios::read_regular_file(path, kMaxReportBytes, "report");
  // nlohmann keeps the last of two equal keys; a report with one twice is refused instead.
  std::vector<std::set<std::string>> keys;
  std::string twice;
  // A report nests 5 levels; copying a record nested 100,000 deep overflowed the stack (diff
  // copies the rows it compares, recursively). Deeper than 64 is refused.
  constexpr int kMaxDepth = 64;
  bool too_deep = false;
  const json::parser_callback_t unique_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth >= kMaxDepth && (event == json::parse_event_t::object_start ||
                               event == json::parse_event_t::array_start)) {
      too_deep = true;
    }
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        twice.empty()) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  try {
    json parsed = json::parse(text, unique_keys);
    if (too_deep) {
      throw scenarios::InvalidInput(fmt::format("'{}' nests objects or arrays more than {} levels "
                                                "deep: not a gradnorm report (one nests 5)",
                                                path, kMaxDepth));
    }
    if (!twice.empty()) {
      throw scenarios::InvalidInput(fmt::format("'{}' has the key \"{}\" twice in one object", path, twice));
    }
    return parsed;
  } catch (const json::parse_error& error) {
    throw scenarios::InvalidInput(fmt::format("'{}' is not JSON: {}", path, error.what()));
  } catch (const json::exception& error) {
    // A number beyond a double (1e999) is out_of_range, not a parse error: still the file's.
    throw scenarios::InvalidInput(fmt::format("'{}' cannot be read: {}", path, error.what()));
  }
}

Diff diff_reports(const json& base, const json& head, const DiffOptions& options) {
  check_report(base, "base");
  check_report(head, "head");
  if (base["schema"] != head["schema"]) {
    throw scenarios::InvalidInput(fmt::format(
        "the reports have different schema versions (base {}, head {}): write both with the "
        "same gradnorm version, or re-run the base",
        base["schema"].dump(), head["schema"].dump()));
  }
  Diff diff;
  diff.base_rows = static_cast<int>(base["records"].size());
  diff.head_rows = static_cast<int>(head["records"].size());
  std::map<std::string, const json*> base_by_key;
  for (const json& r : base["records"]) {
    if (!base_by_key.emplace(key_of(r), &r).second) {
      throw scenarios::InvalidInput(fmt::format("base report: row ({}, {}) appears twice",
                                                r["scenario"].get<std::string>(), r["variant"].get<std::string>()));
    }
  }
  std::map<std::string, bool> seen;
  for (const json& r : head["records"]) {
    const std::string key = key_of(r);
    if (!seen.emplace(key, true).second) {
      throw scenarios::InvalidInput(fmt::format("head report: row ({}, {}) appears twice",
                                                r["scenario"].get<std::string>(), r["variant"].get<std::string>()));
    }
    const auto found = base_by_key.find(key);
    if (found == base_by_key.end()) {
      DiffRow row{r["scenario"], r["variant"], Change::added, verdict_line(r), nullptr, r};
      if (!r["met"].get<bool>()) {
        // A new row that is not as expected is a regression the base never had.
        row.change = Change::regression;
        row.detail = fmt::format("new row: {}{}", verdict_line(r),
                                 first_reason(r).empty() ? "" : ": " + first_reason(r));
      }
      diff.rows.push_back(std::move(row));
      continue;
    }
    diff.rows.push_back(compare(*found->second, r, options));
  }
  for (const json& r : base["records"]) {
    if (seen.count(key_of(r))) continue;
    diff.rows.push_back(DiffRow{r["scenario"], r["variant"], Change::removed, verdict_line(r), r, nullptr});
  }
  if (head.contains("variants") && head["variants"].is_object()) {
    for (const auto& [name, text] : head["variants"].items()) {
      if (!text.is_string() || text.get<std::string>().find(", unmodified") == std::string::npos) continue;
      std::string base_text;
      if (base.contains("variants") && base["variants"].is_object() && base["variants"].contains(name) &&
          base["variants"][name].is_string() && base["variants"][name] != text) {
        base_text = base["variants"][name].get<std::string>();
      }
      diff.judged.push_back({name, text.get<std::string>(), base_text});
    }
  }
  if (head.contains("run") && head["run"].is_object() && head["run"].contains("reproduce_arguments") &&
      head["run"]["reproduce_arguments"].is_array()) {
    for (const json& a : head["run"]["reproduce_arguments"]) {
      if (a.is_string()) diff.reproduce_arguments.push_back(a.get<std::string>());
    }
  }
  return diff;
}

std::string reproduce_command(const std::vector<std::string>& arguments, const std::string& scenario,
                              const std::string& variant) {
  std::string out = "gradnorm run";
  for (const std::string& a : arguments) out += " " + shell_quote(a);
  // A pattern argument: glob characters in a name are escaped so it selects that row alone.
  auto exact = [](const std::string& name) {
    std::string escaped;
    for (char c : name) {
      if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') escaped += '\\';
      escaped += c;
    }
    return escaped;
  };
  out += " -s " + shell_quote(exact(scenario)) + " -v " + shell_quote(exact(variant));
  return out;
}

std::string render_diff_markdown(const Diff& diff) {
  const int regressions = diff.count(Change::regression) + diff.count(Change::control_lost);
  std::string headline;
  if (diff.head_lost_every_row()) {
    headline = fmt::format("**gradnorm: the head judged nothing (every one of the base's {} rows was removed)**",
                           diff.base_rows);
  } else if (diff.head_shares_no_row()) {
    headline = fmt::format("**gradnorm: nothing compared (the head shares none of the base's {} rows)**",
                           diff.base_rows);
  } else if (regressions > 0) {
    headline = fmt::format("**gradnorm: {} regression{}**", regressions, regressions == 1 ? "" : "s");
  } else {
    headline = "**gradnorm: no regression**";
  }
  std::vector<std::string> counts;
  for (Change c : kChanges) {
    if (c == Change::unchanged || c == Change::regression) continue;
    if (const int n = diff.count(c)) counts.push_back(fmt::format("{} {}", n, to_string(c)));
  }
  counts.push_back(fmt::format("{} unchanged", diff.count(Change::unchanged)));
  std::string out = fmt::format("## {} — base {} rows, head {} rows: {}\n\n", headline, diff.base_rows,
                                diff.head_rows, fmt::join(counts, ", "));
  for (const Diff::Judged& judged : diff.judged) {
    out += fmt::format("Judged: `{}`: {}{}\n", detail::markdown_cell(judged.variant), detail::markdown_cell(judged.head),
                       judged.base.empty() ? "" : fmt::format(" (base: {})", detail::markdown_cell(judged.base)));
  }
  if (!diff.judged.empty()) out += "\n";
  // What must fit after the tables: the closing line.
  const std::string closing =
      "\nRows are matched by (scenario, variant); the JSON reports hold every figure.\n";
  const std::size_t budget = kCommentLimit - closing.size() - 256;
  detail::Budget writer(out, budget);
  auto add = [&writer](const std::string& text) { return writer.add(text); };
  // The short table: every row that is not unchanged, most serious first, the reproduce
  // command for regressions; bits-only changes and drift folded into their own sections.
  bool any_table = false;
  for (Change c : kChanges) {
    if (c == Change::unchanged) continue;
    const bool folded = c == Change::bits_changed || c == Change::drift || c == Change::added ||
                        c == Change::removed || c == Change::still_unexpected;
    std::string header = folded ? fmt::format("<details><summary>{} ({})</summary>\n\n", title_of(c), diff.count(c))
                                : fmt::format("### {} ({})\n\n", title_of(c), diff.count(c));
    header += "| scenario | variant | what changed |\n|---|---|---|\n";
    bool opened = false;
    for (const DiffRow& row : diff.rows) {
      if (row.change != c) continue;
      if (!opened) {
        if (!add(header)) break;
        opened = true;
        any_table = true;
      }
      std::string line = fmt::format("| `{}` | `{}` | {} |\n", detail::markdown_cell(row.scenario), detail::markdown_cell(row.variant), detail::markdown_cell(row.detail));
      if (c == Change::regression || c == Change::control_lost) {
        line += fmt::format("| | | reproduce: `{}` |\n",
                            detail::markdown_cell(reproduce_command(diff.reproduce_arguments, row.scenario, row.variant)));
      }
      add(line);
    }
    if (opened) out += folded ? "\n</details>\n\n" : "\n";  // the reserve keeps room for it
  }
  if (!any_table) out += "Every row has the same verdict and the same bits in base and head.\n";
  if (const std::size_t left_out = writer.left_out(); left_out > 0) {
    out += fmt::format("\n{} more lines left out to fit one pull-request comment; see the JSON reports.\n", left_out);
  }
  out += closing;
  return out;
}

}  // namespace gradnorm::reports
