#pragma once
// Two JSON reports of gradnorm (a pull request's base and head) compared row by row, rows
// matched by (scenario, variant); and the JUnit XML that CI test tabs read, for one report
// or for a comparison. Works on the reports alone: nothing is run again.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace gradnorm::reports {

// What happened to one (scenario, variant) row between base and head, most serious first.
enum class Change {
  regression,       // as expected in base, not in head (an agree row that now fails, or
                    // whose error grew past its tolerance)
  control_lost,     // a negative control caught in base and no longer caught in head
  finding_lost,     // a documented finding that reproduced in base and no longer does
  still_unexpected, // unexpected in both
  fixed,            // unexpected in base, as expected in head
  verdict_changed,  // another verdict, as expected in both
  drift,            // the same passing verdict, but further from the oracle by more than
                    // the drift thresholds (still within tolerance)
  bits_changed,     // the same verdict, other numbers (the observation digest differs)
  added,            // only in head
  removed,          // only in base
  unchanged,        // the same verdict and the same bits
};

[[nodiscard]] std::string_view to_string(Change change);

struct DiffOptions {
  // Drift: a passing row whose largest ULP distance to the oracle grew by more than this,
  std::int64_t drift_ulp = 64;
  // or whose relative L2 error grew by this factor and to at least drift_floor of its
  // tolerance (tiny errors doubling is noise, not drift).
  double drift_factor = 2.0;
  double drift_floor = 0.01;
};

struct DiffRow {
  std::string scenario;
  std::string variant;
  Change change = Change::unchanged;
  std::string detail;            // one line: what changed, with the figures
  nlohmann::json base;           // the base record (null when added)
  nlohmann::json head;           // the head record (null when removed)
};

struct Diff {
  std::vector<DiffRow> rows;     // every row of either report: head's order, then removed rows
  int base_rows = 0;
  int head_rows = 0;
  // How to run one row of head again: gradnorm's arguments besides -s and -v (scenario
  // files, a Python step), as head's report recorded them.
  std::vector<std::string> reproduce_arguments;
  // Real framework code the head judged (variants whose line says "unmodified"): the
  // framework, its version and where it was installed from, and the base's line where it
  // differs ("transformers 5.19.0.dev0's Trainer, editable from PATH, unmodified (...)").
  struct Judged {
    std::string variant;
    std::string head;
    std::string base;  // empty: the same as the head's, or not in the base
  };
  std::vector<Judged> judged;
  [[nodiscard]] int count(Change change) const;
  // The base had rows and the head has none: every row was removed (a run that judged
  // nothing), which fails the diff as a regression does.
  [[nodiscard]] bool head_lost_every_row() const { return base_rows > 0 && head_rows == 0; }
  // Both judged rows and no row is in both: every row was added or removed (the scenarios or
  // variants were all renamed, or the two runs judged different things), so nothing was
  // compared; the diff fails as on a regression.
  [[nodiscard]] bool head_shares_no_row() const;
  // A regression, a lost negative control, or a head that lost every row: the diff's exit
  // status is 1.
  [[nodiscard]] bool has_regression() const;
};

// Checks that both are gradnorm reports of the same schema version and compares them.
// Throws scenarios::InvalidInput naming the report and what is wrong with it.
[[nodiscard]] Diff diff_reports(const nlohmann::json& base, const nlohmann::json& head,
                                const DiffOptions& options = {});

// Reads and parses a JSON report; InvalidInput naming the path when it cannot: not a regular
// file, more than 1 GiB, not JSON, or an object with the same key twice.
[[nodiscard]] nlohmann::json read_json_report(const std::string& path);

// What a report says that its own records contradict, one line each (empty: nothing): a
// (scenario, variant) row twice; a summary count (rows, pass, fail, expected_error,
// error_mismatch, unexpected) other than its records'. The schema cannot say these.
[[nodiscard]] std::vector<std::string> report_contradictions(const nlohmann::json& report);

// A pull-request comment: a one-line headline, a short table of what changed, the details
// folded away, the command that reproduces each regression. Never longer than
// kCommentLimit characters: what does not fit is counted and left to the JSON.
[[nodiscard]] std::string render_diff_markdown(const Diff& diff);

// The exact command that runs one row again, quoted for a POSIX shell.
[[nodiscard]] std::string reproduce_command(const std::vector<std::string>& arguments,
                                            const std::string& scenario,
                                            const std::string& variant);

// A GitHub pull-request comment holds at most 65,536 characters.
inline constexpr std::size_t kCommentLimit = 65536;

// JUnit XML of one JSON report: a testcase per row (classname the scenario, name the
// variant), a failure for every row not as expected with its reasons, skipped for rows
// the run left out or whose expectation cannot apply.
[[nodiscard]] std::string render_junit(const nlohmann::json& report);

// JUnit XML of a comparison: a testcase per row of either report, a failure for every
// regression and lost negative control, skipped for removed rows.
[[nodiscard]] std::string render_diff_junit(const Diff& diff);

}  // namespace gradnorm::reports
