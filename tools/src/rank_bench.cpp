#include "rank_bench.hpp"

#include <fmt/format.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gradnorm/python/python_step.hpp"
#include "process_supervisor.hpp"

namespace gradnorm::tools {
namespace {

struct Command {
  std::vector<std::string> arguments;          // after the program
  std::map<std::string, std::string> environment;  // added to ours
};

struct Outcome {
  double seconds = 0;
  int status = -1;
  std::string output;  // standard output and error together
};

// The command, as a child of this process (the same program), its output captured.
Outcome run_child(const Command& command) {
  char path[] = "/tmp/gradnorm-bench-XXXXXX";
  const int fd = mkstemp(path);
  Outcome outcome;
  if (fd < 0) return outcome;
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = fork();
  if (child == 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    for (const auto& [key, value] : command.environment) setenv(key.c_str(), value.c_str(), 1);
    std::vector<std::string> args = self_command();
    args.insert(args.end(), command.arguments.begin(), command.arguments.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int raw = 0;
  if (child > 0) waitpid(child, &raw, 0);
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  outcome.status = child > 0 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  outcome.output = text.str();
  std::filesystem::remove(path);
  return outcome;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Medians of `repeat` runs of each command, alternating (a, b, a, b, ...) so that a change in
// the machine's load falls on both. A run that does not exit 0 or 1 (verdicts) is reported.
std::optional<std::vector<double>> alternate(const std::vector<Command>& commands, int repeat,
                                             std::string* failure) {
  std::vector<std::vector<double>> seconds(commands.size());
  for (int r = 0; r < repeat; ++r) {
    for (std::size_t i = 0; i < commands.size(); ++i) {
      const Outcome outcome = run_child(commands[i]);
      if (outcome.status != 0 && outcome.status != 1) {
        std::string tail = outcome.output.substr(outcome.output.size() > 400 ? outcome.output.size() - 400 : 0);
        *failure = fmt::format("exit {}: {}", outcome.status, tail);
        return std::nullopt;
      }
      seconds[i].push_back(outcome.seconds);
    }
  }
  std::vector<double> out;
  for (const auto& s : seconds) out.push_back(median(s));
  return out;
}

void row(const std::string& target, const std::string& measured, bool met) {
  fmt::print("{:<58} {:<40} {}\n", target, measured, met ? "met" : "missed");
}

std::optional<double> cases_per_second(const std::string& output) {
  static const std::regex pattern(R"(([0-9]+) cases in ([0-9.]+) s)");
  std::smatch match;
  if (!std::regex_search(output, match, pattern)) return std::nullopt;
  return std::stod(match[1].str()) / std::stod(match[2].str());
}

}  // namespace

int rank_bench_command(int repeat) {
  const std::string& examples = python::examples_dir();
  const std::string step = examples + "/python/full_finetune.py";
  const std::map<std::string, std::string> warm{{"GRADNORM_WARM_RANKS", "1"}};
  fmt::print("gradnorm bench --ranks: whole commands, median of {} alternating runs each (a\n"
             "command's interpreter start and imports included); warm ranks forked\n"
             "(GRADNORM_WARM_RANKS=1), the Python step {}\n\n",
             repeat, step);
  fmt::print("{:<58} {:<40} {}\n", "target", "measured", "");
  std::string failure;

  // A forked rank: ready (its process group made) and what it holds alone, from the ranks'
  // own notes (GRADNORM_BENCH_READY), over `repeat` runs of 2 ranks.
  {
    const std::string notes = fmt::format("/tmp/gradnorm-bench-ready-{}", getpid());
    std::filesystem::remove(notes);
    Command ready{{"run", "--nproc", "2", "--python-step", step, "-s", "dist/5-3/float32", "-q"},
                  {{"GRADNORM_WARM_RANKS", "1"}, {"GRADNORM_BENCH_READY", notes}}};
    std::vector<double> ms;
    std::vector<double> kib;
    for (int r = 0; r < repeat; ++r) (void)run_child(ready);
    std::ifstream in(notes);
    int rank = 0;
    double m = 0;
    double k = 0;
    while (in >> rank >> m >> k) {
      ms.push_back(m);
      kib.push_back(k);
    }
    std::filesystem::remove(notes);
    if (ms.empty()) {
      row("a forked rank ready within 100 ms", "no rank said it was ready", false);
    } else {
      row("a forked rank ready (process group made) within 100 ms",
          fmt::format("{:.0f} ms (median of {} ranks)", median(ms), ms.size()), median(ms) <= 100);
      row("... holding within 40 MiB beyond its parent",
          fmt::format("{:.1f} MiB private", median(kib) / 1024), median(kib) / 1024 <= 40);
    }
  }

  // A Python step, 2 ranks: threads against warm processes.
  const std::vector<std::string> two{"-s", "dist/5-3/float32", "-s", "dist/accum2-ragged/float32", "-q"};
  {
    Command threads{{"run", "--python-step", step}, {}};
    threads.arguments.insert(threads.arguments.end(), two.begin(), two.end());
    Command processes = threads;
    processes.arguments.insert(processes.arguments.end(), {"--nproc", "2"});
    processes.environment = warm;
    if (auto s = alternate({threads, processes}, repeat, &failure)) {
      const double ratio = (*s)[1] / (*s)[0];
      row("run --nproc 2 (Python step) within 1.5x of threads",
          fmt::format("{:.2f} s vs {:.2f} s: {:.2f}x", (*s)[1], (*s)[0], ratio), ratio <= 1.5);
    } else {
      row("run --nproc 2 (Python step) within 1.5x of threads", "failed: " + failure, false);
    }
  }

  // Trainer: one device against 2 warm rank processes, one scenario each.
  {
    Command one{{"run", "--recipe", "transformers:trainer", "-s", "single/n5/float32", "-q"}, {}};
    Command ranks{{"run", "--recipe", "transformers:trainer", "-s", "dist/5-3/float32", "--nproc", "2", "-q"}, warm};
    if (auto s = alternate({one, ranks}, repeat, &failure)) {
      const double ratio = (*s)[1] / (*s)[0];
      row("Trainer on 2 ranks within 1.5x of one device",
          fmt::format("{:.2f} s vs {:.2f} s: {:.2f}x", (*s)[1], (*s)[0], ratio), ratio <= 1.5);
    } else {
      row("Trainer on 2 ranks within 1.5x of one device", "failed: " + failure, false);
    }
  }

  // Fuzzing on rank processes: the figure the command prints (forking, cases and shrinking).
  auto fuzz = [&](const std::string& target, Command command, double floor) {
    std::vector<double> rates;
    for (int r = 0; r < repeat; ++r) {
      const Outcome outcome = run_child(command);
      if (auto rate = cases_per_second(outcome.output)) rates.push_back(*rate);
    }
    if (rates.empty()) {
      row(target, "failed: no cases per second printed", false);
    } else {
      row(target, fmt::format("{:.1f} cases per second", median(rates)), median(rates) >= floor);
    }
  };
  fuzz("fuzz --nproc 2, the Python full-finetune step: >= 10 cases/s",
       {{"fuzz", "--python-step", step, "--nproc", "2", "--cases", "20", "--seed", "1"}, {}}, 10);
  fuzz("fuzz --recipe transformers:trainer --nproc 2: >= 1 case/s",
       {{"fuzz", "--recipe", "transformers:trainer", "--nproc", "2", "--cases", "5", "--seed", "3"}, {}}, 1);
  fmt::print("\nWhere a target is missed, docs/speed.md says where the time goes.\n");
  return 0;
}

}  // namespace gradnorm::tools
