// torchtune's knowledge-distillation recipes: the student's class loss and a forward-KL loss
// against a frozen teacher, mixed by kd_ratio, accumulated, normalised, logged and clipped
// exactly as each recipe writes it.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <fmt/format.h>

#include "full_finetune.hpp"
#include "gradnorm/harness/training.hpp"

namespace gradnorm::harness::recipes {
namespace {

constexpr const char* kKnowledgeDistillationSingleDevice = "recipes/knowledge_distillation_single_device.py";
constexpr const char* kKnowledgeDistillationDistributed = "recipes/knowledge_distillation_distributed.py";
constexpr const char* kLosses = "torchtune/modules/loss/kd_losses.py";

// The recipes' running totals: plain sums of loss * current_num_tokens, kept with their
// graphs (the recipes do not detach them); num_tokens an int64 tensor.
struct DistillationWindow {
  at::Tensor num_tokens;
  at::Tensor running_class_loss;
  at::Tensor running_kd_loss;
  at::Tensor last_class_loss;  // the window's last micro-batch, as the distributed recipe logs
  at::Tensor last_kd_loss;
};

// _loss_step and the micro-batch loop both recipes share: class and KD loss of the
// student's logits, the teacher's logits under no_grad, and backward of their kd_ratio mix
// (the token means themselves: the recipes do not multiply them by current_num_tokens).
DistillationWindow backward_distillation_mix(StepContext& context) {
  const double kd_ratio = context.scenario().kd_ratio;
  DistillationWindow window{at::zeros({}, at::kLong), {}, {}, {}, {}};
  for (const MicroBatch& batch : context.micro_batches()) {
    const at::Tensor current_num_tokens = training::valid_token_count(batch);
    window.num_tokens += current_num_tokens;
    const at::Tensor logits = context.model().logits(batch);
    at::Tensor teacher_logits;
    {
      at::NoGradGuard no_grad;
      teacher_logits = context.teacher()->logits(batch);
    }
    const at::Tensor kd_loss = context.kd_loss(logits, teacher_logits, batch.labels);
    const at::Tensor class_loss = context.loss(logits, batch.labels);
    // running_* start as the Python int 0: the first += makes them the product itself.
    auto accumulate = [&](at::Tensor& running, const at::Tensor& loss) {
      const at::Tensor product = loss * current_num_tokens;
      running = running.defined() ? running + product : product;
    };
    accumulate(window.running_class_loss, class_loss);
    accumulate(window.running_kd_loss, kd_loss);
    const at::Tensor current_loss = class_loss * (1 - kd_ratio) + kd_loss * kd_ratio;
    training::backward(context, current_loss);
    window.last_class_loss = class_loss;
    window.last_kd_loss = kd_loss;
  }
  return window;
}

// running.detach().item() / num_tokens: a Python float over an int64 tensor, float32.
at::Tensor per_token_mean(const at::Tensor& running, const at::Tensor& num_tokens) {
  return training::number_over(running.detach().item<double>(), num_tokens);
}

class DistillationSingleDevice final : public Step {
 public:
  void train_step(StepContext& context) override {
    const double kd_ratio = context.scenario().kd_ratio;
    const DistillationWindow window = backward_distillation_mix(context);
    // `1 / num_tokens` on an int64 tensor: a float32 scalar.
    training::scale_grads(context, training::number_over(1, window.num_tokens));
    if (context.max_norm()) training::clip_grad_norm(context, *context.max_norm());
    context.optimizer().step();
    context.optimizer().zero_grad(/*set_to_none=*/true);
    const at::Tensor class_loss_to_log = per_token_mean(window.running_class_loss, window.num_tokens);
    const at::Tensor kd_loss_to_log = per_token_mean(window.running_kd_loss, window.num_tokens);
    context.log_loss((class_loss_to_log * (1 - kd_ratio) + kd_loss_to_log * kd_ratio).item<double>());
  }
};

class DistillationDistributed final : public Step {
 public:
  void train_step(StepContext& context) override {
    const double kd_ratio = context.scenario().kd_ratio;
    const DistillationWindow window = backward_distillation_mix(context);
    training::rank_average(context);  // FSDP, in backward
    std::vector<at::Tensor> totals{window.num_tokens, window.running_class_loss.detach(),
                                   window.running_kd_loss.detach()};
    context.comm().all_reduce_sum(totals);
    // `self.world_size / num_tokens` on an int64 tensor: a float32 scalar. No clipping.
    training::scale_grads(context, training::number_over(context.world_size(), totals[0]));
    context.optimizer().step();
    context.optimizer().zero_grad(/*set_to_none=*/true);
    // The all-reduced means are computed, then overwritten by the last micro-batch's own.
    const double class_loss_to_log = window.last_class_loss.detach().item<double>();
    const double kd_loss_to_log = window.last_kd_loss.detach().item<double>();
    context.log_loss((1 - kd_ratio) * class_loss_to_log + kd_ratio * kd_loss_to_log);
  }
};

std::optional<std::string> needs_a_built_in_teacher(const scenarios::Scenario& s) {
  if (scenarios::model_from_file(s.model)) {
    return fmt::format("distillation needs a teacher; a {} scenario names none",
                       s.model == scenarios::ModelKind::torchscript ? "TorchScript" : "Python-model");
  }
  return std::nullopt;  // the recipes never read optimizer_in_bwd: it changes nothing
}

bool has_empty_micro_batch(const scenarios::Scenario& s) {
  for (const auto& row : s.valid_tokens) {
    for (int count : row) {
      if (count == 0) return true;
    }
  }
  return false;
}

// Shared by both recipes: what an empty micro-batch does to them, if the step has tokens.
std::optional<Finding> empty_micro_batch_finding(const scenarios::Scenario& s, const char* file,
                                                 const char* lines) {
  if (!has_empty_micro_batch(s)) return std::nullopt;
  if (s.loss == scenarios::LossKind::linear_ce) {
    return Finding{"error-mismatch",
                   fmt::format("an empty micro-batch makes both the class loss and the KD loss "
                               "graph-less zeros, so backward raises although the step has "
                               "tokens ({}:{})",
                               file, lines)};
  }
  return std::nullopt;
}

// Measured on the default matrix: a token of a micro-batch holding n of the step's N tokens
// gets weight 1/(n N) instead of 1/N.
constexpr const char* kMeansScaledByN =
    "backwards each micro-batch's token mean ((1 - kd_ratio) * class_loss + kd_ratio * "
    "kd_loss) and then scales the gradients by {} ({}): a token in a micro-batch of n tokens "
    "weighs 1/(n N) instead of 1/N, so with one micro-batch the gradients are 1/N of the "
    "contract's (relative error 1 - 1/N: 0.8 at N = 5){}";

std::optional<Finding> single_device_findings(const scenarios::Scenario& s,
                                              const ContractFacts& facts) {
  if (facts.global_token_count == 0) return std::nullopt;
  if (auto empty = empty_micro_batch_finding(s, kKnowledgeDistillationSingleDevice, "663-666")) return empty;
  if (facts.global_token_count == 1) return std::nullopt;
  const std::string more =
      has_empty_micro_batch(s) ? "; an empty micro-batch's NaN mean times 0 makes the logged "
                                 "loss NaN (661-662)"
      : facts.first_clip_coef && *facts.first_clip_coef < 1
          ? "; clipping then rescales the too-small gradients less, so the norm it reports "
            "is 1/N of the contract's"
          : "; the logged loss is right (682-686)";
  std::vector<std::string> checks{"gradients"};
  if (has_empty_micro_batch(s)) checks.push_back("logged-loss");
  return Finding{"fail", fmt::format(kMeansScaledByN, "1 / num_tokens",
                                     fmt::format("{}:663-670", kKnowledgeDistillationSingleDevice), more),
                 checks};
}

std::optional<Finding> distributed_findings(const scenarios::Scenario& s,
                                            const ContractFacts& facts) {
  if (facts.global_token_count == 0) return std::nullopt;
  if (auto empty = empty_micro_batch_finding(s, kKnowledgeDistillationDistributed, "806-809")) return empty;
  const bool clip_bites = facts.first_clip_coef && *facts.first_clip_coef < 1;
  if (facts.global_token_count == 1 && s.world_size == 1 && !clip_bites) return std::nullopt;
  std::string more = "; it logs the last micro-batch's own losses on each rank (829-833), not "
                     "the all-reduced means it has just computed (821-822)";
  if (clip_bites) more += ", and it never clips: clip_grad_norm is not read in train()";
  // Each rank logs its own last micro-batch: a wrong logged loss wherever there is more than
  // one micro-batch or rank, and replicas that log different numbers.
  std::vector<std::string> checks{"gradients"};
  if (s.world_size > 1 || s.accumulation_steps > 1 || has_empty_micro_batch(s)) checks.push_back("logged-loss");
  if (s.world_size > 1) checks.push_back("ranks-agree");
  return Finding{"fail",
                 fmt::format(kMeansScaledByN, "world_size / num_tokens after FSDP's 1/W average",
                             fmt::format("{}:806-820", kKnowledgeDistillationDistributed), more),
                 checks};
}

std::optional<std::string> one_device(const scenarios::Scenario& s) {
  if (s.world_size > 1) return std::string("a single-device recipe");
  return needs_a_built_in_teacher(s);
}

}  // namespace

void register_knowledge_distillation() {
  const Citation forward_kl{kLosses, 26, 59, "ForwardKLLoss: float32 softmax, masked sum / count"};
  const Citation chunked_kl{kLosses, 200, 257,
                            "ForwardKLWithChunkedOutputLoss: chunk sums / whole count"};
  register_variant({
      .name = "kd-single-device",
      .role = Role::reference,
      .reference = "kd-single-device",
      .summary = "backward((1 - kd_ratio) * class_loss + kd_ratio * kd_loss), the token means; "
                 "scale_grads(1 / num_tokens), clip, step; loss_to_log from the running sums",
      .cites = {{kKnowledgeDistillationSingleDevice, 590, 623, "_loss_step: student logits, teacher under no_grad"},
                {kKnowledgeDistillationSingleDevice, 655, 666,
                 "running_*_loss += loss * current_num_tokens; backward of the mix of means"},
                {kKnowledgeDistillationSingleDevice, 669, 686, "scale_grads(1 / num_tokens), clip, step, loss_to_log"},
                forward_kl, chunked_kl},
      .objective = Objective::knowledge_distillation,
      .make = [] { return std::make_unique<DistillationSingleDevice>(); },
      .cannot_run = one_device,
      .findings = single_device_findings,
  });
  register_variant({
      .name = "kd-distributed",
      .role = Role::reference,
      .reference = "kd-distributed",
      .summary = "the same mix of means per micro-batch under FSDP; all-reduced counts, "
                 "scale_grads(world_size / num_tokens), no clipping; logs the last micro-batch",
      .cites = {{kKnowledgeDistillationDistributed, 718, 750, "_loss_step: student logits, teacher under no_grad"},
                {kKnowledgeDistillationDistributed, 798, 809,
                 "running_*_loss += loss * current_num_tokens; backward of the mix of means"},
                {kKnowledgeDistillationDistributed, 812, 833,
                 "all_reduce, scale_grads(world_size / num_tokens), step; class_loss_to_log "
                 "overwritten by class_loss.item()"},
                forward_kl, chunked_kl},
      .objective = Objective::knowledge_distillation,
      .make = [] { return std::make_unique<DistillationDistributed>(); },
      .cannot_run = needs_a_built_in_teacher,
      .findings = distributed_findings,
  });
}

}  // namespace gradnorm::harness::recipes
