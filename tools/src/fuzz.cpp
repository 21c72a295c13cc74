#include "fuzz.hpp"

#include <fmt/format.h>
#include <rapidcheck.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/oracles/properties.hpp"
#include "gradnorm/scenarios/generators.hpp"

namespace gradnorm::tools {

int fuzz_command(const FuzzOptions& options) {
  // rapidcheck reads its configuration once, from RC_PARAMS, at its first use.
  const std::string params = fmt::format("seed={} max_success={}", options.seed, options.cases);
  setenv("RC_PARAMS", params.c_str(), 1);
  fmt::print("gradnorm fuzz: {} cases per property, seed {} (replay with the same flags)\n",
             options.cases, options.seed);
  std::fflush(stdout);
  harness::DeterminismGuard guard;
  namespace p = oracles::properties;
  // Throughput: every case a property ran (shrinking steps included), over the wall time.
  long ran = 0;
  const auto start = std::chrono::steady_clock::now();
  auto throughput = [&] {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double rate = ran / seconds;
    fmt::print("{} cases in {:.2f} s: {:.{}f} cases per second\n", ran, seconds, rate, rate < 10 ? 1 : 0);
  };
  using scenarios::GeneratorOptions;
  bool held = true;
  // A step held to the oracle where its reference agrees, check by check; the counts say
  // how many cases judged each check.
  auto check_step = [&](const std::string& label, const std::string& name, auto generate) {
    p::CheckTally tally;
    held &= rc::check(label, [&ran, &tally, &options, name, generate] {
      const scenarios::Scenario s = generate();
      RC_PRE(!harness::not_applicable(harness::find_variant(name), s));
      if (!options.judge_on_ranks) {
        ++ran;
        p::agrees_where_reference_does(name, s, &tally);
        return;
      }
      // The case on its own rank processes: rank 0 judged it, as agrees_where_reference_does
      // judges in this process.
      const RankJudgement judgement = options.judge_on_ranks(s, name);
      if (judgement.skipped) RC_DISCARD(*judgement.skipped);
      ++ran;
      tally.count(judgement.judged, judgement.disagreements);
      RC_CLASSIFY(!judgement.reference_agrees, "reference itself disagrees on some check");
      if (!judgement.disagreements.empty()) {
        RC_LOG() << judgement.explanation << "\nreplay it: " << options.replay(s, name) << "\n";
        std::string checks;
        for (const std::string& check : judgement.disagreements) checks += (checks.empty() ? "" : ", ") + check;
        RC_FAIL(name + " disagrees with the oracle on " + checks + ", where its reference agrees");
      }
    });
    fmt::print("  checks judged: {}\n", p::describe(tally));
    std::fflush(stdout);
  };
  // With rank processes, the world sizes asked for: one device where the range holds 1,
  // generated ranks where it reaches 2.
  const scenarios::WorldSizes sizes = options.processes;
  const bool on_processes = sizes.max > 0;
  const bool one_device = !on_processes || sizes.min <= 1;
  const bool ranks = !on_processes || sizes.max >= 2;
  const scenarios::WorldSizes rank_sizes =
      on_processes ? scenarios::WorldSizes{std::max(2, sizes.min), sizes.max} : scenarios::WorldSizes{};
  if (options.recipe_model) {
    // A recipe builds a torchtune decoder from a Python file and trains it in fp32 or bf16
    // with torchtune's own losses: generated windows, masks, optimizers, clipping, steps and
    // seeds, on that model, with the first label masked or valid.
    const auto adapt = options.recipe_model;
    auto to_recipe = [adapt](scenarios::Scenario s) {
      s.model = scenarios::ModelKind::causal_lm;
      if (s.dtype == scenarios::DType::float64) s.dtype = scenarios::DType::float32;
      s.loss = *scenarios::any_of({scenarios::LossKind::mean_ce, scenarios::LossKind::chunked_ce});
      s.loss_chunks = *rc::gen::inRange(1, s.sequence_length + 1);
      s.first_label = *scenarios::any_of({scenarios::FirstLabel::masked, scenarios::FirstLabel::valid});
      return adapt(std::move(s));
    };
    const rc::Gen<scenarios::Scenario> recipe_scenarios = rc::gen::exec(
        [to_recipe] { return to_recipe(*scenarios::single_device_scenarios()); });
    const rc::Gen<scenarios::Scenario> recipe_rank_scenarios = rc::gen::exec(
        [to_recipe, rank_sizes] { return to_recipe(*scenarios::multi_rank_scenarios(rank_sizes)); });
    for (const std::string& pattern : options.variants) {
      for (const harness::VariantSpec& v : harness::select_variants(pattern)) {
        const std::string name = v.name;
        if (one_device) {
          check_step(name + " agrees where its reference does, on one device", name,
                     [recipe_scenarios] { return *recipe_scenarios; });
        }
        if (on_processes && ranks) {
          check_step(name + " agrees where its reference does, on rank processes", name,
                     [recipe_rank_scenarios] { return *recipe_rank_scenarios; });
        }
      }
    }
    throughput();
    fmt::print("{}\n", held ? "every property held" : "a property failed: see the counter-example above");
    return held ? 0 : 1;
  }
  if (!options.variants.empty()) {
    std::vector<std::string> names;
    for (const std::string& pattern : options.variants) {
      for (const harness::VariantSpec& v : harness::select_variants(pattern)) names.push_back(v.name);
    }
    const std::string where = on_processes ? " rank processes" : " ranks";
    for (const std::string& name : names) {
      if (one_device) {
        check_step(name + " agrees where its reference does, on one device", name,
                   [] { return *scenarios::single_device_scenarios(); });
      }
      if (!ranks) continue;
      check_step(name + " agrees where its reference does, on ragged" + where, name,
                 [rank_sizes] { return *scenarios::ragged_rank_scenarios(rank_sizes); });
      check_step(name + " agrees where its reference does, on any" + where, name,
                 [rank_sizes] { return *scenarios::multi_rank_scenarios(rank_sizes); });
    }
    throughput();
    fmt::print("{}\n", held ? "every property held" : "a property failed: see the counter-example above");
    return held ? 0 : 1;
  }
  held &= rc::check("baseline agrees with the oracle on one device", [&ran] {
    ++ran;
    p::baseline_agrees_with_the_oracle(*scenarios::single_device_scenarios());
  });
  held &= rc::check("baseline agrees with the oracle on any ranks", [&ran] {
    ++ran;
    p::baseline_agrees_with_the_oracle_on_ranks(*scenarios::multi_rank_scenarios());
  });
  held &= rc::check("skip agrees on one device when every micro-batch holds a token", [&ran] {
    ++ran;
    p::skip_agrees_on_one_device(*scenarios::single_device_scenarios(GeneratorOptions{.min_count = 1}));
  });
  held &= rc::check("a dropped scale pass is flagged exactly when W/N != 1", [&ran] {
    ++ran;
    p::dropped_scale_flagged_exactly_when_visible(*scenarios::ragged_rank_scenarios());
  });
  held &= rc::check("token weights follow the arithmetic on ragged ranks", [&ran] {
    ++ran;
    p::token_weights_follow_the_arithmetic(*scenarios::ragged_rank_scenarios());
  });
  held &= rc::check("skip passes iff ranks are balanced", [&ran] {
    ++ran;
    p::skip_passes_iff_ranks_are_balanced(*scenarios::ragged_rank_scenarios());
  });
  throughput();
  fmt::print("{}\n", held ? "every property held" : "a property failed: see the counter-example above");
  return held ? 0 : 1;
}

}  // namespace gradnorm::tools
