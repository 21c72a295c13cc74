// The three report writers against golden files, on an evaluation built by hand (no torch
// computation), plus the summary counts, the JSON record shape and atomic writes.
// Regenerate the golden files with GRADNORM_UPDATE_GOLDEN=1, then read them before keeping.
#include "support/files.hpp"
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gradnorm/reports/report.hpp"

namespace gradnorm {
namespace {

using testing_support::contains;
using testing_support::read_file;
using testing_support::TemporaryDirectory;

using oracles::Expectation;
using oracles::VerdictKind;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::int64_t kMaxUlp = std::numeric_limits<std::int64_t>::max();

scenarios::Scenario scenario_named(std::string name, scenarios::DType dtype) {
  scenarios::Scenario s;
  s.name = std::move(name);
  s.dtype = dtype;
  return s;
}

// Six rows covering every verdict kind, every expectation, met and unmet, a NaN metric, a
// saturated ULP distance, an observation with a step and one with an error.
oracles::Evaluation hand_built_evaluation() {
  oracles::Evaluation evaluation;

  {  // A reference that passes; its own reference, so "=ref" reads "self".
    oracles::EvaluationRow row;
    row.scenario = scenario_named("single/n3/float32", scenarios::DType::float32);
    row.variant = harness::find_variant("baseline");
    row.observation.scenario = row.scenario.name;
    row.observation.variant = row.variant.name;
    harness::StepRecord step;
    step.logged_loss = 2.25;
    step.grad_norm = 1.5;
    row.observation.steps.push_back(step);
    row.observation.counters = {.backward_calls = 1, .scale_passes = 1, .clip_calls = 1,
                                .optimizer_steps = 1};
    row.verdict.kind = VerdictKind::pass;
    row.verdict.outcome = "finite";
    row.verdict.gradients.rel_l2_error = 1.5e-7;
    row.verdict.gradients.max_abs_error = 2.5e-7;
    row.verdict.gradients.max_ulp = 3;
    row.verdict.updates.rel_l2_error = 1e-7;
    row.verdict.updates.max_ulp = 1;
    row.verdict.logged_loss_rel_error = 1e-8;
    row.verdict.grad_norm_rel_error = 0.0;
    row.expectation = Expectation::agree;
    row.met = true;
    row.against_reference.bitwise_equal = true;
    row.global_token_count = 3;
    row.oracle_loss = 2.25;
    row.oracle_grad_norm = 1.5;
    evaluation.rows.push_back(row);
  }
  {  // A negative control where its bug shows and is flagged; NaN error, saturated ULPs.
    oracles::EvaluationRow row;
    row.scenario = scenario_named("single/n5/bfloat16", scenarios::DType::bfloat16);
    row.variant = harness::find_variant("broken/scale-pass-dropped");
    row.verdict.kind = VerdictKind::fail;
    row.verdict.outcome = "finite";
    row.verdict.reasons = {"gradients rel L2 error nan exceeds 5.00e-02",
                           "parameter update rel L2 error 4.00e+00 exceeds 5.00e-02"};
    row.verdict.gradients.rel_l2_error = kNaN;
    row.verdict.gradients.max_abs_error = 4.0;
    row.verdict.gradients.max_ulp = kMaxUlp;
    row.verdict.gradients.all_finite = false;
    row.verdict.gradients.worst = "head.weight[3]: got nan, want 0.25";
    row.verdict.logged_loss_rel_error = 4.0;
    row.expectation = Expectation::flag;
    row.met = true;
    row.applicability = "N > 1: token sums differ from means";
    row.against_reference.bitwise_equal = false;
    row.against_reference.max_ulp = 12;
    row.against_reference.first_difference = "head.weight[0]: 0.5 vs 2.5";
    row.global_token_count = 5;
    row.oracle_loss = 2.5;
    row.oracle_grad_norm = 0.75;
    evaluation.rows.push_back(row);
  }
  {  // A candidate reproducing a documented finding.
    oracles::EvaluationRow row;
    row.scenario = scenario_named("single/all-masked-mean_ce/float32", scenarios::DType::float32);
    row.variant = harness::find_variant("skip");
    harness::StepRecord step;
    step.logged_loss = kNaN;
    row.observation.steps.push_back(step);
    row.verdict.kind = VerdictKind::error_mismatch;
    row.verdict.outcome = "finite";
    row.verdict.reasons = {"reference raises nothing but steps on NaN; this variant is finite"};
    row.expectation = Expectation::finding;
    row.met = true;
    row.applicability = "the skip path steps on finite zeros";
    row.global_token_count = 0;
    row.oracle_loss = kNaN;
    row.oracle_grad_norm = kNaN;
    evaluation.rows.push_back(row);
  }
  {  // A reference whose backward raises, as expected where no gradient exists.
    oracles::EvaluationRow row;
    row.scenario = scenario_named("single/all-masked-linear_ce/float64", scenarios::DType::float64);
    row.variant = harness::find_variant("baseline");
    row.observation.error = harness::ErrorRecord{
        "c10::Error", "element 0 of tensors does not require grad and does not have a grad_fn"};
    row.observation.counters.backward_calls = 1;
    row.verdict.kind = VerdictKind::expected_error;
    row.verdict.outcome = "raises c10::Error";
    row.expectation = Expectation::agree;
    row.met = true;
    row.against_reference.bitwise_equal = true;
    row.global_token_count = 0;
    row.oracle_loss = kNaN;
    row.oracle_grad_norm = kNaN;
    evaluation.rows.push_back(row);
  }
  {  // A candidate that fails where it must agree: the one unexpected row.
    oracles::EvaluationRow row;
    row.scenario = scenario_named("single/n5/float32", scenarios::DType::float32);
    row.variant = harness::find_variant("skip");
    row.verdict.kind = VerdictKind::fail;
    row.verdict.outcome = "finite";
    row.verdict.reasons = {"logged loss rel error 8.00e-01 exceeds 1.00e-05",
                           "grad norm rel error 2.00e-01 exceeds 1.00e-05"};
    row.verdict.gradients.rel_l2_error = 3.25e-2;
    row.verdict.gradients.max_abs_error = 0.125;
    row.verdict.gradients.max_ulp = 1048576;
    row.verdict.logged_loss_rel_error = 0.8;
    row.verdict.grad_norm_rel_error = 0.2;
    row.expectation = Expectation::agree;
    row.met = false;
    row.against_reference.bitwise_equal = false;
    row.global_token_count = 5;
    row.oracle_loss = 2.0;
    row.oracle_grad_norm = 1.0;
    evaluation.rows.push_back(row);
  }
  {  // A negative control where its bug cannot show.
    oracles::EvaluationRow row;
    row.scenario = scenario_named("single/n1/float32", scenarios::DType::float32);
    row.variant = harness::find_variant("broken/scale-pass-dropped");
    row.verdict.kind = VerdictKind::pass;
    row.verdict.outcome = "finite";
    row.expectation = Expectation::not_applicable;
    row.met = true;
    row.applicability = "N <= 1 or optimizer in backward: no scale pass to drop";
    row.against_reference.bitwise_equal = true;
    row.global_token_count = 1;
    row.oracle_loss = 2.0;
    row.oracle_grad_norm = 0.5;
    evaluation.rows.push_back(row);
  }
  return evaluation;
}

harness::RunSettings fixed_settings() {
  return harness::RunSettings{
      .torch_version = "1.13.0", .intra_op_threads = 1, .deterministic_algorithms = true};
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// Names the first differing line (1-based) and both versions of it.
::testing::AssertionResult same_lines(const std::string& expected, const std::string& actual) {
  if (expected == actual) return ::testing::AssertionSuccess();
  const std::vector<std::string> want = split_lines(expected);
  const std::vector<std::string> got = split_lines(actual);
  const std::size_t common = std::min(want.size(), got.size());
  std::size_t line = 0;
  while (line < common && want[line] == got[line]) ++line;
  const auto at = [line](const std::vector<std::string>& lines) {
    return line < lines.size() ? "'" + lines[line] + "'" : std::string("<end of text>");
  };
  if (line == common && want.size() == got.size()) {
    return ::testing::AssertionFailure()
           << "texts differ only in the final newline (" << expected.size() << " vs "
           << actual.size() << " bytes)";
  }
  return ::testing::AssertionFailure() << "first difference at line " << line + 1
                                       << "\n  golden: " << at(want) << "\n  actual: " << at(got);
}

bool updating_golden() {
  const char* flag = std::getenv("GRADNORM_UPDATE_GOLDEN");
  return flag != nullptr && std::string(flag) == "1";
}

// Compares `actual` with the golden file `name`; with GRADNORM_UPDATE_GOLDEN=1, writes it.
::testing::AssertionResult matches_golden(const std::string& name, const std::string& actual) {
  const std::filesystem::path path = std::filesystem::path(GRADNORM_GOLDEN_DIR) / name;
  if (updating_golden()) {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file << actual;
    if (!file) return ::testing::AssertionFailure() << "cannot write golden file " << path;
    return ::testing::AssertionSuccess();
  }
  if (!std::filesystem::exists(path)) {
    return ::testing::AssertionFailure()
           << "golden file " << path << " is missing; run with GRADNORM_UPDATE_GOLDEN=1";
  }
  ::testing::AssertionResult same = same_lines(read_file(path), actual);
  if (!same) {
    return ::testing::AssertionFailure()
           << name << " differs from " << path << ": " << same.message()
           << "\n(if the change is intended, rerun with GRADNORM_UPDATE_GOLDEN=1 and review)";
  }
  return same;
}

std::string render_json(const oracles::Evaluation& evaluation) {
  return reports::to_json(evaluation, fixed_settings()).dump(2) + "\n";
}


TEST(GoldenComparison, NamesFirstDifferingLineAndBothVersions) {
  EXPECT_TRUE(same_lines("a\nb\nc\n", "a\nb\nc\n"));
  const ::testing::AssertionResult changed = same_lines("a\nb\nc\n", "a\nB\nc\n");
  ASSERT_FALSE(changed);
  EXPECT_NE(std::string(changed.message()).find("line 2"), std::string::npos) << changed.message();
  EXPECT_NE(std::string(changed.message()).find("golden: 'b'"), std::string::npos)
      << changed.message();
  EXPECT_NE(std::string(changed.message()).find("actual: 'B'"), std::string::npos)
      << changed.message();
  const ::testing::AssertionResult shorter = same_lines("a\nb\n", "a\n");
  ASSERT_FALSE(shorter);
  EXPECT_NE(std::string(shorter.message()).find("line 2"), std::string::npos) << shorter.message();
  EXPECT_NE(std::string(shorter.message()).find("<end of text>"), std::string::npos)
      << shorter.message();
  EXPECT_FALSE(same_lines("a\n", "a"));
}

TEST(ReportGolden, Table) {
  EXPECT_TRUE(matches_golden("table.txt", reports::render_table(hand_built_evaluation())));
}

TEST(ReportGolden, Markdown) {
  EXPECT_TRUE(matches_golden("report.md",
                             reports::render_markdown(hand_built_evaluation(), fixed_settings())));
}

TEST(ReportGolden, Json) {
  EXPECT_TRUE(matches_golden("report.json", render_json(hand_built_evaluation())));
}

// Negative control for the golden check: one changed figure must be caught.
TEST(ReportGolden, AChangedFigureIsCaught) {
  if (updating_golden()) GTEST_SKIP() << "golden files are being rewritten";
  oracles::Evaluation evaluation = hand_built_evaluation();
  evaluation.rows.front().verdict.gradients.max_ulp = 4;
  const ::testing::AssertionResult table = matches_golden("table.txt", reports::render_table(evaluation));
  ASSERT_FALSE(table);
  EXPECT_NE(std::string(table.message()).find("line 2"), std::string::npos) << table.message();
  EXPECT_FALSE(matches_golden("report.json", render_json(evaluation)));
  // The Markdown shows no ULP figure (the JSON holds them); a changed verdict it must show.
  oracles::Evaluation verdict_changed = hand_built_evaluation();
  verdict_changed.rows.front().verdict.kind = VerdictKind::fail;
  EXPECT_FALSE(matches_golden("report.md", reports::render_markdown(verdict_changed, fixed_settings())));
}

TEST(Summarize, CountsTheHandBuiltRows) {
  const reports::Summary s = reports::summarize(hand_built_evaluation());
  EXPECT_EQ(s.rows, 6);
  EXPECT_EQ(s.passed, 2);            // baseline n3, control n1
  EXPECT_EQ(s.failed, 2);            // control n5, skip n5
  EXPECT_EQ(s.expected_errors, 1);   // baseline linear_ce
  EXPECT_EQ(s.error_mismatches, 1);  // skip mean_ce
  EXPECT_EQ(s.unmet, 1);             // skip n5
  EXPECT_EQ(s.controls_visible, 1);  // the flag row; the n/a row does not count
  EXPECT_EQ(s.controls_caught, 1);
  EXPECT_EQ(s.findings, 1);
}

TEST(Summarize, AFlaggedControlThatPassesIsVisibleButNotCaught) {
  oracles::Evaluation evaluation = hand_built_evaluation();
  evaluation.rows[1].verdict.kind = VerdictKind::pass;
  evaluation.rows[1].met = false;
  evaluation.rows[2].met = false;  // the finding no longer reproduces
  const reports::Summary s = reports::summarize(evaluation);
  EXPECT_EQ(s.controls_visible, 1);
  EXPECT_EQ(s.controls_caught, 0);
  EXPECT_EQ(s.findings, 0);
  EXPECT_EQ(s.unmet, 3);
  EXPECT_EQ(s.passed, 3);
  EXPECT_EQ(s.failed, 1);
}

TEST(Summarize, EmptyEvaluationCountsNothing) {
  const reports::Summary s = reports::summarize(oracles::Evaluation{});
  EXPECT_EQ(s.rows, 0);
  EXPECT_EQ(s.unmet, 0);
  EXPECT_NE(reports::render_table(oracles::Evaluation{}).find("0 rows"), std::string::npos);
}

TEST(JsonReport, EveryRecordHasTheDocumentedKeys) {
  const nlohmann::json report = reports::to_json(hand_built_evaluation(), fixed_settings());
  EXPECT_EQ(report.at("schema"), reports::kJsonSchemaVersion);
  EXPECT_EQ(report.at("settings").at("torch_version"), "1.13.0");
  EXPECT_EQ(report.at("settings").at("intra_op_threads"), 1);
  EXPECT_EQ(report.at("settings").at("deterministic_algorithms"), true);
  ASSERT_EQ(report.at("records").size(), 6u);
  for (const nlohmann::json& record : report.at("records")) {
    for (const char* key : {"scenario", "variant", "verdict", "rel_l2_error", "max_abs_error",
                            "max_ulp", "bitwise_equal_baseline", "grad_norm", "logged_loss",
                            "error"}) {
      EXPECT_TRUE(record.contains(key)) << "record " << record.value("scenario", "?") << " x "
                                        << record.value("variant", "?") << " lacks '" << key << "'";
    }
  }
  const nlohmann::json& first = report.at("records").at(0);
  EXPECT_EQ(first.at("scenario"), "single/n3/float32");
  EXPECT_EQ(first.at("variant"), "baseline");
  EXPECT_EQ(first.at("verdict"), "pass");
  EXPECT_EQ(first.at("max_ulp"), 3);
  EXPECT_EQ(first.at("logged_loss"), 2.25);
  EXPECT_EQ(first.at("grad_norm"), 1.5);
  EXPECT_TRUE(first.at("error").is_null());
  const nlohmann::json& raised = report.at("records").at(3);
  EXPECT_EQ(raised.at("error").at("type"), "c10::Error");
  EXPECT_EQ(raised.at("verdict"), "expected-error");
  EXPECT_TRUE(raised.at("grad_norm").is_null());  // no step completed
  EXPECT_TRUE(raised.at("rel_l2_error").is_null());  // no numbers for an error verdict
}

TEST(JsonReport, NonFiniteNumbersBecomeNull) {
  const nlohmann::json report = reports::to_json(hand_built_evaluation(), fixed_settings());
  const nlohmann::json& control = report.at("records").at(1);
  EXPECT_TRUE(control.at("rel_l2_error").is_null()) << control.at("rel_l2_error");
  EXPECT_EQ(control.at("max_ulp"), "max");
  EXPECT_EQ(control.at("max_abs_error"), 4.0);
  const nlohmann::json& finding = report.at("records").at(2);
  EXPECT_TRUE(finding.at("logged_loss").is_null()) << finding.at("logged_loss");
  EXPECT_TRUE(finding.at("oracle_loss").is_null()) << finding.at("oracle_loss");
  // Negative control: a finite number stays a number.
  EXPECT_TRUE(report.at("records").at(0).at("oracle_loss").is_number());
  // And the text holds no bare NaN or Infinity value that a strict JSON parser would reject
  // (the words may appear inside strings, e.g. in reasons).
  const std::string text = render_json(hand_built_evaluation());
  for (const char* bare : {": NaN", ": nan", ": Infinity", ": inf", ": -inf"}) {
    EXPECT_EQ(text.find(bare), std::string::npos) << "bare '" << bare << "' in the JSON";
  }
  EXPECT_TRUE(nlohmann::json::accept(text));
}

TEST(TableReport, SpellsOutNanAndSaturatedUlps) {
  const std::vector<std::string> lines = split_lines(reports::render_table(hand_built_evaluation()));
  ASSERT_GT(lines.size(), 2u);
  const std::string& control = lines[2];
  EXPECT_NE(control.find("broken/scale-pass-dropped"), std::string::npos) << control;
  EXPECT_NE(control.find(" nan "), std::string::npos) << control;
  EXPECT_NE(control.find(" max "), std::string::npos) << control;
  EXPECT_NE(control.find("caught"), std::string::npos) << control;
}

// A framework's own code (VariantSpec::runs) is named, with its version, by the table and
// the Markdown, once per variant, beside the summary; gradnorm's own steps are not.
TEST(TableReport, NamesTheFrameworkCodeThatRanAndItsVersionOncePerVariant) {
  oracles::Evaluation evaluation = hand_built_evaluation();
  const std::string table_before = reports::render_table(evaluation);
  const std::string markdown_before = reports::render_markdown(evaluation, fixed_settings());
  // Negative control: the hand-built rows run no framework code, and nothing is named.
  EXPECT_EQ(table_before.find(", unmodified"), std::string::npos) << table_before;
  EXPECT_EQ(markdown_before.find(", unmodified"), std::string::npos) << markdown_before;
  EXPECT_TRUE(reports::framework_code(evaluation).empty());
  for (oracles::EvaluationRow& row : evaluation.rows) {
    if (row.variant.name == "baseline") row.variant.runs = "transformers 9.1.0's Trainer";
  }
  const std::string table = reports::render_table(evaluation);
  const std::string line = "baseline is transformers 9.1.0's Trainer, unmodified\n";
  ASSERT_NE(table.find(line), std::string::npos) << table;
  EXPECT_EQ(table.find(line), table.rfind(line)) << "named once however many rows: " << table;
  EXPECT_LT(table.find(line), table.find(" rows: ")) << "before the summary line: " << table;
  const std::string markdown = reports::render_markdown(evaluation, fixed_settings());
  EXPECT_TRUE(contains(markdown, "- `baseline` is transformers 9.1.0's Trainer, unmodified\n"))
      << markdown;
}

TEST(ReportDeterminism, SameEvaluationSameBytes) {
  const oracles::Evaluation evaluation = hand_built_evaluation();
  EXPECT_EQ(reports::render_table(evaluation), reports::render_table(hand_built_evaluation()));
  EXPECT_EQ(reports::render_markdown(evaluation, fixed_settings()),
            reports::render_markdown(hand_built_evaluation(), fixed_settings()));
  EXPECT_EQ(render_json(evaluation), render_json(hand_built_evaluation()));
  // Negative control: one changed figure changes the bytes of every format that shows it
  // (the Markdown shows verdicts, not ULP figures).
  oracles::Evaluation changed = hand_built_evaluation();
  changed.rows.front().verdict.gradients.max_ulp = 4;
  EXPECT_NE(reports::render_table(changed), reports::render_table(evaluation));
  oracles::Evaluation verdict_changed = hand_built_evaluation();
  verdict_changed.rows.front().verdict.kind = VerdictKind::fail;
  EXPECT_NE(reports::render_markdown(verdict_changed, fixed_settings()),
            reports::render_markdown(evaluation, fixed_settings()));
  EXPECT_NE(render_json(changed), render_json(evaluation));
}

TEST(WriteFileAtomically, WritesTheContentAndLeavesNoPartialFile) {
  TemporaryDirectory folder("gradnorm-reports");
  const std::filesystem::path path = folder.path() / "report.json";
  reports::write_file_atomically(path.string(), "first\n");
  EXPECT_EQ(read_file(path), "first\n");
  reports::write_file_atomically(path.string(), "second, longer\n");  // replaces, not appends
  EXPECT_EQ(read_file(path), "second, longer\n");
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
  std::vector<std::string> entries;
  for (const auto& entry : std::filesystem::directory_iterator(folder.path())) {
    entries.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(entries, std::vector<std::string>{"report.json"});
}

TEST(WriteFileAtomically, MissingFolderThrowsNamingThePath) {
  TemporaryDirectory folder("gradnorm-reports");
  const std::string path = (folder.path() / "no-such-folder" / "report.json").string();
  try {
    reports::write_file_atomically(path, "text\n");
    ADD_FAILURE() << "expected ReportWriteError for " << path;
  } catch (const reports::ReportWriteError& error) {  // exit 74: found once the work was done
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(folder.path() / "no-such-folder"));
  EXPECT_TRUE(std::filesystem::is_empty(folder.path()));
}

}  // namespace
}  // namespace gradnorm
