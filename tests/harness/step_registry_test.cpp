// The Step interface and the registry, from the side of someone adding a step: what the
// registry refuses, that a registered step is judged like a built-in, that the harness (not
// the step) records what the optimizer consumed, and that a step raising on one rank stops
// its peers at their next collective instead of leaving them waiting.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/step.hpp"
#include "gradnorm/harness/training.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm::harness {
namespace {

using scenarios::InvalidInput;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A correct home-grown step: token sums, rank average, scale by W / N.
class TokenSum : public Step {
 public:
  void train_step(StepContext& ctx) override {
    at::Tensor tokens = at::zeros({}, at::kLong);
    at::Tensor loss_sum = at::zeros({}, at::kDouble);
    for (const MicroBatch& batch : ctx.micro_batches()) {
      const at::Tensor n = training::valid_token_count(batch);
      const at::Tensor sum = ctx.loss(ctx.model().logits(batch), batch.labels) * n;
      tokens += n;
      loss_sum += sum.detach().to(at::kDouble);
      training::backward(ctx, sum);
    }
    training::rank_average(ctx);
    std::vector<at::Tensor> totals{tokens, loss_sum};
    ctx.comm().all_reduce_sum(totals);
    const double n = totals[0].item<double>();
    training::scale_grads(ctx, at::scalar_tensor(ctx.world_size() / n, at::kDouble));
    ctx.optimizer().step();
    ctx.optimizer().zero_grad();
    ctx.log_loss(totals[1].item<double>() / n);
  }
};

// Raises a LibTorch error on one rank at a chosen point of the step.
class RaisesOnOneRank : public TokenSum {
 public:
  enum class Where { prepare, before_collectives, after_collectives };
  RaisesOnOneRank(int rank, Where where) : rank_(rank), where_(where) {}
  void prepare(StepContext& ctx) override {
    TORCH_CHECK(!(where_ == Where::prepare && ctx.rank() == rank_), "rank refuses to prepare");
  }
  void train_step(StepContext& ctx) override {
    TORCH_CHECK(!(where_ == Where::before_collectives && ctx.rank() == rank_), "raised early");
    TokenSum::train_step(ctx);
    TORCH_CHECK(!(where_ == Where::after_collectives && ctx.rank() == rank_), "raised late");
  }

