#pragma once
// Report paths checked before anything runs: a report never lands on an input, on another
// report of the same run, or on anything that is not a regular file.

#include <string>
#include <vector>

namespace gradnorm::tools {

struct ReportPath {
  std::string option;  // "--json"
  std::string path;
  bool given = false;  // the option was on the command line (an empty path is then an error)
};

// Throws scenarios::InvalidInput naming the option and the path when: an option was given an
// empty path; the path is a folder, device, FIFO or socket; its folder is missing or not
// writable; two reports share a path; a report would overwrite one of `inputs`.
void check_report_paths(const std::vector<ReportPath>& reports, const std::vector<std::string>& inputs);

// SIGINT, SIGTERM and SIGHUP remove a report's named temporary, if a write is under way, and
// end the process as the signal would have.
void remove_partial_reports_on_signals();

}  // namespace gradnorm::tools
