// `gradnorm bench`: seconds per scenario and peak memory (tools/src/bench.cpp, floor_bench.cpp),
// and `bench-one`, the one measurement bench runs in a child process.
#include <chrono>

#include "../command_line.hpp"
#include "../bench.hpp"
#include "../floor_bench.hpp"
#include "../rank_bench.hpp"

namespace gradnorm::tools {
namespace {

class BenchCommand : public Subcommand {
 public:
  explicit BenchCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand(
        "bench", "seconds per scenario and peak memory, ranks as threads and as Gloo processes");
    app_->footer("The guide: docs/speed.md.");
    app_->add_option("--repeat", options_.repeat, "runs per configuration (median reported)")
        ->check(CLI::Range(1, 1000));
    app_->add_option("--threads", options_.thread_ranks, "world sizes to run as threads")
        ->check(CLI::IsMember({2, 4, 8, 32, 64}));
    app_->add_option("--processes", options_.process_ranks, "world sizes to run as processes")
        ->check(CLI::IsMember({2, 4, 8, 32, 64}));
    add_python_step_options(*app_, python_step_, /*recipes=*/true);
    app_->add_option("--scale-pass", scale_pass_max_,
                      "time the scale pass the pull request skips, on 10^6 up to this many "
                      "gradient elements (e.g. 1000000000), against a copy and a whole step")
        ->check(CLI::Range(1'000'000L, 4'000'000'000L));
    app_->add_option("--against", against_,
                      "with --python-step: the C++ variant to time it against (default: "
                      "--findings-of, else --reference)");
    app_->add_option("--floor", floor_,
                      "time the per-case check of a stream file (`gradnorm stream`) written "
                      "straight against LibTorch on one thread, with no harness: the floor "
                      "under gradnorm's per-case cost")
        ->check(readable_file());
    app_->add_flag("--ranks", ranks_,
                    "time rank processes against the targets docs/speed.md sets: a forked rank's "
                    "start and memory, run --nproc 2 against threads, Trainer on 2 ranks against "
                    "one device, fuzz --nproc 2 cases per second (default --repeat 3)");
    app_->add_flag("--growth", growth_,
                    "tabulate time and peak memory per case against world size, sequence length "
                    "and accumulation, threads and processes");
  }

  int run() override {
    if (scale_pass_max_ > 0) return scale_pass_bench_command(scale_pass_max_, options_.repeat);
    if (growth_) return growth_bench_command(options_.repeat);
    if (ranks_) return rank_bench_command(app_->count("--repeat") > 0 ? options_.repeat : 3);
    if (!floor_.empty()) return floor_bench_command(floor_);
    if (python_step_.source.empty() && python_step_.recipe.empty()) {
      if (!against_.empty()) {  // it was silently ignored
        throw scenarios::InvalidInput("bench --against " + against_ +
                                      ": times a Python step against a C++ variant; give --python-step "
                                      "FILE.py (or --recipe)");
      }
      return bench_command(options_);
    }
    const auto start = std::chrono::steady_clock::now();
    const std::vector<std::string> declared = declare_steps(python_step_, {});
    const double startup =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string against = against_;
    if (against.empty()) {
      against = python_step_.findings_of.empty() ? python_step_.reference
                                                      : python_step_.findings_of;
    }
    const bool recipe = !python_step_.recipe.empty();
    return python_bench_command(
        declared.front(), against, options_.repeat, startup,
        [&](scenarios::Scenario s) {
          if (!recipe) return s;
          std::vector<scenarios::Scenario> one = with_recipe_model({std::move(s)}, python_step_, true);
          return one.front();
        });
  }

 private:
  BenchOptions options_;
  PythonStepOptions python_step_;
  std::string against_;
  long scale_pass_max_ = 0;
  std::string floor_;
  bool growth_ = false;
  bool ranks_ = false;
};

class BenchOneCommand : public Subcommand {
 public:
  explicit BenchOneCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand("bench-one", "one bench measurement (used by bench)");
    app_->group("");  // internal
    app_->add_option("launcher", launcher_)->required()->check(CLI::IsMember({"threads", "processes"}));
    app_->add_option("ranks", ranks_)->required();
    app_->add_option("repeat", repeat_)->required();
    app_->add_option("out", out_)->required();
    app_->add_option("accumulation", accumulation_);
    app_->add_option("length", length_);
  }

  int run() override {
    return bench_one_command(launcher_, ranks_, repeat_, out_, accumulation_, length_);
  }

 private:
  std::string launcher_, out_;
  int ranks_ = 0, repeat_ = 1;
  int accumulation_ = 0, length_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Subcommand>> add_bench_commands(CLI::App& app) {
  std::vector<std::unique_ptr<Subcommand>> out;
  out.push_back(std::make_unique<BenchCommand>(app));
  out.push_back(std::make_unique<BenchOneCommand>(app));
  return out;
}

}  // namespace gradnorm::tools
