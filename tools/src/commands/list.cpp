// `gradnorm list`: the scenario catalogue (or a file's scenarios) and the variants.
#include <fmt/format.h>

#include "../command_line.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::tools {
namespace {

// The catalogue (or, with files, the files' scenarios) and the variants; `names_only`: one
// name per line, for scripts (the CMake function that registers scenario files as tests).
int list_command(bool scenarios_only, bool variants_only, bool names_only,
                 const std::vector<std::string>& files) {
  if (!variants_only) {
    for (const scenarios::Scenario& s : scenario_pool(files, !files.empty())) {
      fmt::print("{}\n", names_only ? s.name : scenarios::describe(s));
    }
  }
  if (!scenarios_only) {
    for (const harness::VariantSpec& v : harness::variants()) {
      if (names_only) {
        fmt::print("{}\n", v.name);
        continue;
      }
      fmt::print("{:<32} {:<17} reference {}\n", v.name, harness::to_string(v.role), v.reference);
      fmt::print("    {}\n", v.summary);
      for (const harness::Citation& c : v.cites) fmt::print("    {}\n", harness::to_string(c));
    }
  }
  return kExitAsExpected;
}

class ListCommand : public Subcommand {
 public:
  explicit ListCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand("list", "list the scenario catalogue and the variants");
    app_->footer("The guide: docs/scenarios.md.");
    app_->add_flag("--scenarios", scenarios_only_, "scenarios only");
    app_->add_flag("--variants", variants_only_, "variants only");
    app_->add_flag("--names", names_only_, "names only, one per line");
    app_->add_option("--scenario-file,-f", files_,
                     "list this file's scenarios instead of the catalogue (repeatable)")
        ->check(readable_file());
  }

  int run() override {
    return list_command(scenarios_only_, variants_only_, names_only_, files_);
  }

 private:
  bool scenarios_only_ = false, variants_only_ = false, names_only_ = false;
  std::vector<std::string> files_;
};

}  // namespace

std::unique_ptr<Subcommand> add_list_command(CLI::App& app) { return std::make_unique<ListCommand>(app); }

}  // namespace gradnorm::tools
