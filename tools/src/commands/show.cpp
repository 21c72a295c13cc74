// `gradnorm show SCENARIO`: its token counts, the oracle's loss, norm and clip coefficient, and
// any documented finding.
#include <fmt/format.h>

#include "../command_line.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/oracles/oracle.hpp"

namespace gradnorm::tools {
namespace {

int show_command(const std::string& name, const std::vector<std::string>& files) {
  const auto pool = scenario_pool(files, false);
  const scenarios::Scenario& s = find_named(pool, name);
  fmt::print("{}\n", scenarios::describe(s));
  fmt::print("N = {} valid tokens; per rank:", s.global_token_count());
  for (int rank = 0; rank < s.world_size; ++rank) fmt::print(" {}", s.rank_token_count(rank));
  fmt::print("\n");
  harness::DeterminismGuard guard;
  const oracles::OracleResult oracle =
      oracles::run_oracle(s, harness::model_config_for(harness::find_variant("baseline"), s));
  fmt::print("contract: {}\n", oracle.contract);
  for (std::size_t step = 0; step < oracle.steps.size(); ++step) {
    fmt::print("oracle step {}: loss {:.9g}, grad norm {:.9g}, clip coef {:.6g}\n", step,
               oracle.steps[step].loss, oracle.steps[step].total_norm, oracle.steps[step].clip_coef);
  }
  for (const scenarios::ExpectedVerdict& e : s.expected_verdicts) {
    fmt::print("documented finding: {} -> {}: {}\n", e.variant_pattern, e.verdict, e.reason);
  }
  return kExitAsExpected;
}

class ShowCommand : public Subcommand {
 public:
  explicit ShowCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand("show", "describe one scenario and its oracle");
    app_->footer("The guide: docs/scenarios.md.");
    app_->add_option("scenario", name_, "scenario name")->required();
    app_->add_option("--scenario-file,-f", files_, "TOML scenario file (repeatable)")
        ->check(readable_file());
  }

  int run() override {
    return show_command(name_, files_);
  }

 private:
  std::string name_;
  std::vector<std::string> files_;
};

}  // namespace

std::unique_ptr<Subcommand> add_show_command(CLI::App& app) { return std::make_unique<ShowCommand>(app); }

}  // namespace gradnorm::tools
