// The oracle checked by hand: softmax cross-entropy on a linear head has a closed-form
// gradient, computed here with plain loops (no autograd, no LibTorch reductions).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/oracles/verdict.hpp"
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
  // The wrong count scales every entry by 5/4, a 25% gap; 0.1 sits far above the 1e-12 the
  // right count meets and well below 25%.
  EXPECT_GT(max_relative_gap(oracle.steps[0].gradients[1].value, hand.bias_grad), 0.1);
}

// sqrt of the sum of squares over every hand gradient entry, weight and bias: ||g*||_2.
double hand_norm(const HandResult& hand) {
  double squares = 0;
  for (double g : hand.weight_grad) squares += g * g;
  for (double g : hand.bias_grad) squares += g * g;
  return std::sqrt(squares);
}

std::vector<double> scaled(const std::vector<double>& values, double factor) {
  std::vector<double> out = values;
  for (double& v : out) v *= factor;
  return out;
}

// The step the optimizer took, after - before, elementwise in float64.
at::Tensor step_taken(const at::Tensor& before, const at::Tensor& after) {
  return after.to(at::kDouble) - before.to(at::kDouble);
}

// The linear-head scenario with `max_norm`, its oracle and its hand gradients; plain SGD
// without weight decay, so the update is exactly initial - lr * consumed.
struct ClipCase {
  scenarios::Scenario scenario;
  oracles::OracleResult oracle;
  HandResult hand;
};

ClipCase clip_case(double max_norm) {
  ClipCase out;
  out.scenario = scenarios::find_scenario("single/n5-linear-head/float64");
  out.scenario.clip_max_norm = max_norm;
  out.oracle = oracles::run_oracle(out.scenario, harness::ModelConfig{scenarios::ModelKind::linear_head});
  out.hand = by_hand(out.scenario, out.oracle.initial_parameters.at(0).value,
                     out.oracle.initial_parameters.at(1).value);
  return out;
}

// Clipping and the SGD step judged against figures computed from the hand gradients alone:
// the norm of the loops' gradients, PyTorch's coefficient min(1, max_norm / (norm + 1e-6)),
// the consumed gradients coef * g and the update -lr * coef * g. None of these reads the
// oracle's own total_norm, clip_coef or gradients.
TEST(Oracle, ClipsTheHandGradientWithPyTorchsFormulaAndStepsSgd) {
  harness::DeterminismGuard guard;
  constexpr double kMaxNorm = 0.01;
  const ClipCase c = clip_case(kMaxNorm);
  ASSERT_EQ(c.scenario.optimizer, scenarios::OptimizerKind::sgd);
  ASSERT_EQ(c.scenario.weight_decay, 0.0);
  ASSERT_EQ(c.oracle.steps.size(), 1u);
  ASSERT_EQ(c.oracle.initial_parameters.size(), 2u);
  const oracles::OracleStep& step = c.oracle.steps[0];
  ASSERT_EQ(step.gradients.size(), 2u);
  ASSERT_EQ(step.parameters_after.size(), 2u);

  const double norm = hand_norm(c.hand);
  ASSERT_GT(norm, 10 * kMaxNorm) << "clipping must be active for this test to mean anything";
  const double coef = std::min(1.0, kMaxNorm / (norm + 1e-6));
  ASSERT_LT(coef, 0.1);

  // float64 against float64 over sums of 5 tokens x 11 classes and 77 squares: a few
  // roundings of 1.1e-16 each, far below 1e-12.
  EXPECT_NEAR(step.total_norm, norm, 1e-12 * norm);
  // One division more than the norm: the same few roundings.
  EXPECT_NEAR(step.clip_coef, coef, 1e-12 * coef);
  // The 1e-6 PyTorch adds moves the coefficient by 1e-6 / norm (~7e-7) relative, over 100
  // times the 1e-12 bound above: a coefficient without it would be caught.
  EXPECT_GT(std::abs(kMaxNorm / norm - coef), 100 * 1e-12 * coef);

  const std::vector<double> weight_consumed = scaled(c.hand.weight_grad, coef);
  const std::vector<double> bias_consumed = scaled(c.hand.bias_grad, coef);
  // float64 against float64: the hand gradients' few roundings plus one product with coef.
  EXPECT_LT(max_relative_gap(step.gradients[0].value, weight_consumed), 1e-12);
  EXPECT_LT(max_relative_gap(step.gradients[1].value, bias_consumed), 1e-12);

  // The update read back as after - initial: that subtraction cancels parameters of order 1
  // against steps of order lr * coef * |g| (~1e-3), so the float64 rounding of a parameter
  // (1e-16) becomes ~1e-13 of the step; 1e-10 leaves room for that cancellation.
  const std::vector<double>* consumed[] = {&weight_consumed, &bias_consumed};
  for (std::size_t i = 0; i < 2; ++i) {
    const at::Tensor taken =
        step_taken(c.oracle.initial_parameters[i].value, step.parameters_after[i].value);
    EXPECT_LT(max_relative_gap(taken, scaled(*consumed[i], -c.scenario.learning_rate)), 1e-10)
        << step.parameters_after[i].name;
  }
}

