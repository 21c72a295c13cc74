// `gradnorm fuzz`: the harness's properties, or a step, over generated scenarios (tools/src/fuzz.cpp).
#include <fmt/format.h>

#include "../command_line.hpp"
#include "../fuzz.hpp"

namespace gradnorm::tools {
namespace {

class FuzzCommand : public Subcommand {
 public:
  explicit FuzzCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand(
        "fuzz", "check the harness's properties over many generated scenarios");
    app_->footer("The guide: docs/steps.md and docs/reliability.md.");
    app_->add_option("--cases", options_.cases, "cases per property (default 1000)")
        ->check(CLI::Range(1, 100000000));
    app_->add_option("--variant,-v", options_.variants,
                     "fuzz this step (name or pattern, repeatable): it must agree with the oracle "
                     "wherever its reference does; default: the harness's own properties");
    app_->add_option("--seed", options_.seed, "generator seed; the same seed replays the same cases")
        ->check(seed_number());
    add_python_step_options(*app_, python_step_, /*recipes=*/true);
  }

  int run() override {
    const std::vector<std::string> declared = declare_steps(python_step_, {});
    if (options_.variants.empty()) options_.variants = declared;
    if (!python_step_.recipe.empty()) {
      if (!python_step_.source.empty()) {
        throw scenarios::InvalidInput("fuzz: --recipe and --python-step each need a run of "
                                      "their own; give one");
      }
      options_.variants = declared;
      options_.recipe_model = [step = python_step_](scenarios::Scenario s) {
        return with_recipe_model({std::move(s)}, step, true).front();
      };
      // The generated scenarios run on one device, ranks as threads: a recipe that needs
      // more (a process group) is refused before any case runs.
      scenarios::Scenario probe = options_.recipe_model(scenarios::Scenario{});
      if (auto why = harness::not_applicable(harness::find_variant(declared.front()), probe)) {
        throw scenarios::InvalidInput(fmt::format(
            "fuzz --recipe {}: {} (fuzz generates one-device scenarios and runs them in this "
            "process; judge it with gradnorm run --recipe ... --nproc W)",
            python_step_.recipe, *why));
      }
    }
    return fuzz_command(options_);
  }

 private:
  FuzzOptions options_;
  PythonStepOptions python_step_;
};

}  // namespace

std::unique_ptr<Subcommand> add_fuzz_command(CLI::App& app) { return std::make_unique<FuzzCommand>(app); }

}  // namespace gradnorm::tools
