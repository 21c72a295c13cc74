#include "report_paths.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "gradnorm/harness/descendants.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/files.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::tools {
namespace {

namespace fs = std::filesystem;

// Two paths name the same file: the same device and inode when both exist, else the same
// absolute, normalised path.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  }
  std::error_code ea, eb;
  return fs::weakly_canonical(a, ea) == fs::weakly_canonical(b, eb) && !ea && !eb;
}

void on_signal(int signal) {
  reports::remove_partial_report();
  harness::end_descendants();
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

}  // namespace

void check_report_paths(const std::vector<ReportPath>& reports, const std::vector<std::string>& inputs) {
  std::vector<const ReportPath*> used;
  for (const ReportPath& r : reports) {
    if (r.path.empty()) {
      if (r.given) throw scenarios::InvalidInput(fmt::format("{}: the path is empty", r.option));
      continue;
    }
    if (auto why = scenarios::why_unwritable(r.path)) {
      throw scenarios::InvalidInput(fmt::format("{} {}: {}", r.option, r.path, *why));
    }
    for (const std::string& input : inputs) {
      if (!input.empty() && same_file(r.path, input)) {
        throw scenarios::InvalidInput(fmt::format("{} {}: is an input of this run ({}); a report never overwrites one",
                                                  r.option, r.path, input));
      }
    }
    for (const ReportPath* other : used) {
      if (same_file(r.path, other->path)) {
        throw scenarios::InvalidInput(fmt::format("{} and {} name the same file ({}): each report needs its own",
                                                  other->option, r.option, r.path));
      }
    }
    used.push_back(&r);
  }
}

void remove_partial_reports_on_signals() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction previous {};
    // A handler someone else installed (the supervisor's) is left in place; SIG_IGN is not:
    // a shell starts a background job (`gradnorm run ... &`) with SIGINT
    // ignored, and the run went on to its end (exit 1, a report) where rank processes gave 130.
    if (::sigaction(signal, nullptr, &previous) == 0 &&
        (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN)) {
      ::sigaction(signal, &action, nullptr);
    }
  }
}

}  // namespace gradnorm::tools