// Negative control: the unclipped hand gradients (coefficient 1) are far from what the
// oracle hands the optimizer when clipping is active, and so is their SGD step.
TEST(Oracle, UnclippedHandGradientIsFarFromTheClippedOracle) {
  harness::DeterminismGuard guard;
  const ClipCase c = clip_case(0.01);
  ASSERT_EQ(c.oracle.steps.size(), 1u);
  const oracles::OracleStep& step = c.oracle.steps[0];
  ASSERT_LT(0.01 / (hand_norm(c.hand) + 1e-6), 0.1);
  // The coefficient is below 0.1, so coefficient 1 is off by over 90%; 50% is far from both
  // that and the 1e-12 the clipped figures meet.
  EXPECT_GT(max_relative_gap(step.gradients[0].value, c.hand.weight_grad), 0.5);
  EXPECT_GT(max_relative_gap(step.gradients[1].value, c.hand.bias_grad), 0.5);
  const at::Tensor taken =
      step_taken(c.oracle.initial_parameters[0].value, step.parameters_after[0].value);
  // Same 90% gap, read through the update; 0.5 is as above.
  EXPECT_GT(max_relative_gap(taken, scaled(c.hand.weight_grad, -c.scenario.learning_rate)), 0.5);
}

// A max_norm far above the gradient norm: the coefficient is exactly 1 (min clamps it), and
// the optimizer consumes the hand gradients unscaled.
TEST(Oracle, InactiveClipHasCoefficientExactlyOne) {
  harness::DeterminismGuard guard;
  const ClipCase c = clip_case(1e6);
  ASSERT_EQ(c.oracle.steps.size(), 1u);
  const oracles::OracleStep& step = c.oracle.steps[0];
  const double norm = hand_norm(c.hand);
  ASSERT_LT(norm, 1e6);
  EXPECT_EQ(std::min(1.0, 1e6 / (norm + 1e-6)), 1.0);
  EXPECT_EQ(step.clip_coef, 1.0);
  // float64 against float64 over a handful of roundings, as in the clipped case.
  EXPECT_NEAR(step.total_norm, norm, 1e-12 * norm);
  // Coefficient 1: the consumed gradients are the hand gradients, to the same few roundings.
  EXPECT_LT(max_relative_gap(step.gradients[0].value, c.hand.weight_grad), 1e-12);
  EXPECT_LT(max_relative_gap(step.gradients[1].value, c.hand.bias_grad), 1e-12);
  // after - initial cancels the parameter, as in the clipped case; the steps are larger here.
  const std::vector<double>* gradients[] = {&c.hand.weight_grad, &c.hand.bias_grad};
  for (std::size_t i = 0; i < 2; ++i) {
    const at::Tensor taken =
        step_taken(c.oracle.initial_parameters[i].value, step.parameters_after[i].value);
    EXPECT_LT(max_relative_gap(taken, scaled(*gradients[i], -c.scenario.learning_rate)), 1e-10)
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
  const scenarios::Scenario& s = scenarios::find_scenario("single/n5-lora/float32");
  const auto oracle =
      oracles::run_oracle(s, harness::ModelConfig{scenarios::ModelKind::causal_lm, true});
  // Exactly the four adapters of the causal LM: an empty list cannot pass the loops below.
  const std::vector<std::string> adapters = {"hidden.lora_a", "hidden.lora_b", "head.lora_a",
                                             "head.lora_b"};
  std::vector<std::string> listed;
  for (const auto& p : oracle.initial_parameters) {
    EXPECT_NE(p.name.find("lora_"), std::string::npos) << p.name << " is frozen but listed";
    listed.push_back(p.name);
  }
  std::vector<std::string> sorted_listed = listed, sorted_adapters = adapters;
  std::sort(sorted_listed.begin(), sorted_listed.end());
  std::sort(sorted_adapters.begin(), sorted_adapters.end());
  EXPECT_EQ(sorted_listed, sorted_adapters);
  ASSERT_EQ(oracle.steps.size(), 1u);
  ASSERT_EQ(oracle.steps[0].gradients.size(), adapters.size());
  for (std::size_t i = 0; i < listed.size(); ++i) {
    EXPECT_EQ(oracle.steps[0].gradients[i].name, listed[i]);
  }
  // Negative control: without LoRA the same model lists its base weights, which the name
  // check above would reject.
  const auto full = oracles::run_oracle(s, harness::ModelConfig{scenarios::ModelKind::causal_lm, false});
  ASSERT_FALSE(full.initial_parameters.empty());
  EXPECT_EQ(full.initial_parameters[0].name.find("lora_"), std::string::npos)
      << full.initial_parameters[0].name;
}

// Determinism: the same scenarios give bit-identical observations run after run.
TEST(Determinism, TheSameScenarioGivesBitIdenticalObservations) {
  harness::DeterminismGuard guard;
  const auto scenarios_list = scenarios::select_scenarios("single/n5-momentum-3steps/*");
  const auto variants = harness::select_variants("*skip");
  const auto first = oracles::evaluate(scenarios_list, variants);
  const auto second = oracles::evaluate(scenarios_list, variants);
  ASSERT_FALSE(first.rows.empty()) << "the selection matched no row: the loop would pass vacuously";
  ASSERT_EQ(first.rows.size(), second.rows.size());
  for (std::size_t i = 0; i < first.rows.size(); ++i) {
    const auto pair = oracles::compare_observations(
        first.rows[i].observation, second.rows[i].observation,
        harness::scalar_type(first.rows[i].scenario.dtype));
    EXPECT_TRUE(pair.bitwise_equal) << first.rows[i].scenario.name << " x "
                                    << first.rows[i].variant.name << ": " << pair.first_difference;
  }
  // Negative control: a logged loss one ulp off is not bit-identical.
  harness::Observation nudged = second.rows[0].observation;
  ASSERT_FALSE(nudged.steps.empty());
  ASSERT_TRUE(nudged.steps.back().logged_loss);
  nudged.steps.back().logged_loss = std::nextafter(*nudged.steps.back().logged_loss, INFINITY);
  EXPECT_FALSE(oracles::compare_observations(first.rows[0].observation, nudged,
                                             harness::scalar_type(first.rows[0].scenario.dtype))
                   .bitwise_equal);
}

// Each step judged from where it really started (run_oracle's anchor). float32 AdamW at
// lr 0.5: the oracle's own float64 trajectory leaves the recipe's past the gradient
// tolerance within 40 steps (the first failure measured at step 13), though every step is
// right; anchored on the observed parameters, all 40 steps pass.
scenarios::Scenario long_adamw() {
  scenarios::Scenario s = scenarios::find_scenario("single/accum2-ragged/float32");
  s.name = "long/adamw/float32";
  s.optimizer = scenarios::OptimizerKind::adamw;
  s.steps = 40;
  return s;
}

TEST(Oracle, AnchoredOnTheObservedParametersALongRightRunPasses) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario s = long_adamw();
  const harness::VariantSpec& baseline = harness::find_variant("baseline");
  const harness::ModelConfig config = harness::model_config_for(baseline, s);
  const harness::Observation run = harness::run_single_device(baseline, s);
  ASSERT_EQ(run.steps.size(), 40u);
  const oracles::Verdict free = oracles::judge(s, run, oracles::run_oracle(s, config), run);
  EXPECT_EQ(free.kind, oracles::VerdictKind::fail) << "the unanchored oracle no longer drifts: "
                                                   << "this test no longer shows what anchoring is for";
  const oracles::Verdict anchored =
      oracles::judge(s, run, oracles::run_oracle(s, config, harness::Objective::scenario_loss, &run), run);
  EXPECT_EQ(anchored.kind, oracles::VerdictKind::pass)
      << (anchored.reasons.empty() ? std::string() : anchored.reasons.front());
}

