#pragma once
// Global LibTorch state that can change results, set in one place and restored after:
// one intra-op thread (fixed reduction order), deterministic algorithms, grad mode on.

#include <string>

namespace gradnorm::harness {

struct RunSettings {
  std::string torch_version;  // "1.13.0"
  int intra_op_threads = 1;
  bool deterministic_algorithms = true;
  std::string transport = "threads";  // how ranks ran: threads, or gloo processes x W
};

class DeterminismGuard {
 public:
  DeterminismGuard();
  ~DeterminismGuard();
  DeterminismGuard(const DeterminismGuard&) = delete;
  DeterminismGuard& operator=(const DeterminismGuard&) = delete;
  [[nodiscard]] const RunSettings& settings() const { return settings_; }

 private:
  RunSettings settings_;
  int previous_threads_;
  bool previous_deterministic_;
  bool previous_warn_only_;
  bool previous_grad_mode_;
};

}  // namespace gradnorm::harness
