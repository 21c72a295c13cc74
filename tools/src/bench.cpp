#include "bench.hpp"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/scenarios/catalogue.hpp"
#include "process_supervisor.hpp"

namespace gradnorm::tools {
namespace {

// The catalogue's ragged float32 scenario for a world size.
std::string scenario_for(int ranks) {
  switch (ranks) {
    case 2: return "dist/5-3/float32";
    case 4: return "dist/8-0-0-0/float32";
    case 8: return "dist/8-ranks-ragged/float32";
    case 32: return "dist/32-ranks-ragged/float32";
    case 64: return "dist/64-ranks-ragged/float32";
    default: break;
  }
  throw scenarios::InvalidInput(fmt::format("bench: no catalogue scenario with {} ranks (have 2, 4, 8, 32, 64)", ranks));
}

struct Measurement {
  double median_seconds = 0;
  double min_seconds = 0;
  long peak_kib = 0;
  bool ok = false;
};

Measurement measure(const std::string& launcher, int ranks, int repeat, int accumulation = 0,
                    int length = 0) {
  char path[] = "/tmp/gradnorm-bench-XXXXXX";
  const int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  std::vector<std::string> args = self_command();
  for (const std::string& word : {std::string("bench-one"), launcher, std::to_string(ranks),
                                  std::to_string(repeat), std::string(path)}) {
    args.push_back(word);
  }
  if (accumulation > 0) {
    args.push_back(std::to_string(accumulation));
    args.push_back(std::to_string(length));
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Measurement m;
  const pid_t child = fork();
  if (child == 0) {
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (child > 0 && wait4(child, &status, 0, &usage) == child && WIFEXITED(status) &&
      WEXITSTATUS(status) == 0) {
    std::ifstream in(path);
    long children_peak = 0;
    in >> m.median_seconds >> m.min_seconds >> children_peak;
    // Threads: the measuring process holds every rank. Processes: its largest rank.
    m.peak_kib = launcher == "threads" ? usage.ru_maxrss : children_peak;
    m.ok = static_cast<bool>(in);
  }
  std::remove(path);
  return m;
}

}  // namespace

// The growth tables' scenario: W ranks, A micro-batches of one sequence of T labels, ragged
// counts (rank r holds about (r + 1) / W of T), the stream's tiny causal LM in float32.
scenarios::Scenario growth_scenario(int ranks, int accumulation, int length) {
  scenarios::Scenario s;
  s.name = fmt::format("bench/W{}-A{}-T{}", ranks, accumulation, length);
  s.world_size = ranks;
  s.accumulation_steps = accumulation;
  s.micro_batch_size = 1;
  s.sequence_length = length + 1;
  s.vocab_size = 32;
  s.hidden_size = 16;
  s.seed = 7;
  s.valid_tokens.assign(static_cast<std::size_t>(ranks), std::vector<int>(static_cast<std::size_t>(accumulation)));
  for (int r = 0; r < ranks; ++r) {
    for (int m = 0; m < accumulation; ++m) {
      s.valid_tokens[static_cast<std::size_t>(r)][static_cast<std::size_t>(m)] =
          std::max(1, static_cast<int>(static_cast<long>(length) * (r + 1) / ranks));
    }
  }
  scenarios::validate(s);
  return s;
}

int bench_one_command(const std::string& launcher, int ranks, int repeat, const std::string& out_path,
                      int accumulation, int length) {
  const scenarios::Scenario s = accumulation > 0 ? growth_scenario(ranks, accumulation, length)
                                                 : scenarios::find_scenario(scenario_for(ranks));
  // Rank processes find a generated scenario in a file of its own.
  std::string scenario_file;
  if (accumulation > 0 && launcher == "processes") {
    scenario_file = out_path + ".toml";
    std::ofstream(scenario_file) << fmt::format(
        "[[scenario]]\nname = \"{}\"\nseed = {}\nvalid_tokens = {}\nmicro_batch_size = 1\n"
        "sequence_length = {}\nvocab_size = 32\nhidden_size = 16\n",
        s.name, s.seed, fmt::format("{}", s.valid_tokens), s.sequence_length);
  }
  const harness::VariantSpec& baseline = harness::find_variant("baseline");
  std::vector<double> seconds;
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (launcher == "threads") {
      harness::DeterminismGuard guard;
      const harness::RankedRun run = harness::run_in_threads(baseline, s);
      if (run.fault) return kExitRankFailed;
    } else {
      const int code = supervise(SupervisorOptions{
          .processes = ranks,
          .timeout = std::chrono::seconds(60),
          .rank_arguments = scenario_file.empty()
                                ? std::vector<std::string>{"run", "--launcher", "env", "-s", s.name,
                                                           "-v", "baseline", "-q"}
                                : std::vector<std::string>{"run", "--launcher", "env", "-f",
                                                           scenario_file, "-v", "baseline", "-q"},
          .rank0_prints = false});
      if (code != 0) return code;
    }
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  struct rusage children {};
  getrusage(RUSAGE_CHILDREN, &children);
  std::ofstream(out_path) << seconds[seconds.size() / 2] << " " << seconds.front() << " "
                          << children.ru_maxrss << "\n";
  if (!scenario_file.empty()) std::remove(scenario_file.c_str());
  return 0;
}

int bench_command(const BenchOptions& options) {
  fmt::print("gradnorm bench: one optimizer step of `baseline` per run, median of {} runs, each\n"
             "configuration in a fresh process. Process runs include starting every rank.\n\n",
             options.repeat);
  fmt::print("{:<10} {:>6} {:<30} {:>12} {:>12} {:>16}\n", "launcher", "ranks", "scenario",
             "median s", "min s", "peak RSS MiB");
  bool all_ok = true;
  auto row = [&](const std::string& launcher, int ranks) {
    const Measurement m = measure(launcher, ranks, options.repeat);
    all_ok = all_ok && m.ok;
    if (!m.ok) {
      fmt::print("{:<10} {:>6} {:<30} failed\n", launcher, ranks, scenario_for(ranks));
      return;
    }
    const std::string memory = launcher == "threads"
                                   ? fmt::format("{:.0f}", m.peak_kib / 1024.0)
                                   : fmt::format("{:.0f} per rank", m.peak_kib / 1024.0);
    fmt::print("{:<10} {:>6} {:<30} {:>12.4f} {:>12.4f} {:>16}\n", launcher, ranks,
               scenario_for(ranks), m.median_seconds, m.min_seconds, memory);
  };
  for (int ranks : options.thread_ranks) row("threads", ranks);
  for (int ranks : options.process_ranks) row("processes", ranks);
  return all_ok ? 0 : 1;
}

namespace {

double upper_median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Seconds per run of `v` on `s` (threads), one sample; nothing judged.
double time_run(const harness::VariantSpec& v, const scenarios::Scenario& s) {
  harness::DeterminismGuard guard;
  const auto start = std::chrono::steady_clock::now();
  const harness::RankedRun run = harness::run_in_threads(v, s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (run.fault) throw scenarios::InvalidInput(fmt::format("bench: {} x {}: {}", s.name, v.name, *run.fault));
  return seconds;
}

}  // namespace

int python_bench_command(const std::string& python_variant, const std::string& cpp_variant,
                         int repeat, double startup_seconds,
                         const std::function<scenarios::Scenario(scenarios::Scenario)>& adapt) {
  const harness::VariantSpec& py = harness::find_variant(python_variant);
  const harness::VariantSpec& cpp = harness::find_variant(cpp_variant);
  fmt::print("gradnorm bench: {} (Python) against {} (C++), ranks as threads, median of {} runs\n"
             "each, alternating; one run = every rank's whole optimizer step(s), models built.\n"
             "Loading the Python step took {:.3f} s (interpreter start and import torch included "
             "when it was the first).\n\n",
             py.name, cpp.name, repeat, startup_seconds);
  fmt::print("{:<44} {:>6} {:>6} {:>12} {:>12} {:>14} {:>8}\n", "scenario", "ranks", "steps",
             "C++ ms", "Python ms", "overhead ms", "ratio");
  for (const char* name : {"single/n5/float32", "single/accum2-ragged/float32",
                           "single/n5-momentum-3steps/float32", "dist/5-3/float32",
                           "dist/8-ranks-ragged/float32", "dist/32-ranks-ragged/float32"}) {
    const scenarios::Scenario s = adapt ? adapt(scenarios::find_scenario(name)) : scenarios::find_scenario(name);
    if (harness::not_applicable(py, s) || harness::not_applicable(cpp, s)) continue;
    // A model from a file is built once before it is timed, as `run` builds it before any row.
    if (scenarios::model_from_file(s.model)) (void)harness::make_model(s, harness::ModelConfig{s.model});
    std::vector<double> cpp_seconds, py_seconds;
    (void)time_run(cpp, s);  // warm both once
    (void)time_run(py, s);
    for (int i = 0; i < repeat; ++i) {
      cpp_seconds.push_back(time_run(cpp, s));
      py_seconds.push_back(time_run(py, s));
    }
    const double c = upper_median(cpp_seconds) * 1e3, p = upper_median(py_seconds) * 1e3;
    fmt::print("{:<44} {:>6} {:>6} {:>12.3f} {:>12.3f} {:>14.3f} {:>7.2f}x\n", s.name, s.world_size,
               s.steps, c, p, (p - c) / s.steps, p / c);
  }
  fmt::print("\noverhead ms is per optimizer step of the whole run (every rank together).\n");
  return 0;
}

namespace {

// Median seconds of `body` over `repeat` runs, after one warm-up run.
template <typename Body>
double median_seconds(int repeat, Body&& body) {
  body();
  std::vector<double> seconds;
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return upper_median(seconds);
}

}  // namespace

int scale_pass_bench_command(long max_elements, int repeat) {
  harness::DeterminismGuard guard;  // one intra-op thread, as every run of the harness
  fmt::print("gradnorm bench --scale-pass: p.grad *= scaler over every gradient (the pass the "
             "pull request skips),\nmedian of {} runs, one thread. \"copy\" is a tensor copy "
             "of the same size: the pass reads and writes each\nelement once, as a copy does, "
             "so their ratio says how close the pass is to memory bandwidth.\n\n",
             repeat);
  fmt::print("{:>14} {:<9} {:>11} {:>11} {:>12} {:>9} {:>18}\n", "elements", "dtype", "scale ms",
             "copy ms", "scale GB/s", "scale/copy", "ms per 10^9 elems");
  for (long n = 1'000'000; n <= max_elements; n *= 10) {
    for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      // Parameter-sized pieces, as a model's gradients are: 1,000 tensors, or fewer when small.
      const long pieces = std::min<long>(1000, n / 1000);
      std::vector<at::Tensor> grads;
      for (long i = 0; i < pieces; ++i) grads.push_back(at::ones({n / pieces}, at::TensorOptions().dtype(dtype)));
      std::vector<at::Tensor> targets;
      for (const at::Tensor& g : grads) targets.push_back(at::empty_like(g));
      const at::Tensor scaler = at::scalar_tensor(1.0f, at::kFloat);  // exact: the data stays 1
      const double scale = median_seconds(repeat, [&] {
        for (at::Tensor& g : grads) g.mul_(scaler);
      });
      const double copy = median_seconds(repeat, [&] {
        for (std::size_t i = 0; i < grads.size(); ++i) targets[i].copy_(grads[i]);
      });
      const double bytes = 2.0 * static_cast<double>(n) * static_cast<double>(c10::elementSize(dtype));
      fmt::print("{:>14} {:<9} {:>11.3f} {:>11.3f} {:>12.1f} {:>9.2f} {:>18.1f}\n", n,
                 dtype == at::kFloat ? "float32" : "bfloat16", scale * 1e3, copy * 1e3,
                 bytes / scale / 1e9, scale / copy, scale * 1e3 * 1e9 / static_cast<double>(n));
    }
  }
  // A full step of the built-in causal LM, for scale: the pass against everything else.
  fmt::print("\nAgainst a whole optimizer step (forward, backward, scale pass, SGD) of the built-in "
             "causal LM, one rank, one micro-batch of 4 x 128 tokens, vocab 2048:\n");
  fmt::print("{:>8} {:>12} {:>12} {:>12} {:>14}\n", "hidden", "parameters", "step ms", "scale ms",
             "scale / step");
  for (const int hidden : {256, 512, 1024}) {
    scenarios::Scenario s;
    s.name = fmt::format("bench/scale-pass/h{}", hidden);
    s.vocab_size = 2048;
    s.hidden_size = hidden;
    s.micro_batch_size = 4;
    s.sequence_length = 129;
    s.valid_tokens = {{4 * 128}};
    s.dtype = scenarios::DType::float32;
    const harness::VariantSpec& baseline = harness::find_variant("baseline");
    const double step = median_seconds(repeat, [&] { (void)harness::run_single_device(baseline, s); });
    const std::unique_ptr<harness::Model> model = harness::make_model(s, harness::model_config_for(baseline, s));
    long parameters = 0;
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : model->trainable_tensors()) {
      parameters += p.numel();
      grads.push_back(at::ones_like(p).detach());
    }
    const at::Tensor scaler = at::scalar_tensor(1.0f, at::kFloat);
    const double scale = median_seconds(repeat, [&] {
      for (at::Tensor& g : grads) g.mul_(scaler);
    });
    fmt::print("{:>8} {:>12} {:>12.2f} {:>12.3f} {:>13.2f}%\n", hidden, parameters, step * 1e3,
               scale * 1e3, 100.0 * scale / step);
  }
  return 0;
}

int growth_bench_command(int repeat) {
  fmt::print("gradnorm bench --growth: seconds and peak memory per case (one optimizer step of "
             "baseline, its\nmodel and batches built), median of {} runs, each configuration in a "
             "fresh process; process\nruns include starting every rank. Causal LM, vocab 32, "
             "hidden 16, float32, ragged counts.\n",
             repeat);
  bool all_ok = true;
  auto table = [&](const char* title, const std::vector<std::array<int, 3>>& shapes) {
    fmt::print("\n{}\n{:<10} {:>4} {:>4} {:>6} {:>12} {:>14} {:>16}\n", title, "launcher", "W",
               "A", "T", "median s", "s per token", "peak RSS MiB");
    for (const char* launcher : {"threads", "processes"}) {
      for (const auto& [w, a, t] : shapes) {
        if (std::string(launcher) == "processes" && w > 16) continue;  // 2 cores: minutes each
        const Measurement m = measure(launcher, w, repeat, a, t);
        all_ok = all_ok && m.ok;
        if (!m.ok) {
          fmt::print("{:<10} {:>4} {:>4} {:>6} failed\n", launcher, w, a, t);
          continue;
        }
        const double tokens = static_cast<double>(growth_scenario(w, a, t).global_token_count());
        fmt::print("{:<10} {:>4} {:>4} {:>6} {:>12.4f} {:>14.3g} {:>16.0f}\n", launcher, w, a, t,
                   m.median_seconds, m.median_seconds / tokens, m.peak_kib / 1024.0);
      }
    }
  };
  table("world size (A = 1, T = 64):", {{1, 1, 64}, {2, 1, 64}, {4, 1, 64}, {8, 1, 64}, {16, 1, 64},
                                         {32, 1, 64}, {64, 1, 64}});
  table("sequence length (W = 2, A = 1):", {{2, 1, 64}, {2, 1, 256}, {2, 1, 1024}, {2, 1, 4096}});
  table("accumulation (W = 2, T = 64):", {{2, 1, 64}, {2, 2, 64}, {2, 4, 64}, {2, 8, 64}, {2, 16, 64}});
  return all_ok ? 0 : 1;
}

}  // namespace gradnorm::tools
