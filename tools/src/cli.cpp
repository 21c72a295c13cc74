// gradnorm: runs named scenarios x registered steps against the float64 oracle. Exit codes:
// 0 every row as expected, 1 some verdict was not what was expected, 2 usage or input
// error, 3 a rank failed (threw outside the recipe, exited or hung; the rank is named),
// 70 an internal error (a gradnorm bug: EX_SOFTWARE of sysexits.h), 74 a report that could
// not be written once the work was done (EX_IOERR: a full disk). Each subcommand lives
// in a file of its own (tools/src/commands/); this one builds the command line from them,
// runs the one chosen and turns what it throws into the exit status.
#include "gradnorm/tools/cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include <unistd.h>

#include "command_line.hpp"
#include "gradnorm/harness/communicator.hpp"
#include "gradnorm/harness/descendants.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/python/python_step.hpp"
#include "gradnorm/reports/report.hpp"
#include "process_supervisor.hpp"
#include "version.hpp"

namespace gradnorm::tools {

namespace {

class FuzzElsewhereCommand : public Subcommand {
 public:
  explicit FuzzElsewhereCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand("fuzz", "(in the gradnorm executable of a CMake build, not in this one)");
    app_->allow_extras();
    app_->prefix_command();
  }
  int run() override {
    throw scenarios::InvalidInput(
        "fuzz is not in the Python package's gradnorm: it is rapidcheck's, which Debian ships "
        "as a static library a Python extension cannot link. Build the gradnorm executable "
        "(scripts/build.sh) and run build/tools/gradnorm fuzz (docs/install.md)");
  }
};

}  // namespace

std::unique_ptr<Subcommand> add_fuzz_elsewhere_command(CLI::App& app) {
  return std::make_unique<FuzzElsewhereCommand>(app);
}

namespace {
CommandAdder g_add_fuzz = nullptr;  // what this process's command line was run with
}  // namespace

int run_commands_again(int argc, char** argv) { return run_commands(argc, argv, g_add_fuzz); }

int run_commands(int argc, char** argv, CommandAdder add_fuzz) {
  g_add_fuzz = add_fuzz;
  // The program ends when this returns (python::hold_interpreter_until_exit says why).
  struct HoldInterpreterAtReturn {
    ~HoldInterpreterAtReturn() { python::hold_interpreter_until_exit(); }
  } hold_at_return;
  // What the code under test started and left running ends with the command (declared after
  // hold_at_return, so it runs first). A forked copy of this process that returned here ends
  // only its own.
  harness::adopt_orphans();
  struct EndDescendantsAtReturn {
    pid_t owner = getpid();
    ~EndDescendantsAtReturn() {
      if (getpid() != owner) return;
      if (const int ended = harness::end_descendants(); ended > 0) {
        fmt::print(stderr,
                   "gradnorm: ended {} process{} that the code under test started and left "
                   "running: {} (docs/reliability.md)\n",
                   ended, ended == 1 ? "" : "es", harness::ended_descendants_named());
      }
    }
  } end_descendants_at_return;
  // Rank processes make their c10d Gloo groups through torch.distributed (gloo_groups.hpp);
  // models from Python files are built by the same interpreter (harness/model.hpp).
  python::install_gloo_groups();
  python::install_python_models();
  CLI::App app{"gradnorm: proves whether a training step normalises losses and gradients like "
               "a float64 oracle"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return tools::version_text(); });
  app.footer("The guide: README.md, then docs/ (docs/judging.md first).");

  // In the order `gradnorm --help` lists them.
  std::vector<std::unique_ptr<Subcommand>> commands;
  commands.push_back(add_run_command(app, argc, argv));
  commands.push_back(add_list_command(app));
  commands.push_back(add_show_command(app));
  commands.push_back(add_explain_command(app));
  commands.push_back(add_export_command(app));
  commands.push_back(add_stream_command(app));
  commands.push_back(add_fuzz != nullptr ? add_fuzz(app) : add_fuzz_elsewhere_command(app));
  for (std::unique_ptr<Subcommand>& bench : add_bench_commands(app)) commands.push_back(std::move(bench));
  commands.push_back(add_diff_command(app));
  commands.push_back(add_validate_report_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? kExitAsExpected : kExitUsage;
  }
  const bool running = app.got_subcommand("run");
  try {
    for (const std::unique_ptr<Subcommand>& command : commands) {
      if (command->chosen()) return command->run();
    }
  } catch (const scenarios::InvalidInput& error) {
    fmt::print(stderr, "gradnorm: {}\n", error.what());
    return kExitUsage;
  } catch (const reports::ReportWriteError& error) {
    fmt::print(stderr, "gradnorm: {} (after the run: nothing was written)\n", error.what());
    return kExitWriteFailed;
  } catch (const harness::RankExit&) {
    std::_Exit(4);  // an injected exit: vanish without a word, as a crashed rank would
  } catch (const std::filesystem::filesystem_error& error) {
    // A path the user gave that the checks before the work let through (a folder removed
    // under a run): an input error naming it, never a rank failure.
    fmt::print(stderr, "gradnorm: {}\n", error.what());
    return kExitUsage;
  } catch (const std::exception& error) {
    // A rank that failed outside the recipe: leave the cause for the supervisor. Exit 3
    // means a rank failed, so it needs a rank: this process's own (a rank process of a run),
    // or the one a communication error names.
    const std::string rank_text = process_rank() ? std::to_string(*process_rank()) : "";
    const char* rank = process_rank() ? rank_text.c_str() : running ? std::getenv("RANK") : nullptr;
    const bool communication = dynamic_cast<const harness::CommunicationError*>(&error) != nullptr ||
                               dynamic_cast<const harness::RankFailure*>(&error) != nullptr;
    if (!communication && rank == nullptr) {
      fmt::print(stderr,
                 "gradnorm: internal error (a bug in gradnorm, not in your input or step; "
                 "please report it with the command line): {}\n",
                 harness::first_line(error.what()));
      return kExitInternal;
    }
    const std::string cause =
        communication ? harness::first_line(error.what())
                      : fmt::format("rank {} threw: {}", rank, harness::first_line(error.what()));
    write_rank_status(rank ? std::atoi(rank) : -1, cause);
    fmt::print(stderr, "gradnorm: {}\n", cause);
    return kExitRankFailed;
  }
  return kExitUsage;
}

}  // namespace gradnorm::tools
