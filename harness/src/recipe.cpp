// The training loop of torchtune's recipes from one rank's point of view, transcribed once
// with the gates the pull request added (Arithmetic) and the regressions it found. With one
// rank it is the single-device recipe; with more, the distributed one: gradients averaged
// over ranks, num_tokens and running_loss all-reduced, scale_grads(world_size / num_tokens).
#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include <memory>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/communicator.hpp"
#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/runner.hpp"

namespace gradnorm::harness {
namespace {

using scenarios::OptimizerKind;
using scenarios::Scenario;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Scenario& s,
                                                        std::vector<at::Tensor> params) {
  switch (s.optimizer) {
    case OptimizerKind::sgd:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(s.learning_rate).weight_decay(s.weight_decay));
    case OptimizerKind::sgd_momentum:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(s.learning_rate)
                      .momentum(s.momentum)
                      .weight_decay(s.weight_decay));
    case OptimizerKind::adamw:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(s.learning_rate).weight_decay(s.weight_decay));
  }
  TORCH_INTERNAL_ASSERT(false, "harness bug: unhandled optimizer");
}

// optimizer.zero_grad(set_to_none=True), as the recipes call it.
void zero_grad_set_to_none(const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

// torchtune training.scale_grads: p.grad *= scaler for every parameter with a gradient.
void scale_grads(const std::vector<at::Tensor>& params, const at::Tensor& scaler,
                 Counters& counters) {
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) p.mutable_grad().mul_(scaler);
  }
  ++counters.scale_passes;
}

std::vector<NamedTensor> snapshot_gradients(const Model& model) {
  std::vector<NamedTensor> out;
  for (const Parameter& p : model.parameters()) {
    if (!p.trainable) continue;
    const at::Tensor& grad = p.value.grad();
    out.push_back({p.name, grad.defined() ? grad.detach().clone() : at::Tensor()});
  }
  return out;
}

std::vector<NamedTensor> snapshot_parameters(const Model& model) {
  std::vector<NamedTensor> out;
  for (const Parameter& p : model.parameters()) {
    if (p.trainable) out.push_back({p.name, p.value.detach().clone()});
  }
  return out;
}

class RecipeLoop {
 public:
  RecipeLoop(const VariantSpec& variant, const Scenario& scenario,
             const BatchSource& batches, Communicator& comm, const FaultInjection& fault,
             Observation& out)
      : variant_(variant),
        scenario_(scenario),
        batches_(batches),
        comm_(comm),
        fault_(fault),
        out_(out),
        model_(scenario, model_config_for(variant, scenario)),
        params_(model_.trainable_tensors()),
        loss_options_{scenario.loss, scenario.loss_chunks} {
    optimizer_in_backward_ = variant.force_optimizer_in_backward || scenario.optimizer_in_backward;
    if (optimizer_in_backward_) refuse_unsupported_options();
    // The pull request's gate: grad_accum == 1 and not optimizer_in_bwd.
    // Open only for the skip and world-size-only arithmetics, which both backward the mean.
    skip_ = skip_gate_open(variant, scenario);
    out_.initial_parameters = snapshot_parameters(model_);
    if (optimizer_in_backward_) {
      install_optimizer_hooks();
    } else {
      optimizer_ = make_optimizer(scenario, params_);
    }
  }

  // Returns when every step is done or when some rank's step raised (recorded in the
  // observation: the error itself on that rank, "peer-failure" on the others).
  void train() {
    for (int step = 0; step < scenario_.steps; ++step) {
      if (!train_one_step(step)) return;
    }
  }

 private:
  void refuse_unsupported_options() const {
    if (variant_.recipe == Recipe::lora_finetune) {
      throw RecipeRefusal("lora_finetune_single_device has no optimizer_in_bwd path");
    }
    if (scenario_.clip_max_norm) {
      throw RecipeRefusal("Gradient clipping is not supported with optimizer in backward");
    }
    if (scenario_.accumulation_steps > 1) {
      throw RecipeRefusal("Gradient accumulation is not supported with optimizer in backward");
    }
  }

