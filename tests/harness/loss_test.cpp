// The two sides of a loss: the token mean a step's loss module returns, and the unreduced
// per-token values the oracle sums and divides itself. They must describe the same loss;
// what an all-masked micro-batch does is each module's own.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/loss.hpp"

namespace gradnorm::harness {
namespace {

scenarios::Scenario with_loss(scenarios::LossKind kind) {
  scenarios::Scenario s;
  s.loss = kind;
  s.loss_chunks = 3;
  return s;
}

constexpr scenarios::LossKind kKinds[] = {scenarios::LossKind::mean_ce,
                                          scenarios::LossKind::chunked_ce,
                                          scenarios::LossKind::linear_ce};

TEST(Loss, TokenMeanIsTheMeanOfThePerTokenLosses) {
  at::Generator generator = at::detail::createCPUGenerator(5);
  const at::Tensor logits = at::randn({2, 6, 9}, generator, at::kDouble);
  at::Tensor labels = at::randint(9, {2, 6}, generator, at::TensorOptions().dtype(at::kLong));
  labels.index_put_({0, at::indexing::Slice(3, 6)}, kIgnoreIndex);
  labels.index_put_({1, 5}, kIgnoreIndex);
  const at::Tensor valid = labels.reshape({-1}).ne(kIgnoreIndex);
  const at::Tensor rows = logits.reshape({-1, 9}).index({valid});
  const at::Tensor targets = labels.reshape({-1}).index({valid});
  for (scenarios::LossKind kind : kKinds) {
    const auto loss = make_loss(with_loss(kind));
    const at::Tensor per_token = loss->per_token(TokenRows{rows, targets, {}});
    ASSERT_EQ(per_token.numel(), 8) << scenarios::to_string(kind) << ": one loss per valid token";
    const double mean = loss->token_mean(logits, labels).item<double>();
    // float64 sums of 8 terms in different orders: a few ULP apart.
    EXPECT_NEAR(mean, per_token.mean().item<double>(), 1e-13) << scenarios::to_string(kind);
    // Negative control: per-token losses against shifted targets are another loss.
    const at::Tensor shifted = (targets + 1).remainder(9);
    EXPECT_GT(std::abs(loss->per_token(TokenRows{rows, shifted, {}}).mean().item<double>() - mean), 1e-3);
  }
}

TEST(Loss, AnAllMaskedMicroBatchIsEachModulesOwnBusiness) {
  const at::Tensor logits = at::randn({1, 4, 5}, at::kFloat).set_requires_grad(true);
  const at::Tensor labels = at::full({1, 4}, kIgnoreIndex, at::kLong);
  for (scenarios::LossKind kind : {scenarios::LossKind::mean_ce, scenarios::LossKind::chunked_ce}) {
    const at::Tensor mean = make_loss(with_loss(kind))->token_mean(logits, labels);
    EXPECT_TRUE(std::isnan(mean.item<double>())) << scenarios::to_string(kind);
    const at::Tensor grad = torch::autograd::grad({mean}, {logits})[0];
    EXPECT_TRUE(at::equal(grad, at::zeros_like(grad))) << scenarios::to_string(kind)
                                                       << ": measured zero gradients";
  }
  const at::Tensor zero = make_loss(with_loss(scenarios::LossKind::linear_ce))->token_mean(logits, labels);
  EXPECT_EQ(zero.item<double>(), 0.0);
  EXPECT_FALSE(zero.requires_grad()) << "a graph-less zero: backward raises";
}

}  // namespace
}  // namespace gradnorm::harness
