// The oracle checked by hand: softmax cross-entropy on a linear head has a closed-form
// gradient, computed here with plain loops (no autograd, no LibTorch reductions).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm {
namespace {

struct HandResult {
  std::vector<double> weight_grad;  // [V * H]
  std::vector<double> bias_grad;    // [V]
  double loss = 0;
};

HandResult by_hand(const scenarios::Scenario& s, const at::Tensor& weight, const at::Tensor& bias) {
  const int vocab = s.vocab_size, hidden = s.hidden_size;
  const at::Tensor w = weight.contiguous();
  const at::Tensor b = bias.contiguous();
  const double* W = w.data_ptr<double>();
  const double* B = b.data_ptr<double>();
  HandResult out;
  out.weight_grad.assign(static_cast<std::size_t>(vocab * hidden), 0.0);
  out.bias_grad.assign(static_cast<std::size_t>(vocab), 0.0);
  const double n = static_cast<double>(s.global_token_count());
  for (int rank = 0; rank < s.world_size; ++rank) {
    for (int micro = 0; micro < s.accumulation_steps; ++micro) {
      const auto batch = harness::make_micro_batch(s, rank, 0, micro);
      const at::Tensor x = batch.inputs.to(at::kDouble).contiguous();
      const auto labels = batch.labels.accessor<long, 2>();
      const double* X = x.data_ptr<double>();
      for (long seq = 0; seq < x.size(0); ++seq) {
        for (long t = 0; t < x.size(1); ++t) {
          const long y = labels[seq][t];
          if (y == harness::kIgnoreIndex) continue;
          const double* xi = X + (seq * x.size(1) + t) * hidden;
          std::vector<double> z(static_cast<std::size_t>(vocab));
          double top = -INFINITY;
          for (int v = 0; v < vocab; ++v) {
            z[v] = B[v];
            for (int h = 0; h < hidden; ++h) z[v] += W[v * hidden + h] * xi[h];
            top = std::max(top, z[v]);
          }
          double sum = 0;
          for (int v = 0; v < vocab; ++v) sum += std::exp(z[v] - top);
          out.loss += -(z[y] - top - std::log(sum)) / n;
          for (int v = 0; v < vocab; ++v) {
            const double dz = (std::exp(z[v] - top) / sum - (v == y ? 1.0 : 0.0)) / n;
            out.bias_grad[v] += dz;
            for (int h = 0; h < hidden; ++h) out.weight_grad[v * hidden + h] += dz * xi[h];
          }
        }
      }
    }
  }
  return out;
}

double max_relative_gap(const at::Tensor& got, const std::vector<double>& want) {
  const at::Tensor flat = got.to(at::kDouble).contiguous().reshape({-1});
  double scale = 0, gap = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    gap = std::max(gap, std::abs(flat[static_cast<long>(i)].item<double>() - want[i]));
  }
  return gap / scale;
}

TEST(Oracle, MatchesTheClosedFormGradientOfALinearHead) {
  harness::DeterminismGuard guard;
  scenarios::Scenario s = scenarios::find_scenario("single/n5-linear-head/float64");
  s.valid_tokens = {{4, 3}};  // accumulation and ragged micro-batches, to exercise the concat
  s.accumulation_steps = 2;
  const auto oracle = oracles::run_oracle(s, harness::ModelConfig{scenarios::ModelKind::linear_head});
  ASSERT_FALSE(oracle.no_gradient);
  ASSERT_EQ(oracle.steps.size(), 1u);
  ASSERT_EQ(oracle.initial_parameters.size(), 2u);
  ASSERT_EQ(oracle.initial_parameters[0].name, "head.weight");
  const HandResult hand =
      by_hand(s, oracle.initial_parameters[0].value, oracle.initial_parameters[1].value);
  // float64 against float64 over sums of <= 7 tokens and 11 classes: a few roundings.
  EXPECT_LT(max_relative_gap(oracle.steps[0].gradients[0].value, hand.weight_grad), 1e-12);
  EXPECT_LT(max_relative_gap(oracle.steps[0].gradients[1].value, hand.bias_grad), 1e-12);
  EXPECT_NEAR(oracle.steps[0].loss, hand.loss, 1e-12 * hand.loss);
}

