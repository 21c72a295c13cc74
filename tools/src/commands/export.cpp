// `gradnorm export SCENARIO... --out DIR`: oracle vectors for Python test suites (tools/src/export.cpp).
#include "../command_line.hpp"
#include "../export.hpp"
#include "gradnorm/scenarios/files.hpp"

namespace gradnorm::tools {
namespace {

class ExportCommand : public Subcommand {
 public:
  explicit ExportCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand(
        "export", "write oracle vectors (batches, initial parameters, the oracle's answers) that "
                  "torch.load reads, one file per scenario, for Python test suites");
    app_->footer("The guide: docs/steps.md (oracle vectors for pytest).");
    app_->add_option("scenario", patterns_, "scenario names or shell patterns")->required();
    app_->add_option("--out", out_, "the folder to write OUT/<scenario>.pt into")->required();
    app_->add_option("--scenario-file,-f", files_, "TOML scenario file (repeatable)")
        ->check(readable_file());
  }

  int run() override {
    out_ = scenarios::absolute_path(out_);
    return export_command(pick_scenarios(patterns_, files_), out_);
  }

 private:
  std::vector<std::string> patterns_, files_;
  std::string out_;
};

}  // namespace

std::unique_ptr<Subcommand> add_export_command(CLI::App& app) { return std::make_unique<ExportCommand>(app); }

}  // namespace gradnorm::tools
