// `gradnorm fuzz`: the harness's properties, or a step, over generated scenarios (tools/src/fuzz.cpp).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <regex>

#include "../command_line.hpp"
#include "../fuzz.hpp"
#include "../process_supervisor.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/python/python_step.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/scenario_file.hpp"
#include "gradnorm/tools/cli.hpp"

namespace gradnorm::tools {
namespace {

// The most rank processes one case may have: each is a copy of this process.
constexpr int kMaxFuzzRanks = 64;

// "W" or "W1-W2".
scenarios::WorldSizes parse_world_sizes(const std::string& text) {
  static const std::regex pattern(R"(([0-9]{1,3})(?:-([0-9]{1,3}))?)");
  std::smatch match;
  if (!std::regex_match(text, match, pattern)) {
    throw scenarios::InvalidInput(fmt::format(
        "--nproc {}: expected W or a range W1-W2 (the ranks each case has, as processes)", text));
  }
  const int low = std::stoi(match[1].str());
  const int high = match[2].matched ? std::stoi(match[2].str()) : low;
  if (low < 1 || high < low || high > kMaxFuzzRanks) {
    throw scenarios::InvalidInput(fmt::format(
        "--nproc {}: ranks run from 1 to {}, the smaller first", text, kMaxFuzzRanks));
  }
  return {low, high};
}

// Whether cases fork warm rank processes: unless GRADNORM_WARM_RANKS=0 (then each is exec'd).
bool fuzz_forks_warm() {
  const char* value = std::getenv("GRADNORM_WARM_RANKS");
  return value == nullptr || std::string(value) != "0";
}

// A folder of this run's own for each case's scenario file and judgement, removed at the end.
class CaseFolder {
 public:
  CaseFolder() {
    char pattern[] = "/tmp/gradnorm-fuzz-XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      throw std::runtime_error(fmt::format("cannot create a folder under /tmp for the cases: {}",
                                           std::strerror(errno)));
    }
    path_ = pattern;
  }
  ~CaseFolder() { remove(); }
  void remove() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  CaseFolder(const CaseFolder&) = delete;
  CaseFolder& operator=(const CaseFolder&) = delete;
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

