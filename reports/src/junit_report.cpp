// JUnit XML as CI test reporters read it (Jenkins, GitLab, GitHub test-report actions):
// <testsuites><testsuite name tests failures skipped><testcase classname name> with
// <failure message type>text</failure> or <skipped message/>.
#include <fmt/format.h>

#include "format.hpp"
#include "gradnorm/reports/diff.hpp"

namespace gradnorm::reports {
namespace {

using nlohmann::json;

std::string xml(const std::string& text) { return detail::xml_escape(text); }

struct Case {
  std::string classname;
  std::string name;
  enum class Kind { passed, failed, skipped } kind = Kind::passed;
  std::string message;  // one line
  std::string text;     // the failure's body
};

std::string suite(const std::string& name, const std::vector<Case>& cases) {
  int failures = 0, skipped = 0;
  for (const Case& c : cases) {
    failures += c.kind == Case::Kind::failed;
    skipped += c.kind == Case::Kind::skipped;
  }
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format("<testsuites name=\"{0}\" tests=\"{1}\" failures=\"{2}\" errors=\"0\" skipped=\"{3}\">\n"
                     "  <testsuite name=\"{0}\" tests=\"{1}\" failures=\"{2}\" errors=\"0\" skipped=\"{3}\" time=\"0\">\n",
                     xml(name), cases.size(), failures, skipped);
  for (const Case& c : cases) {
    out += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"0\"", xml(c.classname), xml(c.name));
    switch (c.kind) {
      case Case::Kind::passed: out += "/>\n"; break;
      case Case::Kind::skipped:
        out += fmt::format(">\n      <skipped message=\"{}\"/>\n    </testcase>\n", xml(c.message));
        break;
      case Case::Kind::failed:
        out += fmt::format(">\n      <failure message=\"{}\" type=\"gradnorm\">{}</failure>\n    </testcase>\n",
                           xml(c.message), xml(c.text));
        break;
    }
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

std::string reasons_of(const json& record) {
  std::string out;
  if (record.contains("reasons") && record["reasons"].is_array()) {
    for (const json& r : record["reasons"]) {
      if (r.is_string()) out += r.get<std::string>() + "\n";
    }
  }
  return out;
}

}  // namespace

std::string render_junit(const json& report) {
  std::vector<Case> cases;
  for (const json& r : report.at("records")) {
    Case c{r.at("scenario").get<std::string>(), r.at("variant").get<std::string>(), Case::Kind::passed, "", ""};
    const std::string verdict = r.at("verdict").get<std::string>();
    const std::string expectation = r.at("expectation").get<std::string>();
    if (!r.at("met").get<bool>()) {
      c.kind = Case::Kind::failed;
      c.message = fmt::format("verdict {} where {} was expected", verdict, expectation);
      c.text = reasons_of(r);
    } else if (expectation == "n/a") {
      c.kind = Case::Kind::skipped;
      c.message = fmt::format("negative control whose bug cannot show here ({}): {}", verdict,
                              r.value("why", std::string()));
    }
    cases.push_back(std::move(c));
  }
  if (report.contains("left_out") && report["left_out"].is_array()) {
    for (const json& l : report["left_out"]) {
      cases.push_back(Case{l.value("scenario", std::string()), l.value("variant", std::string()),
                           Case::Kind::skipped, "the harness cannot run this pair: " + l.value("why", std::string()), ""});
    }
  }
  return suite("gradnorm", cases);
}

std::string render_diff_junit(const Diff& diff) {
  std::vector<Case> cases;
  for (const DiffRow& row : diff.rows) {
    Case c{row.scenario, row.variant, Case::Kind::passed, "", ""};
    if (row.change == Change::regression || row.change == Change::control_lost) {
      c.kind = Case::Kind::failed;
      c.message = fmt::format("{}: {}", to_string(row.change), row.detail);
      c.text = row.detail + "\nreproduce: " + reproduce_command(diff.reproduce_arguments, row.scenario, row.variant) + "\n";
      if (!row.head.is_null()) c.text += reasons_of(row.head);
    } else if (row.change == Change::removed) {
      c.kind = Case::Kind::skipped;
      c.message = "removed in head (base: " + row.detail + ")";
    }
    cases.push_back(std::move(c));
  }
  // A diff that fails with no row to blame (the head judged nothing, or nothing the base
  // did) fails one case of its own, so CI's test tab shows what its exit status says.
  if (diff.head_lost_every_row() || diff.head_shares_no_row()) {
    const std::string why = diff.head_lost_every_row()
                                ? fmt::format("the head judged nothing (every one of the base's {} rows was removed)", diff.base_rows)
                                : fmt::format("nothing compared (the head shares none of the base's {} rows)", diff.base_rows);
    cases.push_back(Case{"gradnorm diff", "compared rows", Case::Kind::failed, why, why + "\n"});
  }
  return suite("gradnorm diff", cases);
}

}  // namespace gradnorm::reports
