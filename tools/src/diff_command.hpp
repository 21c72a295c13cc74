#pragma once
// `gradnorm diff BASE.json HEAD.json` and `gradnorm validate-report FILE`.

#include <cstdint>
#include <string>

namespace gradnorm::tools {

struct DiffCommandOptions {
  std::string base;
  std::string head;
  std::string markdown_path;
  std::string junit_path;
  std::string html_path;
  bool markdown_given = false;
  bool junit_given = false;
  bool html_given = false;
  std::int64_t drift_ulp = 64;
  double drift_factor = 2.0;
};

// Prints the Markdown comment (or writes it), and the JUnit file; 1 on a regression or a
// lost negative control, 0 otherwise; bad input throws scenarios::InvalidInput (exit 2).
int diff_command(const DiffCommandOptions& options);

// Checks FILE against the report schema compiled into gradnorm (docs/report.schema.json);
// prints each violation with its place in the document; 0 valid, 1 not, 2 unreadable.
int validate_report_command(const std::string& path);

}  // namespace gradnorm::tools
