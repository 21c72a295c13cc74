#include "diff_command.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "gradnorm/reports/diff.hpp"
#include "gradnorm/reports/html.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/scenario.hpp"
#include "report_paths.hpp"
#include "report_schema.hpp"  // generated: kReportSchema, docs/report.schema.json's text

namespace gradnorm::tools {

namespace {

// What docs/report.schema.json refuses in `document`: "WHERE: WHY" lines, none when it is valid.
std::vector<std::string> schema_violations(const nlohmann::json& document) {
  static const nlohmann::json schema_document = nlohmann::json::parse(kReportSchema);
  valijson::Schema schema;
  valijson::SchemaParser parser;
  valijson::adapters::NlohmannJsonAdapter schema_adapter(schema_document);
  parser.populateSchema(schema_adapter, schema);
  valijson::Validator validator;
  valijson::ValidationResults results;
  valijson::adapters::NlohmannJsonAdapter target(document);
  std::vector<std::string> found;
  if (validator.validate(schema, target, &results)) return found;
  valijson::ValidationResults::Error error;
  while (results.popError(error)) {
    std::string where;
    for (const std::string& part : error.context) where += part;
    found.push_back(fmt::format("{}: {}", where, error.description));
  }
  return found;
}

// diff reads what validate-report accepts, no less: it compared a report whose rel_l2_error was
// a string, whose world_size was -1 or whose scenario was empty.
nlohmann::json read_valid_report(const std::string& path, const char* side) {
  nlohmann::json document = reports::read_json_report(path);
  const std::vector<std::string> violations = schema_violations(document);
  if (!violations.empty()) {
    // valijson reports the innermost violation first.
    throw scenarios::InvalidInput(fmt::format(
        "{} report '{}' is not a valid gradnorm report: {} ({} violation{} of "
        "docs/report.schema.json; gradnorm validate-report lists them)",
        side, path, violations.front(), violations.size(), violations.size() == 1 ? "" : "s"));
  }
  return document;
}

}  // namespace

int diff_command(const DiffCommandOptions& options) {
  check_report_paths({{"--markdown", options.markdown_path, options.markdown_given},
                      {"--junit", options.junit_path, options.junit_given},
                      {"--html", options.html_path, options.html_given}},
                     {options.base, options.head});
  const nlohmann::json base = read_valid_report(options.base, "the base");
  const nlohmann::json head = read_valid_report(options.head, "the head");
  reports::DiffOptions diff_options;
  diff_options.drift_ulp = options.drift_ulp;
  diff_options.drift_factor = options.drift_factor;
  reports::Diff diff;
  try {
    diff = reports::diff_reports(base, head, diff_options);
  } catch (const scenarios::InvalidInput& error) {
    throw scenarios::InvalidInput(fmt::format("{} (base {}, head {})", error.what(), options.base, options.head));
  }
  const std::string markdown = reports::render_diff_markdown(diff);
  remove_partial_reports_on_signals();
  if (!options.junit_path.empty()) {
    reports::write_file_atomically(options.junit_path, reports::render_diff_junit(diff));
  }
  if (!options.html_path.empty()) {
    reports::write_file_atomically(options.html_path, reports::render_diff_html(diff, head));
  }
  if (!options.markdown_path.empty()) {
    reports::write_file_atomically(options.markdown_path, markdown);
    std::fputs(markdown.substr(0, markdown.find('\n') + 1).c_str(), stdout);
  } else {
    std::fputs(markdown.c_str(), stdout);
  }
  return diff.has_regression() ? 1 : 0;
}

int validate_report_command(const std::string& path) {
  const nlohmann::json document = reports::read_json_report(path);
  const std::vector<std::string> violations = schema_violations(document);
  if (violations.empty()) {
    // Checked, not only parsed: what the schema cannot say.
    const std::vector<std::string> contradictions = reports::report_contradictions(document);
    if (contradictions.empty()) {
      fmt::print("{}: a valid gradnorm report (schema version {})\n", path,
                 document.value("schema", nlohmann::json()).dump());
      return 0;
    }
    for (const std::string& line : contradictions) fmt::print(stderr, "{}: {}\n", path, line);
    fmt::print(stderr, "{}: not a valid gradnorm report: its records contradict it\n", path);
    return 1;
  }
  for (std::size_t i = 0; i < violations.size() && i < 20; ++i) {
    fmt::print(stderr, "{}: {}\n", path, violations[i]);
  }
  if (violations.size() > 20) fmt::print(stderr, "{}: and {} more violations\n", path, violations.size() - 20);
  fmt::print(stderr, "{}: not a valid gradnorm report (docs/report.schema.json)\n", path);
  return 1;
}

}  // namespace gradnorm::tools
