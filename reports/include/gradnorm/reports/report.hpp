#pragma once
// Writers for an Evaluation: a terminal table, JSON (one record per scenario x variant),
// and Markdown fit to paste into a pull request. Same evaluation, same bytes.

#include <nlohmann/json_fwd.hpp>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/evaluation.hpp"

namespace gradnorm::reports {

inline constexpr int kJsonSchemaVersion = 1;

struct Summary {
  int rows = 0;
  int passed = 0;
  int failed = 0;
  int expected_errors = 0;
  int error_mismatches = 0;
  int unmet = 0;                  // rows whose verdict is not what was expected of them
  int controls_visible = 0;       // negative-control rows where the bug must show
  int controls_caught = 0;        // ... and were flagged
  int findings = 0;               // documented findings reproduced
};

[[nodiscard]] Summary summarize(const oracles::Evaluation& evaluation);
// Adds one row to a summary (summarize is this over every row; the Markdown tallies per variant).
void count_row(Summary& summary, const oracles::EvaluationRow& row);

// The variants that run a framework's own code, in first-seen order: (name, what runs and
// its version, VariantSpec::runs). The table and the Markdown name them.
[[nodiscard]] std::vector<std::pair<std::string, std::string>> framework_code(
    const oracles::Evaluation& evaluation);

// A fixed-width table, one line per row, then the reasons of every unexpected row and a
// summary line. No colour, no timestamps.
[[nodiscard]] std::string render_table(const oracles::Evaluation& evaluation);

// {"schema": 1, "tool": "gradnorm", "settings": {...}, "run": {...}, "summary": {...},
// "records": [...], "left_out": [...]}; non-finite numbers are written as null. The layout
// is docs/report.schema.json. `reproduce_arguments`: what, besides -s and -v, runs one row
// of this report again (scenario files, a Python step); gradnorm diff prints it.
[[nodiscard]] nlohmann::json to_json(const oracles::Evaluation& evaluation,
                                     const harness::RunSettings& settings,
                                     const std::vector<std::string>& reproduce_arguments = {});

[[nodiscard]] std::string render_markdown(const oracles::Evaluation& evaluation,
                                          const harness::RunSettings& settings);

// One line per rank of every row: scenario, variant, rank and the observation's digest,
// tab-separated. Two runs whose digest files are equal saw bit-identical numbers.
[[nodiscard]] std::string render_digests(const oracles::Evaluation& evaluation);

// Writes `text` to `path` so that a reader never sees half a report: through an unnamed file
// in the same folder, named once complete (a kill at any moment leaves nothing behind), or
// where the file system has none, a temporary renamed into place. Throws ReportWriteError
// naming the path on failure.
void write_file_atomically(const std::string& path, const std::string& text);

// A report (or an export, a stream) that could not be written once the work was done: a full
// file system, a folder removed meanwhile. Not an input error (those are found before any work,
// exit 2): exit 74, EX_IOERR of sysexits.h.
class ReportWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Removes the named temporary a write is using, if any; async-signal-safe, for a signal
// handler.
void remove_partial_report() noexcept;

}  // namespace gradnorm::reports
