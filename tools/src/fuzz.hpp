#pragma once
// `gradnorm fuzz`: the harness's properties (oracles/properties.hpp) over many generated
// scenarios; what ctest runs bounded, run for as long as asked.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gradnorm/scenarios/generators.hpp"
#include "gradnorm/scenarios/scenario.hpp"
#include "rank_judgement.hpp"

namespace gradnorm::tools {

struct FuzzOptions {
  int cases = 1000;         // per property
  std::uint64_t seed = 1;   // the same seed replays the same scenarios
  // Steps to fuzz (names or patterns): each must agree with the oracle wherever its
  // reference does. Empty: the harness's own properties.
  std::vector<std::string> variants;
  // Real recipe code (--recipe): the generated single-device scenarios get their causal LM
  // replaced by the recipe's Python-file model, the one property fuzzed on them.
  std::function<scenarios::Scenario(scenarios::Scenario)> recipe_model{};
  // fuzz --nproc W or W1-W2: each case's ranks are processes, as many as its world size,
  // drawn from this range; {0, 0}: ranks as threads of this process.
  scenarios::WorldSizes processes{};
  // With processes: judges a step on one case on its rank processes (commands/fuzz.cpp).
  std::function<RankJudgement(const scenarios::Scenario&, const std::string& variant)> judge_on_ranks{};
  // With processes: how to run a counter-example again ("gradnorm run -f FILE --nproc W ...").
  std::function<std::string(const scenarios::Scenario&, const std::string& variant)> replay{};
};

// 0 when every property held; 1 with the smallest counter-example printed as a scenario.
int fuzz_command(const FuzzOptions& options);

}  // namespace gradnorm::tools
