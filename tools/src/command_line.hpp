#pragma once
// What the subcommands share (tools/src/commands/, one file per subcommand; cli.cpp builds
// the command line from them): exit statuses, option checks, choosing scenarios and
// variants, and the Python steps and recipes a command declares.
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradnorm/harness/variant.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::tools {

struct SupervisorOptions;

constexpr int kExitAsExpected = 0;
constexpr int kExitUnexpected = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 70;
constexpr int kExitWriteFailed = 74;  // reports::ReportWriteError

// A file option's check (files.hpp): the message says what the path is (a folder, a FIFO, a
// device, a symbolic link loop), where CLI::ExistingFile said "does not exist" of a loop.
[[nodiscard]] const CLI::Validator& readable_file();
// CLI11's Range lets NaN through (every comparison with it is false): refused, and the
// infinities, by name.
[[nodiscard]] const CLI::Validator& finite_number();
// CLI11 reads "-1" into an unsigned seed as 2^64 - 1 and saturates 2^64: a seed is digits
// that fit 64 bits, or an error.
[[nodiscard]] const CLI::Validator& seed_number();

// This process's rank when it runs as one (--launcher env or slurm), for naming it when it fails.
[[nodiscard]] std::optional<int>& process_rank();

// One subcommand, added to the command line by its add_*_command; run() once the command
// line parsed and chose it. Bad input throws scenarios::InvalidInput (exit 2).
class Subcommand {
 public:
  explicit Subcommand(CLI::App* app) : app_(app) {}
  virtual ~Subcommand() = default;
  [[nodiscard]] bool chosen() const { return app_->parsed(); }
  virtual int run() = 0;

 protected:
  CLI::App* app_;
};

// The catalogue plus every scenario file; only the files' scenarios when `files_only`.
[[nodiscard]] std::vector<scenarios::Scenario> scenario_pool(const std::vector<std::string>& files,
                                                             bool files_only);
// What the patterns select from the catalogue and the files (only the files' scenarios when
// files are given and no pattern is).
[[nodiscard]] std::vector<scenarios::Scenario> pick_scenarios(const std::vector<std::string>& patterns,
                                                              const std::vector<std::string>& files);
[[nodiscard]] const scenarios::Scenario& find_named(const std::vector<scenarios::Scenario>& pool,
                                                    const std::string& name);
[[nodiscard]] std::vector<harness::VariantSpec> pick_variants(const std::vector<std::string>& patterns);

// A step written in Python, or a framework's recipe, from the command line.
struct PythonStepOptions {
  std::string source;  // FILE.py[:FUNCTION]; empty: none
  std::string name;
  std::string reference = "baseline";
  std::string role = "candidate";
  std::string findings_of;
  // Real framework code (--recipe FRAMEWORK:TARGET), its config overrides, and the model it
  // gives scenarios whose model is built in.
  std::string recipe;
  std::vector<std::string> recipe_args;
  std::string recipe_model;
};

// `recipes`: the command also takes --recipe (run, bench and fuzz).
void add_python_step_options(CLI::App& command, PythonStepOptions& options, bool recipes = false);
// The options that give `step` again, as given (--python-step ..., --recipe ...): what a
// reproduce command and a rank process's command line carry.
[[nodiscard]] std::vector<std::string> python_step_arguments(const PythonStepOptions& step);

// Makes `supervisor` fork each rank from this process, with the interpreter, torch and the
// steps' modules it loaded (docs/ranks.md, "Warm rank processes"): the rank forgets the steps
// this process declared and declares them from its own command line.
void fork_ranks_warm(SupervisorOptions& supervisor);

// Registers the steps a command declares (--python-step, --recipe, and [[variant]] tables in
// the scenario files) and returns their names, in declaration order. Rank processes re-run
// the same command line, so each registers the same steps in its own interpreter.
std::vector<std::string> declare_steps(const PythonStepOptions& cli_step,
                                       const std::vector<std::string>& files);

// --recipe-model (or the framework's default) as a scenario's model fields: model python,
// its file made absolute, its function. Throws InvalidInput unless python:FILE.py:FUNCTION.
[[nodiscard]] scenarios::Scenario recipe_model_probe(const PythonStepOptions& step);

// A recipe builds its model with a framework builder, so a scenario whose model is built in
// (causal_lm) becomes the same scenario with the framework's model (--recipe-model), named
// FUNCTION/NAME; float64 ones are left out (torchtune trains in fp32 or bf16, its decoder's
// logits are float32). Other models stay, and the recipe says why it cannot run them.
[[nodiscard]] std::vector<scenarios::Scenario> with_recipe_model(std::vector<scenarios::Scenario> list,
                                                                 const PythonStepOptions& step, bool recipes);
// With Trainer or SFTTrainer, --recipe-arg max_grad_norm=V makes every scenario clip to V (V
// = 0: no clipping, as Trainer reads it), named NAME@max_grad_norm=V; V must be a number >= 0.
//
// -s patterns for a --recipe run: a pattern naming a scenario as the run reports it,
// FUNCTION/NAME[@max_grad_norm=V] (what `gradnorm diff` prints to reproduce a row; V this
// run's), selects NAME, which with_recipe_model then renames so. Other patterns, and every
// pattern without --recipe, stay.
[[nodiscard]] std::vector<std::string> recipe_scenario_patterns(std::vector<std::string> patterns,
                                                                const PythonStepOptions& step);

// Each adds its subcommand (its options, help and footer naming its page of the guide).
[[nodiscard]] std::unique_ptr<Subcommand> add_run_command(CLI::App& app, int argc, char** argv);
[[nodiscard]] std::unique_ptr<Subcommand> add_list_command(CLI::App& app);
[[nodiscard]] std::unique_ptr<Subcommand> add_show_command(CLI::App& app);
[[nodiscard]] std::unique_ptr<Subcommand> add_explain_command(CLI::App& app);
[[nodiscard]] std::unique_ptr<Subcommand> add_export_command(CLI::App& app);
[[nodiscard]] std::unique_ptr<Subcommand> add_stream_command(CLI::App& app);
[[nodiscard]] std::unique_ptr<Subcommand> add_fuzz_command(CLI::App& app);
// `fuzz` where it is not built in: says where it is (exit 2).
[[nodiscard]] std::unique_ptr<Subcommand> add_fuzz_elsewhere_command(CLI::App& app);

// The whole command line (cli.cpp), with the fuzz command ADD_FUZZ adds, or without it
// (nullptr). fuzz is rapidcheck's, and Debian's librapidcheck.a is not position-independent
// code, so the Python extension module (python_module.cpp), a shared object, cannot link
// it; gradnorm::cli's run_command_line does (cli_with_fuzz.cpp).
using CommandAdder = std::unique_ptr<Subcommand> (*)(CLI::App&);
int run_commands(int argc, char** argv, CommandAdder add_fuzz);
// A warm rank's command line: run_commands with what this process's was run with.
int run_commands_again(int argc, char** argv);
// bench, and bench-one (one measurement, hidden: bench runs it in a child process).
[[nodiscard]] std::vector<std::unique_ptr<Subcommand>> add_bench_commands(CLI::App& app);
[[nodiscard]] std::unique_ptr<Subcommand> add_diff_command(CLI::App& app);
[[nodiscard]] std::unique_ptr<Subcommand> add_validate_report_command(CLI::App& app);

}  // namespace gradnorm::tools