// Its negative control: anchoring does not carry a wrong step along. One parameter moved by
// 1e-3 in the record of step 20 (an optimizer that misstepped there) fails that step's update
// check first, and no step before it; the later steps' records, computed from the unmoved
// parameters, disagree with an oracle started from the moved ones and fail too.
TEST(Oracle, AnchoringStillCatchesOneWrongStepAndNamesIt) {
  harness::DeterminismGuard guard;
  const scenarios::Scenario s = long_adamw();
  const harness::VariantSpec& baseline = harness::find_variant("baseline");
  harness::Observation run = harness::run_single_device(baseline, s);
  ASSERT_EQ(run.steps.size(), 40u);
  at::Tensor moved = run.steps[20].parameters_after.front().value.clone();
  moved.view({-1})[0] += 1e-3;
  run.steps[20].parameters_after.front().value = moved;
  const oracles::Verdict v = oracles::judge(
      s, run,
      oracles::run_oracle(s, harness::model_config_for(baseline, s), harness::Objective::scenario_loss, &run),
      run);
  EXPECT_EQ(v.kind, oracles::VerdictKind::fail);
  ASSERT_FALSE(v.reasons.empty());
  EXPECT_EQ(v.reasons.front().rfind("step 20: parameter update rel L2 error", 0), 0u) << v.reasons.front();
}

}  // namespace
}  // namespace gradnorm
