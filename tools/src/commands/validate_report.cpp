// `gradnorm validate-report FILE`: a JSON report against the schema compiled in (tools/src/diff_command.cpp).
#include "../command_line.hpp"
#include "../diff_command.hpp"

namespace gradnorm::tools {
namespace {

class ValidateReportCommand : public Subcommand {
 public:
  explicit ValidateReportCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand(
        "validate-report", "check a JSON report against gradnorm's report schema (docs/report.schema.json)");
    app_->footer("The guide: docs/reports.md.");
    app_->add_option("file", path_, "the JSON report")->required();
  }

  int run() override { return validate_report_command(path_); }

 private:
  std::string path_;
};

}  // namespace

std::unique_ptr<Subcommand> add_validate_report_command(CLI::App& app) {
  return std::make_unique<ValidateReportCommand>(app);
}

}  // namespace gradnorm::tools
