#pragma once
// A training step, written from one rank's point of view as a torchtune recipe's train()
// is (docs/design.md §4). The harness builds the model, the loss, the optimizer and the
// communicator and hands them over in a StepContext; the step trains; the harness records
// what a user would see: the gradients the optimizer consumed, the parameters after the
// step, and what the step logged (the loss, the norm clipping returned).

#include <ATen/core/Tensor.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/communicator.hpp"
#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/observation.hpp"
#include "gradnorm/harness/optimizer.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

// Thrown by a step that rejects its configuration on purpose (torchtune raises there too):
// recorded as a "refusal", which matches a reference that refuses the same way.
class RecipeRefusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by a step for an error of its own kind (a Python step's exception): recorded as
// this rank's error with `type` as given ("ValueError") and the message.
class StepError : public std::runtime_error {
 public:
  StepError(std::string type, const std::string& message)
      : std::runtime_error(message), type_(std::move(type)) {}
  [[nodiscard]] const std::string& type() const { return type_; }

 private:
  std::string type_;
};

class StepContext {
 public:
  virtual ~StepContext() = default;

  [[nodiscard]] virtual const scenarios::Scenario& scenario() const = 0;
  // 0 for the first optimizer step of the run.
  [[nodiscard]] virtual int step_index() const = 0;
  // This rank's micro-batches for the current optimizer step (the accumulation window),
  // labels already shifted, -100 where ignored. Empty in Step::prepare.
  [[nodiscard]] virtual const std::vector<MicroBatch>& micro_batches() const = 0;
  // This rank's micro-batches at any step of the run (0 <= step < the scenario's steps), as
  // micro_batches() holds them at that step: for framework code that reads ahead of the step
  // it is in (accelerate's dataloader fetches the next batch before it yields the current).
  // Throws scenarios::InvalidInput for a step outside the run.
  [[nodiscard]] virtual std::vector<MicroBatch> micro_batches_of_step(int step) const = 0;
  // Named parameters (trainable ones require grad) and the forward pass.
  [[nodiscard]] virtual Model& model() const = 0;
  // The scenario's loss on one micro-batch: the token mean over its valid labels, formed
  // the way that loss module forms it (which decides what an all-masked batch does).
  [[nodiscard]] virtual at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const = 0;
  // Distilling recipes (VariantSpec::objective): the frozen teacher, the same kind of model
  // with its own parameters; null for every other step.
  [[nodiscard]] virtual const Model* teacher() const = 0;
  // Distilling recipes: torchtune's KD loss (forward KL, chunked when the scenario's loss
  // is) on student and teacher logits [B, T, V] and labels [B, T].
  [[nodiscard]] virtual at::Tensor kd_loss(const at::Tensor& student_logits,
                                           const at::Tensor& teacher_logits,
                                           const at::Tensor& labels) const = 0;
  [[nodiscard]] virtual Optimizer& optimizer() const = 0;
  // Collectives with the other ranks (world size 1: every collective is the identity).
  [[nodiscard]] virtual Communicator& comm() const = 0;
  // Work counters a report shows (scale passes, reduce passes, clip calls, backward calls).
  [[nodiscard]] virtual Counters& counters() const = 0;

  // What the recipe logs for this optimizer step.
  virtual void log_loss(double value) = 0;
  // What clip_grad_norm_ returned (the total norm before clipping).
  virtual void report_grad_norm(double value) = 0;

  [[nodiscard]] int rank() const { return comm().rank(); }
  [[nodiscard]] int world_size() const { return comm().world_size(); }
  // The scenario's clipping threshold; empty when the recipe does not clip.
  [[nodiscard]] std::optional<double> max_norm() const { return scenario().clip_max_norm; }
};

class Step {
 public:
  virtual ~Step() = default;
  // Once per rank before the first optimizer step: refuse a configuration (RecipeRefusal),
  // install gradient hooks. micro_batches() is empty here.
  virtual void prepare(StepContext& /*context*/) {}
  // One optimizer step over context.micro_batches(). A c10::Error, RecipeRefusal or
  // StepError it raises is recorded as this rank's error; the other ranks then stop at their next
  // collective and record "peer-failure".
  virtual void train_step(StepContext& context) = 0;
};

}  // namespace gradnorm::harness
