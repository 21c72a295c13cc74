#include "gradnorm/oracles/oracle.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include <cmath>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/model.hpp"

namespace gradnorm::oracles {
namespace {

using harness::NamedTensor;
using scenarios::OptimizerKind;
using scenarios::Scenario;

// torch.optim's documented update rules, written out in float64.
class ReferenceOptimizer {
 public:
  explicit ReferenceOptimizer(const Scenario& s) : s_(s) {}

  at::Tensor update(std::size_t index, const at::Tensor& param, const at::Tensor& grad) {
    if (first_moment_.size() <= index) {
      first_moment_.resize(index + 1);
      second_moment_.resize(index + 1);
    }
    at::Tensor& m = first_moment_[index];
    switch (s_.optimizer) {
      case OptimizerKind::sgd: return param - s_.learning_rate * (grad + s_.weight_decay * param);
      case OptimizerKind::sgd_momentum: {
        const at::Tensor d = grad + s_.weight_decay * param;
        m = m.defined() ? s_.momentum * m + d : d;
        return param - s_.learning_rate * m;
      }
      case OptimizerKind::adamw: {
        constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
        at::Tensor& v = second_moment_[index];
        if (!m.defined()) {
          m = at::zeros_like(param);
          v = at::zeros_like(param);
        }
        const double t = static_cast<double>(step_);
        m = kBeta1 * m + (1 - kBeta1) * grad;
        v = kBeta2 * v + (1 - kBeta2) * grad * grad;
        const at::Tensor m_hat = m / (1 - std::pow(kBeta1, t));
        const at::Tensor v_hat = v / (1 - std::pow(kBeta2, t));
        const at::Tensor decayed = param * (1 - s_.learning_rate * s_.weight_decay);
        return decayed - s_.learning_rate * m_hat / (at::sqrt(v_hat) + kEps);
      }
    }
    TORCH_INTERNAL_ASSERT(false, "harness bug: unhandled optimizer");
  }
  void begin_step() { ++step_; }

