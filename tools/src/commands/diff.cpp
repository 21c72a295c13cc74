// `gradnorm diff BASE.json HEAD.json`: a pull request's base and head compared (tools/src/diff_command.cpp).
#include "../command_line.hpp"
#include "../diff_command.hpp"
#include "gradnorm/scenarios/files.hpp"

namespace gradnorm::tools {
namespace {

class DiffCommand : public Subcommand {
 public:
  explicit DiffCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand(
        "diff", "compare two JSON reports (a pull request's base and head): regressions, fixes, "
                "drift; exit 1 on a regression");
    app_->footer("The guide: docs/reports.md.");
    app_->add_option("base", options_.base, "the base's JSON report")->required();
    app_->add_option("head", options_.head, "the head's JSON report")->required();
    app_->add_option("--markdown", options_.markdown_path,
                     "write the pull-request comment to PATH (default: print it)");
    app_->add_option("--junit", options_.junit_path, "write JUnit XML to PATH");
    app_->add_option("--html", options_.html_path,
                     "write a self-contained HTML page to PATH: the grid by change, the head's errors");
    app_->add_option("--drift-ulp", options_.drift_ulp,
                     "a passing row drifts when its max ULP to the oracle grew by more than this (default 64)")
        ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 62));
    app_->add_option("--drift-factor", options_.drift_factor,
                     "... or its relative L2 error grew by this factor (default 2)")
        ->check(finite_number())
        ->check(CLI::Range(1.0, 1e12));
  }

  int run() override {
    for (std::string* path : {&options_.markdown_path, &options_.junit_path, &options_.html_path}) {
      *path = scenarios::absolute_path(*path);
    }
    options_.markdown_given = app_->count("--markdown") > 0;
    options_.junit_given = app_->count("--junit") > 0;
    options_.html_given = app_->count("--html") > 0;
    return diff_command(options_);
  }

 private:
  DiffCommandOptions options_;
};

}  // namespace

std::unique_ptr<Subcommand> add_diff_command(CLI::App& app) { return std::make_unique<DiffCommand>(app); }

}  // namespace gradnorm::tools
