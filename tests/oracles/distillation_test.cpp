// Knowledge distillation: torchtune's KD loss against the oracle's own per-token objective,
// a corrected step that passes (so the recipes' findings are theirs, not the oracle's), and
// the recipes' measured error being exactly the arithmetic their finding states.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/step.hpp"
#include "gradnorm/harness/training.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm {
namespace {

using harness::MicroBatch;
using harness::StepContext;
namespace training = harness::training;

// The recipes with one change: the mix of means is multiplied back by current_num_tokens
// before backward, as the other torchtune recipes do.
class DistillationTokenSums final : public harness::Step {
 public:
  void train_step(StepContext& ctx) override {
    const double r = ctx.scenario().kd_ratio;
    at::Tensor tokens = at::zeros({}, at::kLong);
    at::Tensor running = at::zeros({}, at::kDouble);
    for (const MicroBatch& batch : ctx.micro_batches()) {
      const at::Tensor n = training::valid_token_count(batch);
      tokens += n;
      const at::Tensor logits = ctx.model().logits(batch);
      at::Tensor teacher;
      {
        at::NoGradGuard no_grad;
        teacher = ctx.teacher()->logits(batch);
      }
      const at::Tensor mix = ctx.loss(logits, batch.labels) * (1 - r) +
                             ctx.kd_loss(logits, teacher, batch.labels) * r;
      running += (mix * n).detach().to(at::kDouble);
      training::backward(ctx, mix * n);
    }
    training::rank_average(ctx);
    std::vector<at::Tensor> totals{tokens, running};
    ctx.comm().all_reduce_sum(totals);
    const double n = totals[0].item<double>();
    training::scale_grads(ctx, at::scalar_tensor(ctx.world_size() / n, at::kDouble));
    if (ctx.max_norm()) training::clip_grad_norm(ctx, *ctx.max_norm());
    ctx.optimizer().step();
    ctx.optimizer().zero_grad();
    ctx.log_loss(totals[1].item<double>() / n);
  }
};

void register_once() {
  static const bool done = [] {
    harness::register_variant({.name = "test/kd-token-sums",
                               .objective = harness::Objective::knowledge_distillation,
                               .make = [] { return std::make_unique<DistillationTokenSums>(); }});
    return true;
  }();
  (void)done;
}

TEST(Distillation, TorchtunesForwardKlIsTheOraclesPerTokenKlAveraged) {
  at::Generator generator = at::detail::createCPUGenerator(3);
  const at::Tensor student = at::randn({2, 6, 9}, generator, at::kDouble);
  const at::Tensor teacher = at::randn({2, 6, 9}, generator, at::kDouble);
  at::Tensor labels = at::randint(9, {2, 6}, generator, at::TensorOptions().dtype(at::kLong));
  labels.index_put_({1, at::indexing::Slice(2, 6)}, harness::kIgnoreIndex);
  const at::Tensor valid = labels.reshape({-1}).ne(harness::kIgnoreIndex);
  const harness::TokenRows rows{student.reshape({-1, 9}).index({valid}),
                                labels.reshape({-1}).index({valid}),
                                teacher.reshape({-1, 9}).index({valid})};
  scenarios::Scenario s;
  s.kd_ratio = 1.0;  // the objective is then the KD term alone
  const double oracle_kl =
      harness::make_objective(s, harness::Objective::knowledge_distillation)->per_token(rows).mean().item<double>();
  const double recipe_kl = (*harness::make_distillation_loss(s))(student, teacher, labels).item<double>();
  // torchtune computes it in float32 (softmax dtype=torch.float32): a few float32 ULP.
  EXPECT_NEAR(recipe_kl, oracle_kl, 1e-6 * std::abs(oracle_kl));
  s.loss = scenarios::LossKind::chunked_ce;
  s.loss_chunks = 4;
  const double chunked = (*harness::make_distillation_loss(s))(student, teacher, labels).item<double>();
  EXPECT_NEAR(chunked, oracle_kl, 1e-6 * std::abs(oracle_kl));
  // Negative control: kd_ratio 0 leaves cross-entropy alone, a different number.
  s.kd_ratio = 0.0;
  const double ce_only =
      harness::make_objective(s, harness::Objective::knowledge_distillation)->per_token(rows).mean().item<double>();
  EXPECT_GT(std::abs(ce_only - oracle_kl), 1e-2);
}

TEST(Distillation, AnEmptyBatchsKdLossIsAGraphlessZero) {
  const at::Tensor logits = at::randn({1, 4, 5}, at::kFloat).set_requires_grad(true);
  const at::Tensor labels = at::full({1, 4}, harness::kIgnoreIndex, at::kLong);
  const at::Tensor kd = (*harness::make_distillation_loss(scenarios::Scenario{}))(logits, logits.detach(), labels);
  EXPECT_EQ(kd.item<double>(), 0.0);
  EXPECT_FALSE(kd.requires_grad());
}

// Positive control for the recipes' findings: with the loss multiplied back by the token
// count, distillation agrees with the oracle on one device, with accumulation, with
// clipping and on ragged ranks.
TEST(Distillation, ACorrectedStepAgreesWithTheOracle) {
  register_once();
  harness::DeterminismGuard guard;
  std::vector<scenarios::Scenario> list;
  for (const char* name : {"single/n5/float64", "single/accum2-ragged/float64",
                           "single/clip-active/float32", "single/accum2-chunked/float64",
                           "dist/5-3/float64", "dist/1-64/float32"}) {
    list.push_back(scenarios::find_scenario(name));
  }
  const oracles::Evaluation e = oracles::evaluate(list, {harness::find_variant("test/kd-token-sums")});
  ASSERT_EQ(e.rows.size(), list.size());
  for (const oracles::EvaluationRow& row : e.rows) {
    EXPECT_EQ(row.verdict.kind, oracles::VerdictKind::pass)
        << row.scenario.name << ": " << (row.verdict.reasons.empty() ? "" : row.verdict.reasons[0]);
  }
}

// The findings' arithmetic, measured: with one micro-batch the recipes' gradients are the
// oracle's divided by N (float64 model; the KD term is computed in float32 inside).
TEST(Distillation, TheRecipesGradientsAreTheContractsOverN) {
  harness::DeterminismGuard guard;
  for (const auto& [variant, name] : {std::pair{"kd-single-device", "single/n5/float64"},
                                      std::pair{"kd-distributed", "dist/4-4/float64"}}) {
    const scenarios::Scenario& s = scenarios::find_scenario(name);
    const harness::VariantSpec& v = harness::find_variant(variant);
    const oracles::OracleResult oracle =
        oracles::run_oracle(s, harness::model_config_for(v, s), v.objective);
    const harness::RankedRun run = harness::run_in_threads(v, s);
    ASSERT_FALSE(run.fault);
    const double n = static_cast<double>(s.global_token_count());
    // dist/4-4: every micro-batch holds n = 4 of N = 8 tokens: weight 1/(4 * 8) = (1/8) / 4.
    const double factor = s.world_size == 1 ? n : 4.0;
    const auto& got = run.ranks.front().steps.front().gradients;
    const auto& want = oracle.steps.front().gradients;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const at::Tensor scaled = got[i].value.to(at::kDouble) * factor;
      const double error = (scaled - want[i].value).norm().item<double>() / want[i].value.norm().item<double>();
      EXPECT_LT(error, 1e-6) << variant << " " << got[i].name;
      // Negative control: unscaled, they are far from the contract.
      const double raw = (got[i].value.to(at::kDouble) - want[i].value).norm().item<double>() /
                         want[i].value.norm().item<double>();
      EXPECT_GT(raw, 0.5) << variant << " " << got[i].name;
    }
  }
}

}  // namespace
}  // namespace gradnorm