 private:
  const Scenario& s_;
  long step_ = 0;
  std::vector<at::Tensor> first_moment_;
  std::vector<at::Tensor> second_moment_;
};

// The parameters the observed step `step - 1` left, when they can stand for the oracle's:
// the same trainable parameters by name and shape, every value finite (a step that went
// non-finite has failed already; the oracle then goes on from its own trajectory).
const std::vector<NamedTensor>* anchor_for(const harness::Observation* anchor, int step,
                                           const harness::Model& model) {
  if (anchor == nullptr || step == 0 || anchor->steps.size() < static_cast<std::size_t>(step)) return nullptr;
  const std::vector<NamedTensor>& after = anchor->steps[static_cast<std::size_t>(step) - 1].parameters_after;
  std::size_t index = 0;
  for (const harness::Parameter& p : model.parameters()) {
    if (!p.trainable) continue;
    if (index >= after.size() || after[index].name != p.name || !after[index].value.defined() ||
        !after[index].value.sizes().equals(p.value.sizes()) ||
        !at::isfinite(after[index].value).all().item<bool>()) {
      return nullptr;
    }
    ++index;
  }
  return index == after.size() ? &after : nullptr;
}

}  // namespace

OracleResult run_oracle(const Scenario& s, const harness::ModelConfig& model_config,
                        harness::Objective objective, const harness::Observation* anchor) {
  scenarios::validate(s);
  OracleResult result;
  result.global_token_count = s.global_token_count();
  const std::unique_ptr<harness::Model> model =
      harness::make_model(s, model_config)->converted(at::kDouble);
  for (const harness::Parameter& p : model->parameters()) {
    if (p.trainable) result.initial_parameters.push_back({p.name, p.value.detach().clone()});
  }
  if (result.global_token_count == 0) {
    result.no_gradient = true;
    result.contract = "N == 0: no valid token, so no gradient exists; the step must raise or "
                      "return non-finite values, never a finite update";
    return result;
  }
  result.contract = fmt::format("N = {}: every valid token weighs 1/{}", result.global_token_count,
                                result.global_token_count);
  ReferenceOptimizer optimizer(s);
  const std::unique_ptr<harness::PerTokenLoss> loss_fn = harness::make_objective(s, objective);
  // A distilling recipe's frozen teacher, in float64 like the model.
  std::unique_ptr<harness::Model> teacher;
  if (objective == harness::Objective::knowledge_distillation) {
    teacher = harness::make_model(s, harness::ModelConfig{model_config.base, false, false, true})
                  ->converted(at::kDouble);
  }
  for (int step = 0; step < s.steps; ++step) {
    if (const std::vector<NamedTensor>* start = anchor_for(anchor, step, *model)) {
      at::NoGradGuard no_grad;
      std::size_t index = 0;
      for (const harness::Parameter& p : model->parameters()) {
        if (p.trainable) p.value.copy_((*start)[index++].value.to(at::kDouble));
      }
    }
    // All valid tokens of the step, every rank and micro-batch, as one batch. Every
    // data-parallel rank's batch is read whole: the tokens tensor- and context-parallel
    // ranks share or split are counted once.
    std::vector<harness::MicroBatch> batches;
    for (int rank = 0; rank < s.data_parallel_size(); ++rank) {
      for (harness::MicroBatch batch : harness::make_rank_window(s, rank, step)) {
        if (batch.inputs.is_floating_point()) batch.inputs = batch.inputs.to(at::kDouble);
        batches.push_back(std::move(batch));
      }
    }
    // The built-in models treat each sequence on its own, so the step's sequences go through
    // them as one batch (one forward instead of one per micro-batch); a model from a file
    // may not, and gets them as the step's ranks do.
    if (!scenarios::model_from_file(model_config.base) && batches.size() > 1) {
      std::vector<at::Tensor> inputs, labels;
      for (const harness::MicroBatch& b : batches) {
        inputs.push_back(b.inputs);
        labels.push_back(b.labels);
      }
      harness::MicroBatch whole;
      whole.inputs = at::cat(inputs);
      whole.labels = at::cat(labels);
      batches = {std::move(whole)};
    }
    std::vector<at::Tensor> rows;
    std::vector<at::Tensor> targets;
    std::vector<at::Tensor> teacher_rows;
    for (const harness::MicroBatch& batch : batches) {
      // Only positions with a label carry a loss: the model computes those alone.
      const at::Tensor valid =
          batch.labels.reshape({-1}).ne(harness::kIgnoreIndex).nonzero().reshape({-1});
      rows.push_back(model->logits_at(batch, valid));
      targets.push_back(batch.labels.reshape({-1}).index_select(0, valid));
      if (teacher) {
        at::NoGradGuard no_grad;
        teacher_rows.push_back(teacher->logits_at(batch, valid));
      }
    }
    const at::Tensor all_rows = at::cat(rows);
    const at::Tensor all_targets = at::cat(targets);
    const long count = all_targets.size(0);
    TORCH_INTERNAL_ASSERT(count > 0, "harness bug: a later step lost its tokens");
    // The loss gives each token's loss; the normalisation is the oracle's alone.
    const at::Tensor token_losses = loss_fn->per_token(harness::TokenRows{
        all_rows, all_targets, teacher ? at::cat(teacher_rows) : at::Tensor()});
    const at::Tensor loss = token_losses.sum() / static_cast<double>(count);

    const std::vector<at::Tensor> trainable = model->trainable_tensors();
    std::vector<at::Tensor> grads;
    try {
      grads = torch::autograd::grad({loss}, trainable, {}, false, false, true);
    } catch (const c10::Error& error) {
      if (!scenarios::model_from_file(model_config.base)) throw;
      throw scenarios::InvalidInput(fmt::format(
          "scenario '{}': model '{}' cannot be differentiated in float64 at step {}: {}",
          s.name, harness::model_source(s), step, error.what_without_backtrace()));
    }

    OracleStep out;
    out.loss = loss.item<double>();
    double squares = 0;
    for (const at::Tensor& g : grads) {
      if (g.defined()) squares += g.pow(2).sum().item<double>();
    }
    out.total_norm = std::sqrt(squares);
    if (scenarios::model_from_file(model_config.base) &&
        (!std::isfinite(out.loss) || !std::isfinite(out.total_norm))) {
      // With N > 0 the contract's loss is finite for a model that computes finite values:
      // a non-finite one is the model's (step 0) or its trajectory's (later), not the step's.
      throw scenarios::InvalidInput(fmt::format(
          "scenario '{}': model '{}' gives a non-finite float64 loss ({}) or gradient norm ({}) "
          "at step {} with N = {} valid tokens: {}, so no step can be judged against it",
          s.name, harness::model_source(s), out.loss, out.total_norm, step, count,
          step == 0 ? "the model computes no finite value on the scenario's batches"
                    : "the oracle's own trajectory diverged (lower learning_rate or steps)"));
    }
    if (s.clip_max_norm) out.clip_coef = std::min(1.0, *s.clip_max_norm / (out.total_norm + 1e-6));
    optimizer.begin_step();
    for (const harness::Parameter& p : model->parameters()) {
      if (p.trainable) out.parameters_before.push_back({p.name, p.value.detach().clone()});
    }
    std::size_t index = 0;
    for (const harness::Parameter& p : model->parameters()) {
      if (!p.trainable) continue;
      const at::Tensor g = grads[index].defined() ? grads[index] : at::zeros_like(p.value);
      const at::Tensor consumed = g * out.clip_coef;
      out.gradients.push_back({p.name, consumed});
      at::Tensor next = optimizer.update(index, p.value.detach(), consumed);
      {
        at::NoGradGuard no_grad;
        p.value.copy_(next);
      }
      out.parameters_after.push_back({p.name, next.clone()});
      ++index;
    }
    result.steps.push_back(std::move(out));
  }
  return result;
}

}  // namespace gradnorm::oracles