class FuzzCommand : public Subcommand {
 public:
  explicit FuzzCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand(
        "fuzz", "check the harness's properties over many generated scenarios");
    app_->footer("The guide: docs/steps.md, docs/ranks.md (--nproc) and docs/reliability.md.");
    app_->add_option("--cases", options_.cases, "cases per property (default 1000)")
        ->check(CLI::Range(1, 100000000));
    app_->add_option("--variant,-v", options_.variants,
                     "fuzz this step (name or pattern, repeatable): it must agree with the oracle "
                     "wherever its reference does; default: the harness's own properties");
    app_->add_option("--seed", options_.seed, "generator seed; the same seed replays the same cases")
        ->check(seed_number());
    app_->add_option("--nproc", nproc_,
                     "each case's ranks as processes over c10d Gloo, W of them or a range W1-W2 "
                     "(generated world sizes; 1 is one device): a step or recipe that needs a "
                     "process group (DDP, FSDP2, Trainer on ranks) is fuzzed this way");
    app_->add_option("--timeout", timeout_seconds_,
                     "with --nproc: seconds a rank may wait in one collective, and a Python step "
                     "may run (default 60)")
        ->check(finite_number())
        ->check(CLI::Range(0.01, 86400.0));
    app_->add_option("--model", model_,
                     "python:FILE.py:FUNCTION: the model every generated case of a --python-step "
                     "trains (a step that needs its model's forward in Python: FSDP2's "
                     "fully_shard); the cases are then a recipe's (float32 or bfloat16, mean or "
                     "chunked loss)");
    add_python_step_options(*app_, python_step_, /*recipes=*/true);
  }

  int run() override {
    if (!nproc_.empty()) options_.processes = parse_world_sizes(nproc_);
    const bool on_processes = options_.processes.max > 0;
    if (on_processes && options_.variants.empty() && python_step_.source.empty() &&
        python_step_.recipe.empty()) {
      throw scenarios::InvalidInput(
          "fuzz --nproc: the harness's own properties run in this process; give the step to "
          "fuzz on rank processes (--python-step, --recipe or -v)");
    }
    if (!on_processes && app_->count("--timeout") > 0) {
      throw scenarios::InvalidInput("fuzz --timeout bounds rank processes: it goes with --nproc");
    }
    const std::chrono::milliseconds timeout(static_cast<long>(timeout_seconds_ * 1000));
    if (on_processes) python::set_step_timeout(timeout);
    // What a warm rank keeps of this registry: what was there before the steps were declared.
    harness::mark_registered_variants();
    const std::vector<std::string> declared = declare_steps(python_step_, {});
    if (on_processes) python::plan_for_rank_processes();
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
      // Without --nproc the generated scenarios run on one device, ranks as threads: a
      // recipe that needs more (a process group) is refused before any case runs.
      scenarios::Scenario probe = options_.recipe_model(scenarios::Scenario{});
      if (auto why = harness::not_applicable(harness::find_variant(declared.front()), probe);
          why && !on_processes) {
        throw scenarios::InvalidInput(fmt::format(
            "fuzz --recipe {}: {} (without --nproc, fuzz generates one-device scenarios and "
            "runs them in this process; fuzz it on rank processes with --nproc W)",
            python_step_.recipe, *why));
      }
    }
    if (!model_.empty()) {
      if (python_step_.source.empty()) {
        throw scenarios::InvalidInput(
            "fuzz --model gives a --python-step its model (a --recipe takes --recipe-model)");
      }
      PythonStepOptions model_only;
      model_only.recipe_model = model_;
      const scenarios::Scenario probe = recipe_model_probe(model_only);
      options_.recipe_model = [probe](scenarios::Scenario s) {
        s.model = probe.model;
        s.model_file = probe.model_file;
        s.model_function = probe.model_function;
        s.name = probe.model_function + "/" + s.name;
        return s;
      };
    }
    if (!on_processes) return fuzz_command(options_);

    CaseFolder folder;
    const std::string case_file = folder.file("case.toml");
    const std::string judgement_file = folder.file("judgement");
    const std::vector<std::string> step_arguments = python_step_arguments(python_step_);
    const bool warm = fuzz_forks_warm();
    fmt::print("gradnorm fuzz --nproc {}: each case's ranks are {} processes\n", nproc_,
               warm ? "warm forked" : "exec'd");
    options_.judge_on_ranks = [&, timeout](const scenarios::Scenario& s, const std::string& variant) {
      reports::write_file_atomically(case_file, scenarios::scenario_table(s));
      std::filesystem::remove(judgement_file);
      // The file alone: its one scenario, under the name it has there (a recipe's scenario
      // is named MODEL/NAME already, which -s would read as the catalogue's NAME).
      std::vector<std::string> arguments{"run", "--launcher", "env", "-q", "-j", "1",
                                         "-f", case_file, "-v", variant};
      const std::string reference = harness::find_variant(variant).reference;
      if (!reference.empty() && reference != variant) arguments.insert(arguments.end(), {"-v", reference});
      arguments.insert(arguments.end(), step_arguments.begin(), step_arguments.end());
      arguments.insert(arguments.end(), {"--timeout", fmt::format("{}", timeout_seconds_),
                                         "--judgement", judgement_file});
      std::string said;
      SupervisorOptions supervisor{.processes = s.world_size,
                                   .timeout = timeout,
                                   .rank_arguments = arguments,
                                   .rank0_prints = false,
                                   .said = &said};
      if (warm) fork_ranks_warm(supervisor);
      const int code = supervise(supervisor);
      if (code > 128) {
        // Interrupted: the run ends here, as every mode does on SIGINT and SIGTERM.
        folder.remove();
        std::fflush(stdout);
        std::_Exit(code);
      }
      if (code != kExitAsExpected) {
        RankJudgement failed;
        failed.disagreements = {"run"};
        failed.explanation = fmt::format("the rank processes ended with exit status {}: {}", code,
                                         said.empty() ? "(nothing said)" : said);
        return failed;
      }
      return read_rank_judgement(judgement_file);
    };
    options_.replay = [this](const scenarios::Scenario& s, const std::string& variant) {
      std::vector<std::string> command{"gradnorm", "run", "-f", "FILE", "--nproc",
                                       std::to_string(s.world_size), "-v", variant};
      const std::vector<std::string> step = python_step_arguments(python_step_);
      command.insert(command.end(), step.begin(), step.end());
      return fmt::format("{}  (FILE: the [[scenario]] table above)", fmt::join(command, " "));
    };
    return fuzz_command(options_);
  }

 private:
  FuzzOptions options_;
  PythonStepOptions python_step_;
  std::string nproc_;
  std::string model_;
  double timeout_seconds_ = 60;
};

}  // namespace

std::unique_ptr<Subcommand> add_fuzz_command(CLI::App& app) { return std::make_unique<FuzzCommand>(app); }

}  // namespace gradnorm::tools
