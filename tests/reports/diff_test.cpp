// gradnorm diff on reports built by hand: every change class, its negative (an unchanged
// row stays unchanged), bad input, the comment's size cap, the reproduce command's quoting,
// and the JUnit files' shape.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "gradnorm/reports/diff.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm {
namespace {

using nlohmann::json;
using reports::Change;

json record(const std::string& scenario, const std::string& variant, const std::string& verdict,
            bool met, const std::string& expectation = "agree", double rel = 1e-7, json ulp = 10,
            const std::string& digest = "00000000000000aa") {
  return {{"scenario", scenario},   {"variant", variant},
          {"verdict", verdict},     {"met", met},
          {"expectation", expectation}, {"rel_l2_error", rel},
          {"max_ulp", ulp},         {"observation_digest", digest},
          {"reasons", json::array({"step 0: gradients rel L2 error 0.5 > 1e-05"})},
          {"tolerance", {{"tensor_rel_l2", 1e-5}, {"scalar_rel", 1e-5}}}};
}

json report(json records) {
  return {{"schema", 1}, {"tool", "gradnorm"}, {"records", std::move(records)},
          {"run", {{"reproduce_arguments", json::array({"-f", "my scenarios.toml"})}}}};
}

Change change_of(const reports::Diff& diff, const std::string& scenario, const std::string& variant) {
  for (const reports::DiffRow& row : diff.rows) {
    if (row.scenario == scenario && row.variant == variant) return row.change;
  }
  ADD_FAILURE() << "no row " << scenario << " x " << variant;
  return Change::unchanged;
}

TEST(Diff, ClassifiesEveryKindOfChange) {
  const json base = report(json::array({
      record("s/same", "v", "pass", true),
      record("s/regress", "v", "pass", true),
      record("s/control", "broken/x", "fail", true, "flag"),
      record("s/finding", "skip", "fail", true, "finding"),
      record("s/fixed", "v", "fail", false),
      record("s/verdict", "v", "pass", true, "agree"),
      record("s/drift", "v", "pass", true, "agree", 1e-7, 10),
      record("s/bits", "v", "pass", true, "agree", 1e-7, 10, "00000000000000aa"),
      record("s/removed", "v", "pass", true),
      record("s/still", "v", "fail", false),
  }));
  const json head = report(json::array({
      record("s/same", "v", "pass", true),
      record("s/regress", "v", "fail", false),
      record("s/control", "broken/x", "pass", false, "flag"),
      record("s/finding", "skip", "pass", false, "finding"),
      record("s/fixed", "v", "pass", true),
      record("s/verdict", "v", "expected-error", true, "agree"),
      record("s/drift", "v", "pass", true, "agree", 1e-7, 500),
      record("s/bits", "v", "pass", true, "agree", 1e-7, 10, "00000000000000bb"),
      record("s/still", "v", "fail", false),
      record("s/added", "v", "pass", true),
      record("s/added-bad", "v", "fail", false),
  }));
  const reports::Diff diff = reports::diff_reports(base, head);
  EXPECT_EQ(change_of(diff, "s/same", "v"), Change::unchanged);
  EXPECT_EQ(change_of(diff, "s/regress", "v"), Change::regression);
  EXPECT_EQ(change_of(diff, "s/control", "broken/x"), Change::control_lost);
  EXPECT_EQ(change_of(diff, "s/finding", "skip"), Change::finding_lost);
  EXPECT_EQ(change_of(diff, "s/fixed", "v"), Change::fixed);
  EXPECT_EQ(change_of(diff, "s/verdict", "v"), Change::verdict_changed);
  EXPECT_EQ(change_of(diff, "s/drift", "v"), Change::drift);
  EXPECT_EQ(change_of(diff, "s/bits", "v"), Change::bits_changed);
  EXPECT_EQ(change_of(diff, "s/removed", "v"), Change::removed);
  EXPECT_EQ(change_of(diff, "s/still", "v"), Change::still_unexpected);
  EXPECT_EQ(change_of(diff, "s/added", "v"), Change::added);
  EXPECT_EQ(change_of(diff, "s/added-bad", "v"), Change::regression);
  EXPECT_TRUE(diff.has_regression());
  EXPECT_EQ(diff.base_rows, 10);
  EXPECT_EQ(diff.head_rows, 11);
}

// The negative side: identical reports have no regression, and drift below the thresholds
// (a few ULP more, the error well under twice) is not drift.
TEST(Diff, IdenticalReportsAndSmallMovesAreNotChanges) {
  const json base = report(json::array({record("s", "v", "pass", true, "agree", 1e-7, 10)}));
  reports::Diff same = reports::diff_reports(base, base);
  EXPECT_FALSE(same.has_regression());
  EXPECT_EQ(same.count(Change::unchanged), 1);
  const json head = report(json::array({record("s", "v", "pass", true, "agree", 1.5e-7, 30)}));
  reports::Diff small = reports::diff_reports(base, head);
  EXPECT_EQ(change_of(small, "s", "v"), Change::unchanged);
  // The same move past a tighter threshold is drift: the threshold is what decides.
  reports::DiffOptions tight;
  tight.drift_ulp = 5;
  EXPECT_EQ(change_of(reports::diff_reports(base, head, tight), "s", "v"), Change::drift);
  // Tiny errors doubling (under 1% of the tolerance) is noise, not drift.
  const json tiny_base = report(json::array({record("s", "v", "pass", true, "agree", 1e-9, 0)}));
  const json tiny_head = report(json::array({record("s", "v", "pass", true, "agree", 5e-9, 0)}));
  EXPECT_EQ(change_of(reports::diff_reports(tiny_base, tiny_head), "s", "v"), Change::unchanged);
}

TEST(Diff, RefusesWhatIsNotAComparableReport) {
  const json good = report(json::array({record("s", "v", "pass", true)}));
  auto message = [](const json& base, const json& head) {
    try {
      (void)reports::diff_reports(base, head);
    } catch (const scenarios::InvalidInput& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(json::object({{"records", json::array()}}), good).find("base report: not a gradnorm report"), std::string::npos);
  json other_schema = good;
  other_schema["schema"] = 2;
  EXPECT_NE(message(good, other_schema).find("different schema versions (base 1, head 2)"), std::string::npos);
  json broken_record = good;
  broken_record["records"][0].erase("met");
  EXPECT_NE(message(good, broken_record).find("head report: record 0 lacks"), std::string::npos);
  json twice = good;
  twice["records"].push_back(twice["records"][0]);
  EXPECT_NE(message(twice, good).find("appears twice"), std::string::npos);
  EXPECT_EQ(message(good, good), "accepted");
}

TEST(Diff, TheCommentNamesEachRegressionAndTheCommandThatReproducesIt) {
  const json base = report(json::array({record("dist/5-3/float32", "py/step", "pass", true)}));
  const json head = report(json::array({record("dist/5-3/float32", "py/step", "fail", false)}));
  const std::string md = reports::render_diff_markdown(reports::diff_reports(base, head));
  EXPECT_EQ(md.rfind("## **gradnorm: 1 regression**", 0), 0u) << md;
  EXPECT_NE(md.find("`dist/5-3/float32` | `py/step`"), std::string::npos) << md;
  EXPECT_NE(md.find("reproduce: `gradnorm run -f 'my scenarios.toml' -s dist/5-3/float32 -v py/step`"),
            std::string::npos) << md;
}

TEST(Diff, ReproduceCommandsQuoteAndEscapeNames) {
  EXPECT_EQ(reports::reproduce_command({}, "single/it's", "broken/*"),
            "gradnorm run -s 'single/it'\\''s' -v 'broken/\\*'");
}

// However many rows change, the comment fits one pull-request comment and says how much it
// left out.
TEST(Diff, TheCommentFitsOnePullRequestCommentWhateverTheSize) {
  json base = json::array(), head = json::array();
  for (int i = 0; i < 20000; ++i) {
    const std::string name = "scenario/with/a/rather/long/name/" + std::to_string(i);
    base.push_back(record(name, "variant/with/a/long/name", "pass", true));
    head.push_back(record(name, "variant/with/a/long/name", "fail", false));
  }
  const std::string md = reports::render_diff_markdown(reports::diff_reports(report(base), report(head)));
  EXPECT_LE(md.size(), reports::kCommentLimit);
  EXPECT_NE(md.find("20000 regressions"), std::string::npos);
  EXPECT_NE(md.find("more lines left out to fit one pull-request comment"), std::string::npos);
}

TEST(Junit, OneTestcasePerRowFailuresForUnexpectedSkippedForLeftOut) {
  json r = report(json::array({record("s/<a>", "v&w", "pass", true), record("s/b", "v", "fail", false),
                               record("s/c", "broken/x", "pass", true, "n/a")}));
  r["left_out"] = json::array({{{"scenario", "s/d"}, {"variant", "v"}, {"why", "cannot run"}}});
  const std::string xml = reports::render_junit(r);
  EXPECT_NE(xml.find("<testsuites name=\"gradnorm\" tests=\"4\" failures=\"1\" errors=\"0\" skipped=\"2\">"),
            std::string::npos) << xml;
  EXPECT_NE(xml.find("classname=\"s/&lt;a&gt;\" name=\"v&amp;w\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("<failure message=\"verdict fail where agree was expected\""), std::string::npos) << xml;
  const std::string with_control = reports::render_junit(report(json::array({record("s\x01", "v", "pass", true)})));
  EXPECT_NE(with_control.find("classname=\"s\\x01\""), std::string::npos) << with_control;
}

TEST(Junit, DiffFailsRegressionsAndSkipsRemovedRows) {
  const json base = report(json::array({record("a", "v", "pass", true), record("b", "v", "pass", true)}));
  const json head = report(json::array({record("a", "v", "fail", false)}));
  const std::string xml = reports::render_diff_junit(reports::diff_reports(base, head));
  EXPECT_NE(xml.find("tests=\"2\" failures=\"1\" errors=\"0\" skipped=\"1\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("reproduce: gradnorm run -f &apos;my scenarios.toml&apos; -s a -v v"), std::string::npos) << xml;
}

// A diff that fails with no row to blame fails one case of its own (CI's test tab was green
// where the exit status was 1); a head that shares rows has no such case.
TEST(Junit, ADiffThatComparedNothingFailsACase) {
  const json base = report(json::array({record("a", "v", "pass", true), record("b", "v", "pass", true)}));
  const json renamed = report(json::array({record("c", "v", "pass", true)}));
  const reports::Diff disjoint = reports::diff_reports(base, renamed);
  EXPECT_TRUE(disjoint.head_shares_no_row());
  EXPECT_TRUE(disjoint.has_regression());
  const std::string xml = reports::render_diff_junit(disjoint);
  EXPECT_NE(xml.find("failure message=\"nothing compared (the head shares none of the base&apos;s 2 rows)\""),
            std::string::npos) << xml;
  const json empty = report(json::array());
  EXPECT_NE(reports::render_diff_junit(reports::diff_reports(base, empty)).find("the head judged nothing"),
            std::string::npos);
  // Control: one row in common, no such case.
  const json overlapping = report(json::array({record("a", "v", "pass", true), record("c", "v", "pass", true)}));
  const reports::Diff shared = reports::diff_reports(base, overlapping);
  EXPECT_FALSE(shared.head_shares_no_row());
  EXPECT_EQ(reports::render_diff_junit(shared).find("compared rows"), std::string::npos);
}

}  // namespace
}  // namespace gradnorm
