#pragma once
// `gradnorm bench`: seconds per scenario and peak memory for ranks as threads and as Gloo
// processes. Prints figures; asserts nothing about them.

#include <functional>
#include <string>
#include <vector>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::tools {

struct BenchOptions {
  int repeat = 5;
  std::vector<int> thread_ranks{2, 8, 32};
  std::vector<int> process_ranks{2, 4, 8};
};

int bench_command(const BenchOptions& options);

// What the pull request's skip saves: the scale pass (p.grad *= scaler over every gradient)
// timed on parameter sets of 10^6 to `max_elements` elements in float32 and bfloat16, against
// a copy of the same size (this machine's memory bandwidth) and a full optimizer step of
// the built-in causal LM of the same size.
int scale_pass_bench_command(long max_elements, int repeat);

// The per-step cost of a Python step against its C++ counterpart, ranks as threads on the
// same scenarios, runs alternating; `startup_seconds` is what loading the step cost (the
// interpreter's start and `import torch` included, when it was the first).
// `adapt` turns each timed catalogue scenario into the one both steps run (a recipe's
// model substitution); identity by default.
int python_bench_command(const std::string& python_variant, const std::string& cpp_variant,
                         int repeat, double startup_seconds,
                         const std::function<scenarios::Scenario(scenarios::Scenario)>& adapt = {});

// One measurement in a fresh process (so its peak memory is its own): runs the catalogue
// scenario with `ranks` ranks `repeat` times and writes "median min" seconds to `out_path`.
// With `accumulation` > 0, a generated scenario of `ranks` ranks, `accumulation` micro-batches
// and sequences of `length` labels instead of the catalogue's.
int bench_one_command(const std::string& launcher, int ranks, int repeat, const std::string& out_path,
                      int accumulation = 0, int length = 0);

// How cost grows with world size (1..64), sequence length (64..4096) and accumulation
// (1..16), for threads and Gloo processes: seconds and peak memory per case.
int growth_bench_command(int repeat);

}  // namespace gradnorm::tools