  // One optimizer per parameter, stepped as soon as that parameter's gradient is ready,
  // then its gradient cleared (torchtune's optimizer-in-backward hooks).
  void install_optimizer_hooks() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      per_parameter_optimizers_.push_back(make_optimizer(scenario_, {params_[i]}));
      params_[i].register_hook([this, i](const at::Tensor& grad) {
        at::Tensor consumed = grad.detach().clone();
        params_[i].mutable_grad() = consumed.clone();
        per_parameter_optimizers_[i]->step();
        hook_consumed_[i] = consumed;
        params_[i].mutable_grad() = at::Tensor();
        return at::zeros_like(grad);  // what AccumulateGrad then stores; cleared after backward
      });
    }
  }

  void inject_fault(int step) const {
    if (fault_.rank != comm_.rank() || fault_.step != step) return;
    switch (fault_.kind) {
      case FaultKind::none: return;
      case FaultKind::throw_error:
        throw std::runtime_error(fmt::format("injected fault: rank {} throws", comm_.rank()));
      case FaultKind::exit_early: throw RankExit{};
      case FaultKind::hang: fault_.hang(); return;
    }
  }

  std::vector<MicroBatch> load_window(int step) const {
    std::vector<MicroBatch> window;
    const int rank = comm_.rank();
    for (int micro = 0; micro < scenario_.accumulation_steps; ++micro) {
      window.push_back(batches_(rank, step, micro));
      const long valid = window.back().labels.ne(kIgnoreIndex).sum().item<long>();
      const int wanted = scenario_.valid_tokens[static_cast<std::size_t>(rank)][static_cast<std::size_t>(micro)];
      if (valid != wanted) {
        throw scenarios::InvalidInput(fmt::format(
            "scenario '{}': the batch source gave rank {} step {} micro-batch {} with {} valid "
            "labels, but the scenario asks for {}",
            scenario_.name, rank, step, micro, valid, wanted));
      }
    }
    return window;
  }

  // The local part of a step: forward and backward of every micro-batch of the window.
  void accumulate(const std::vector<MicroBatch>& window, at::Tensor& running_loss,
                  at::Tensor& num_tokens) {
    // global-prenorm: the whole window's token count, all ranks, before any backward.
    at::Tensor prenorm_scale;
    if (variant_.arithmetic == Arithmetic::global_prenorm) {
      std::vector<at::Tensor> count{at::zeros({}, at::kLong)};
      for (const MicroBatch& batch : window) count[0] += batch.labels.ne(kIgnoreIndex).sum();
      comm_.all_reduce_sum(count);
      // world_size / num_tokens on an int64 tensor: a float32 scalar.
      prenorm_scale = at::scalar_tensor(comm_.world_size(), at::kFloat) / count[0].to(at::kFloat);
    }
    for (const MicroBatch& batch : window) {
      const at::Tensor current_num_tokens = batch.labels.ne(kIgnoreIndex).sum();
      num_tokens += current_num_tokens;
      const at::Tensor mean = recipe_loss(model_.logits(batch), batch.labels, loss_options_);
      // Loss is a token mean; the recipe multiplies it back to a token sum so the window can
      // be normalised by its total count. The skip path backwards the mean itself.
      at::Tensor current_loss = skip_ ? mean : mean * current_num_tokens;
      running_loss = running_loss + current_loss.detach();
      if (prenorm_scale.defined()) {
        current_loss = current_loss * prenorm_scale;
      } else if (optimizer_in_backward_) {
        current_loss = current_loss / num_tokens;
      }
      ++out_.counters.backward_calls;
      current_loss.backward();
    }
  }

  // Returns false when this or another rank's step raised; the error is recorded.
  bool train_one_step(int step) {
    inject_fault(step);
    at::Tensor running_loss = at::zeros({}, at::kFloat);
    at::Tensor num_tokens = at::zeros({}, at::kLong);
    hook_consumed_.assign(params_.size(), at::Tensor());
    StepRecord record;

    bool failed = false;
    try {
      accumulate(load_window(step), running_loss, num_tokens);
    } catch (const RecipeRefusal& refusal) {
      out_.error = ErrorRecord{"refusal", refusal.what()};
      failed = true;
    } catch (const c10::Error& error) {
      out_.error = ErrorRecord{"c10::Error", first_line(error.what_without_backtrace())};
      failed = true;
    }
    if (comm_.any(failed)) {
      if (!failed) out_.error = ErrorRecord{"peer-failure", "another rank's step raised"};
      return false;
    }

    std::vector<at::Tensor> totals{num_tokens, running_loss};
    if (optimizer_in_backward_) {
      zero_grad_set_to_none(params_);
      ++out_.counters.optimizer_steps;
      for (std::size_t i = 0; i < params_.size(); ++i) {
        record.gradients.push_back({trainable_name(i), hook_consumed_[i]});
      }
      comm_.all_reduce_sum(totals);
    } else {
      average_over_ranks();
      comm_.all_reduce_sum(totals);
      optimizer_step(totals[0], record);
    }
    const at::Tensor& global_tokens = totals[0];
    const at::Tensor& global_running = totals[1];

    // loss_to_log = running_loss.item() / num_tokens: a Python float divided by an int64
    // tensor is a float32 division. The skip path divides by 1.0 (by world_size across
    // ranks, each rank holding a mean) and stays a Python float.
    const bool divide_by_count =
        !skip_ || variant_.regression == Regression::logged_loss_divided_by_n;
    const double running = global_running.item<double>();
    record.logged_loss =
        divide_by_count
            ? (at::scalar_tensor(running, at::kFloat) / global_tokens.to(at::kFloat)).item<double>()
            : running / comm_.world_size();
    record.parameters_after = snapshot_parameters(model_);
    out_.steps.push_back(std::move(record));
    return true;
  }

  // FSDP/DDP gradient averaging: SUM over ranks and a division by W, placed before or after
  // the sum as the scenario says.
  void average_over_ranks() {
    const int world = comm_.world_size();
    if (world == 1) return;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    for (at::Tensor& p : params_) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
    const bool before = scenario_.rank_average == scenarios::RankAverage::divide_before_sum;
    if (before) {
      for (at::Tensor& g : grads) g.div_(world);
    }
    comm_.all_reduce_sum(grads);
    if (!before) {
      for (at::Tensor& g : grads) g.div_(world);
    }
    ++out_.counters.reduce_passes;
  }

  void optimizer_step(const at::Tensor& num_tokens, StepRecord& record) {
    const Regression bug = variant_.regression;
    const bool step_gated = bug == Regression::step_inside_skip_gate;
    const bool clip_gated = bug == Regression::clip_inside_skip_gate;
    const bool token_sums = !skip_ && variant_.arithmetic != Arithmetic::global_prenorm;
    if (token_sums && bug != Regression::scale_pass_dropped) {
      // `world_size / num_tokens` on an int64 tensor: a float32 scalar, whatever the gradient
      // dtype (`1 / num_tokens` on one device).
      scale_grads(params_,
                  at::scalar_tensor(comm_.world_size(), at::kFloat) / num_tokens.to(at::kFloat),
                  out_.counters);
    } else if (skip_ && variant_.arithmetic == Arithmetic::world_size_only) {
      scale_grads(params_, at::scalar_tensor(comm_.world_size(), at::kLong), out_.counters);
    }
    if (bug == Regression::non_finite_gradients_zeroed) {
      at::NoGradGuard no_grad;
      for (const at::Tensor& p : params_) {
        if (p.grad().defined()) p.mutable_grad().nan_to_num_(0.0, 0.0, 0.0);
      }
    }
    if (scenario_.clip_max_norm && !(clip_gated && skip_)) {
      ++out_.counters.clip_calls;
      record.grad_norm = torch::nn::utils::clip_grad_norm_(params_, *scenario_.clip_max_norm);
    }
    if (step_gated && skip_) {
      // Nothing consumed: the gradients stay and accumulate into the next window.
      for (std::size_t i = 0; i < params_.size(); ++i) {
        record.gradients.push_back({trainable_name(i), at::Tensor()});
      }
      return;
    }
    record.gradients = snapshot_gradients(model_);
    optimizer_->step();
    ++out_.counters.optimizer_steps;
    zero_grad_set_to_none(params_);
  }

  std::string trainable_name(std::size_t index) const {
    std::size_t seen = 0;
    for (const Parameter& p : model_.parameters()) {
      if (!p.trainable) continue;
      if (seen++ == index) return p.name;
    }
    TORCH_INTERNAL_ASSERT(false, "harness bug: no trainable parameter ", index);
  }

  const VariantSpec& variant_;
  const Scenario& scenario_;
  const BatchSource& batches_;
  Communicator& comm_;
  const FaultInjection& fault_;
  Observation& out_;
  Model model_;
  std::vector<at::Tensor> params_;
  LossOptions loss_options_;
  bool optimizer_in_backward_ = false;
  // The pull request's gate is open: this step backwards the mean (skip, world-size-only).
  bool skip_ = false;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> per_parameter_optimizers_;
  std::vector<at::Tensor> hook_consumed_;
};

}  // namespace

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  const auto trailer = line.find("Exception raised from");
  if (trailer != std::string::npos) line = line.substr(0, trailer);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

Observation run_rank(const VariantSpec& variant, const Scenario& scenario,
                     const BatchSource& batches, Communicator& comm,
                     const FaultInjection& fault) {
  Observation out;
  out.scenario = scenario.name;
  out.variant = variant.name;
  out.rank = comm.rank();
  try {
    RecipeLoop recipe(variant, scenario, batches, comm, fault, out);
    recipe.train();
  } catch (const RecipeRefusal& refusal) {
    // Raised while setting up, identically on every rank, before any collective.
    out.error = ErrorRecord{"refusal", refusal.what()};
  }
  return out;
}

Observation run_single_device(const VariantSpec& variant, const Scenario& scenario) {
  return run_single_device(variant, scenario, scenario_batches(scenario));
}

Observation run_single_device(const VariantSpec& variant, const Scenario& scenario,
                              const BatchSource& batches) {
  scenarios::validate(scenario);
  if (scenario.world_size != 1) {
    throw scenarios::InvalidInput(fmt::format(
        "scenario '{}': world_size is {} but the single-device runner needs 1", scenario.name,
        scenario.world_size));
  }
  SoloCommunicator solo;
  return run_rank(variant, scenario, batches, solo, FaultInjection{});
}

}  // namespace gradnorm::harness