// Negative control: dividing by the count of one micro-batch instead of N is visible to the
// same comparison.
TEST(Oracle, HandGradientWithTheWrongCountIsDetected) {
  harness::DeterminismGuard guard;
  scenarios::Scenario s = scenarios::find_scenario("single/n5-linear-head/float64");
  const auto oracle = oracles::run_oracle(s, harness::ModelConfig{scenarios::ModelKind::linear_head});
  HandResult hand = by_hand(s, oracle.initial_parameters[0].value, oracle.initial_parameters[1].value);
  for (double& g : hand.bias_grad) g *= 5.0 / 4.0;
  EXPECT_GT(max_relative_gap(oracle.steps[0].gradients[1].value, hand.bias_grad), 0.1);
}

TEST(Oracle, ClipsWithPyTorchsFormulaAndStepsSgd) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario& s = scenarios::find_scenario("single/clip-active/float64");
  const auto plain = oracles::run_oracle(s, harness::ModelConfig{});
  ASSERT_EQ(plain.steps.size(), 1u);
  const auto& step = plain.steps[0];
  const double expected_coef = *s.clip_max_norm / (step.total_norm + 1e-6);
  EXPECT_DOUBLE_EQ(step.clip_coef, expected_coef);
  for (std::size_t i = 0; i < step.parameters_after.size(); ++i) {
    const at::Tensor expected =
        plain.initial_parameters[i].value - s.learning_rate * step.gradients[i].value;
    EXPECT_TRUE(at::allclose(step.parameters_after[i].value, expected, 0, 1e-15))
        << step.parameters_after[i].name;
  }
}

TEST(Oracle, NoValidTokenMeansNoGradient) {
  harness::DeterminismGuard guard;
  const auto oracle = oracles::run_oracle(scenarios::find_scenario("single/all-masked-mean_ce/float32"),
                                          harness::ModelConfig{});
  EXPECT_TRUE(oracle.no_gradient);
  EXPECT_TRUE(oracle.steps.empty());
  EXPECT_NE(oracle.contract.find("N == 0"), std::string::npos);
}

TEST(Oracle, FrozenLoraBaseHasNoGradientEntry) {
  harness::DeterminismGuard guard;
  const auto oracle = oracles::run_oracle(scenarios::find_scenario("single/n5-lora/float32"),
                                          harness::ModelConfig{scenarios::ModelKind::causal_lm, true});
  for (const auto& p : oracle.initial_parameters) {
    EXPECT_NE(p.name.find("lora_"), std::string::npos) << p.name << " is frozen but listed";
  }
}

// Determinism: the same scenarios give bit-identical observations run after run.
TEST(Determinism, TheSameScenarioGivesBitIdenticalObservations) {
  harness::DeterminismGuard guard;
  const auto scenarios_list = scenarios::select_scenarios("single/n5-momentum-3steps/*");
  const auto variants = harness::select_variants("*skip");
  const auto first = oracles::evaluate(scenarios_list, variants);
  const auto second = oracles::evaluate(scenarios_list, variants);
  ASSERT_EQ(first.rows.size(), second.rows.size());
  for (std::size_t i = 0; i < first.rows.size(); ++i) {
    const auto pair = oracles::compare_observations(
        first.rows[i].observation, second.rows[i].observation,
        harness::scalar_type(first.rows[i].scenario.dtype));
    EXPECT_TRUE(pair.bitwise_equal) << first.rows[i].scenario.name << " x "
                                    << first.rows[i].variant.name << ": " << pair.first_difference;
  }
}

}  // namespace
}  // namespace gradnorm
