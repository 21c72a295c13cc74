#include "gradnorm/harness/determinism.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <fmt/format.h>

namespace gradnorm::harness {

DeterminismGuard::DeterminismGuard()
    : previous_threads_(at::get_num_threads()),
      previous_deterministic_(at::globalContext().deterministicAlgorithms()),
      previous_warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()),
      previous_grad_mode_(at::GradMode::is_enabled()) {
  at::set_num_threads(1);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::GradMode::set_enabled(true);
  settings_.torch_version =
      fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
  settings_.intra_op_threads = at::get_num_threads();
  settings_.deterministic_algorithms = at::globalContext().deterministicAlgorithms();
}

DeterminismGuard::~DeterminismGuard() {
  at::set_num_threads(previous_threads_);
  at::globalContext().setDeterministicAlgorithms(previous_deterministic_, previous_warn_only_);
  at::GradMode::set_enabled(previous_grad_mode_);
}

}  // namespace gradnorm::harness