 private:
  int rank_;
  Where where_;
};

// Claims a gradient it never handed to the optimizer: doubles the gradients after step().
class ScalesAfterStepping : public TokenSum {
 public:
  void train_step(StepContext& ctx) override {
    TokenSum::train_step(ctx);
    for (const MicroBatch& batch : ctx.micro_batches()) {
      training::backward(ctx, ctx.loss(ctx.model().logits(batch), batch.labels) * 2);
    }
  }
};

// Doubles the gradients just before the optimizer consumes them.
class DoublesBeforeStepping : public Step {
 public:
  void train_step(StepContext& ctx) override {
    for (const MicroBatch& batch : ctx.micro_batches()) {
      const at::Tensor n = training::valid_token_count(batch);
      training::backward(ctx, ctx.loss(ctx.model().logits(batch), batch.labels) * n);
    }
    const double tokens = static_cast<double>(ctx.scenario().global_token_count());
    training::scale_grads(ctx, at::scalar_tensor(2.0 / tokens, at::kDouble));
    ctx.optimizer().step();
    ctx.optimizer().zero_grad();
    ctx.log_loss(0);
  }
};

VariantSpec spec(std::string name, std::function<std::unique_ptr<Step>()> make) {
  return VariantSpec{.name = std::move(name), .reference = "baseline", .make = std::move(make)};
}

void register_once() {
  static const bool done = [] {
    register_variant(spec("test/token-sum", [] { return std::make_unique<TokenSum>(); }));
    register_variant(spec("test/scales-after-stepping",
                          [] { return std::make_unique<ScalesAfterStepping>(); }));
    register_variant(spec("test/doubles-before-stepping",
                          [] { return std::make_unique<DoublesBeforeStepping>(); }));
    using Where = RaisesOnOneRank::Where;
    register_variant(spec("test/raises-in-prepare",
                          [] { return std::make_unique<RaisesOnOneRank>(1, Where::prepare); }));
    register_variant(spec("test/raises-early", [] {
      return std::make_unique<RaisesOnOneRank>(1, Where::before_collectives);
    }));
    register_variant(spec("test/raises-late", [] {
      return std::make_unique<RaisesOnOneRank>(2, Where::after_collectives);
    }));
    return true;
  }();
  (void)done;
}

std::string registration_error(VariantSpec s) {
  try {
    register_variant(std::move(s));
  } catch (const InvalidInput& error) {
    return error.what();
  }
  return "<registered>";
}

TEST(Registry, BuiltInsComeFirstInCatalogueOrderWithCitations) {
  const std::vector<VariantSpec> all = variants();
  constexpr std::size_t kBuiltIns = 18;
  ASSERT_GE(all.size(), kBuiltIns);
  EXPECT_EQ(all.front().name, "baseline");
  EXPECT_EQ(all.at(kBuiltIns - 1).name, "broken/non-finite-zeroed");
  for (std::size_t i = 0; i < kBuiltIns; ++i) {
    const VariantSpec& v = all[i];
    EXPECT_FALSE(v.cites.empty()) << v.name << " cites no torchtune line";
    for (const Citation& c : v.cites) {
      EXPECT_GE(c.first_line, 1) << v.name;
      EXPECT_LE(c.first_line, c.last_line) << v.name << " " << c.file;
      EXPECT_TRUE(c.file.ends_with(".py")) << v.name << " " << c.file;
    }
    EXPECT_EQ(v.role == Role::negative_control, static_cast<bool>(v.bug_visible)) << v.name;
  }
  EXPECT_EQ(to_string(all.front().cites.front()),
            "torchtune@bd2a0fc7 recipes/full_finetune_single_device.py:609-619 "
            "(backward(loss * current_num_tokens), running_loss)");
}

TEST(Registry, RefusesWhatCannotWork) {
  auto make = [] { return std::make_unique<TokenSum>(); };
  EXPECT_TRUE(contains(registration_error(spec("", make)), "its name is empty"));
  EXPECT_TRUE(contains(registration_error(spec("test/two\nlines", make)),
                       "cannot register variant 'test/two\\x0alines': its name holds a control "
                       "character (byte 0x0a)"));
  EXPECT_TRUE(contains(registration_error(spec("baseline", make)),
                       "cannot register variant 'baseline': a variant of that name is already"));
  EXPECT_TRUE(contains(registration_error(spec("test/no-factory", nullptr)), "no step factory"));
  VariantSpec orphan = spec("test/orphan", make);
  orphan.reference = "nope";
  EXPECT_TRUE(contains(registration_error(orphan), "its reference 'nope' is not registered"));
  VariantSpec control = spec("test/control-without-rule", make);
  control.role = Role::negative_control;
  EXPECT_TRUE(contains(registration_error(control), "needs bug_visible"));
  // Nothing refused was added.
  for (const VariantSpec& v : variants()) {
    EXPECT_FALSE(v.name == "test/orphan" || v.name == "test/no-factory" ||
                 v.name == "test/control-without-rule");
  }
}

TEST(Registry, AStepWithoutItsOwnReferenceIsItsOwnReference) {
  register_variant(VariantSpec{.name = "test/self-referenced",
                               .make = [] { return std::make_unique<TokenSum>(); }});
  EXPECT_EQ(find_variant("test/self-referenced").reference, "test/self-referenced");
}

TEST(Steps, ARegisteredStepRunsOnThreadsLikeABuiltIn) {
  register_once();
  DeterminismGuard guard;
  const scenarios::Scenario& s = scenarios::find_scenario("dist/5-3/float64");
  const RankedRun mine = run_in_threads(find_variant("test/token-sum"), s);
  const RankedRun base = run_in_threads(find_variant("baseline"), s);
  ASSERT_FALSE(mine.fault) << *mine.fault;
  ASSERT_EQ(mine.ranks.size(), 2u);
  for (const Observation& o : mine.ranks) {
    ASSERT_FALSE(o.error) << o.error->message;
    ASSERT_EQ(o.steps.size(), 1u);
    ASSERT_TRUE(o.steps[0].logged_loss);
  }
  // Both follow the contract; in float64 they land within rounding of each other.
  const at::Tensor a = mine.ranks[0].steps[0].gradients.front().value;
  const at::Tensor b = base.ranks[0].steps[0].gradients.front().value;
  EXPECT_TRUE(at::allclose(a, b, 1e-7, 0)) << (a - b).abs().max().item<double>();
}

TEST(Steps, TheHarnessRecordsWhatTheOptimizerConsumedNotWhatTheStepLeftBehind) {
  register_once();
  DeterminismGuard guard;
  const scenarios::Scenario& s = scenarios::find_scenario("single/n5/float64");
  const Observation honest = run_single_device(find_variant("test/token-sum"), s);
  const Observation late = run_single_device(find_variant("test/scales-after-stepping"), s);
  ASSERT_EQ(honest.steps.size(), 1u);
  ASSERT_EQ(late.steps.size(), 1u);
  for (std::size_t i = 0; i < honest.steps[0].gradients.size(); ++i) {
    EXPECT_TRUE(at::equal(honest.steps[0].gradients[i].value, late.steps[0].gradients[i].value))
        << honest.steps[0].gradients[i].name;
  }
  EXPECT_EQ(late.counters.backward_calls, 2);
  // Negative control: what the optimizer consumes does show, at the moment it consumes it.
  const Observation doubled = run_single_device(find_variant("test/doubles-before-stepping"), s);
  ASSERT_EQ(doubled.steps.size(), 1u);
  for (std::size_t i = 0; i < honest.steps[0].gradients.size(); ++i) {
    const at::Tensor& want = honest.steps[0].gradients[i].value;
    const at::Tensor& got = doubled.steps[0].gradients[i].value;
    // float64; the two steps place their 1/N differently, so they agree to rounding only.
    EXPECT_TRUE(at::allclose(got, want * 2, 1e-12, 1e-15)) << honest.steps[0].gradients[i].name;
  }
}

// A rank that raises and its peers: the raising rank keeps its error, every other rank
// records peer-failure, and the run ends cleanly (no fault, no timeout).
void expect_clean_stop(const std::string& variant, int raising_rank, const std::string& message) {
  register_once();
  DeterminismGuard guard;
  scenarios::Scenario s = scenarios::find_scenario("dist/5-3/float32");
  s.name = "three-ranks";
  s.world_size = 3;
  s.valid_tokens = {{5}, {3}, {4}};
  RunOptions options;
  options.timeout = std::chrono::seconds(20);
  const RankedRun run = run_in_threads(find_variant(variant), s, options);
  ASSERT_FALSE(run.fault) << *run.fault;
  ASSERT_EQ(run.ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const Observation& o = run.ranks[static_cast<std::size_t>(r)];
    ASSERT_TRUE(o.error) << variant << " rank " << r << " recorded no error";
    EXPECT_TRUE(o.steps.empty()) << variant << " rank " << r;
    if (r == raising_rank) {
      EXPECT_EQ(o.error->type, "c10::Error");
      EXPECT_TRUE(contains(o.error->message, message)) << o.error->message;
    } else {
      EXPECT_EQ(o.error->type, "peer-failure") << variant << " rank " << r;
    }
  }
}

TEST(Steps, ARankRaisingInPrepareStopsItsPeers) {
  expect_clean_stop("test/raises-in-prepare", 1, "rank refuses to prepare");
}

TEST(Steps, ARankRaisingBeforeAnyCollectiveStopsItsPeersAtTheirFirst) {
  expect_clean_stop("test/raises-early", 1, "raised early");
}

TEST(Steps, ARankRaisingAfterItsLastCollectiveStopsItsPeersAtTheEndOfTheStep) {
  expect_clean_stop("test/raises-late", 2, "raised late");
}

TEST(Steps, AHealthyStepRecordsEveryRanksStep) {
  register_once();
  DeterminismGuard guard;
  scenarios::Scenario s = scenarios::find_scenario("dist/5-3/float32");
  s.world_size = 3;
  s.valid_tokens = {{5}, {3}, {4}};
  const RankedRun run = run_in_threads(find_variant("test/token-sum"), s);
  ASSERT_FALSE(run.fault);
  for (const Observation& o : run.ranks) {
    EXPECT_FALSE(o.error);
    EXPECT_EQ(o.steps.size(), 1u);
  }
}

}  // namespace
}  // namespace gradnorm::harness
