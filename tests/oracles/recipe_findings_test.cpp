// The recipes' documented findings are the arithmetic their reasons state, measured on the
// observations themselves, each beside a control where the same check does not hold.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm {
namespace {

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).norm().item<double>() / want.norm().item<double>();
}

const std::vector<harness::NamedTensor>& consumed(const harness::RankedRun& run) {
  return run.ranks.front().steps.front().gradients;
}

// early_exit_finetune_distributed scales by 1 / num_tokens after FSDP's 1/W average: its
// gradients are the contract's divided by W, on balanced and ragged ranks alike.
TEST(RecipeFindings, EarlyExitGradientsAreTheContractsOverW) {
  harness::DeterminismGuard guard;
  for (const char* name : {"dist/4-4/float64", "dist/5-3/float64", "dist/8-ranks-ragged/float64"}) {
    const scenarios::Scenario& s = scenarios::find_scenario(name);
    const harness::VariantSpec& v = harness::find_variant("early-exit-distributed");
    const oracles::OracleResult oracle = oracles::run_oracle(s, harness::model_config_for(v, s));
    const harness::RankedRun run = harness::run_in_threads(v, s);
    ASSERT_FALSE(run.fault);
    const double w = s.world_size;
    for (std::size_t i = 0; i < consumed(run).size(); ++i) {
      const at::Tensor& got = consumed(run)[i].value;
      const at::Tensor& want = oracle.steps.front().gradients[i].value;
      // float64 gradients; the recipe's scale 1/N is a float32 scalar (2^-24 relative).
      EXPECT_LT(rel_error(got * w, want), 1e-6) << name << " " << consumed(run)[i].name;
      EXPECT_GT(rel_error(got, want), 0.4) << name << ": unscaled they must be off by 1 - 1/W";
    }
  }
}

// A max-norm of 0: full_finetune_single_device skips clipping (it consumes the unclipped
// gradients, exactly what it consumes with no clipping at all), the LoRA recipe clips them
// to zero as the contract says.
TEST(RecipeFindings, AZeroMaxNormSkipsClippingOnlyInTheFullSingleDeviceRecipe) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario& zero = scenarios::find_scenario("single/clip-zero/float32");
  scenarios::Scenario unclipped = zero;
  unclipped.clip_max_norm.reset();
  const auto full_zero = harness::run_single_device(harness::find_variant("baseline"), zero);
  const auto full_none = harness::run_single_device(harness::find_variant("baseline"), unclipped);
  ASSERT_EQ(full_zero.steps.size(), 1u);
  EXPECT_FALSE(full_zero.steps[0].grad_norm) << "no norm is logged when clipping is skipped";
  for (std::size_t i = 0; i < full_zero.steps[0].gradients.size(); ++i) {
    EXPECT_TRUE(at::equal(full_zero.steps[0].gradients[i].value, full_none.steps[0].gradients[i].value));
  }
  const auto lora_zero = harness::run_single_device(harness::find_variant("lora-baseline"), zero);
  ASSERT_TRUE(lora_zero.steps[0].grad_norm);
  for (const harness::NamedTensor& g : lora_zero.steps[0].gradients) {
    EXPECT_EQ(g.value.abs().max().item<double>(), 0.0) << g.name << ": clipped to zero";
  }
}

}  // namespace
}  // namespace gradnorm
