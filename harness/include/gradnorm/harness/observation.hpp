#pragma once
// What a user can see of a run: per optimizer step, the gradients the optimizer consumed,
// the norm clipping returned, the logged loss and the parameters after the step; the error
// raised, if any; and counters of the work the step did.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace gradnorm::harness {

struct NamedTensor {
  std::string name;
  at::Tensor value;  // undefined when there is nothing to show (e.g. no gradient consumed)
};

struct StepRecord {
  // One entry per trainable parameter, in model order. Undefined when the optimizer never
  // consumed a gradient for that parameter in this step.
  std::vector<NamedTensor> gradients;
  std::optional<double> grad_norm;  // what clip_grad_norm_ returned; empty when not clipped
  std::optional<double> logged_loss;
  std::vector<NamedTensor> parameters_after;  // trainable parameters only
};

struct ErrorRecord {
  // "refusal" for a configuration the recipe rejects on purpose; "c10::Error" for an
  // exception raised by LibTorch (e.g. backward on a tensor with no graph); "peer-failure"
  // on a rank that stopped because another rank's step raised.
  std::string type;
  std::string message;  // first line of the exception text
};

struct Counters {
  int backward_calls = 0;
  int scale_passes = 0;     // full passes of scale_grads over every gradient
  int reduce_passes = 0;    // all-reduces of every gradient across ranks
  int clip_calls = 0;       // clip_grad_norm_ calls (each reads and rescales every gradient)
  int optimizer_steps = 0;  // optimizer.step() calls (per-parameter steps count once per step)
  friend bool operator==(const Counters&, const Counters&) = default;
};

struct Observation {
  std::string scenario;
  std::string variant;
  int rank = 0;
  std::vector<NamedTensor> initial_parameters;  // trainable parameters before the first step
  std::vector<StepRecord> steps;                // complete steps only
  std::optional<ErrorRecord> error;
  Counters counters;
  // What this rank's code printed while it ran (harness/output_capture.hpp): shown under a
  // row that fails, never part of the digest (a warning may carry a time or an address).
  std::string output;
};

}  // namespace gradnorm::harness
