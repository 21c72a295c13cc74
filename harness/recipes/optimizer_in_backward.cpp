// The full recipe with optimizer_in_bwd=True whatever the scenario says: one optimizer per
// parameter, stepped from its gradient hook, on the loss divided by the window's count
// before backward (as qat_single_device writes it).
#include "full_finetune.hpp"

namespace gradnorm::harness::recipes {
namespace {

class OptimizerInBackward final : public FullFinetune {
 public:
  void prepare(StepContext& context) override { setup_optimizer_in_backward(context); }
};

std::optional<std::string> one_device_only(const scenarios::Scenario& s) {
  if (s.world_size > 1) return std::string("optimizer in backward is modelled on one device only");
  return std::nullopt;
}

}  // namespace

void register_optimizer_in_backward() {
  register_variant({
      .name = "optimizer-in-backward",
      .role = Role::reference,
      .reference = "optimizer-in-backward",
      .summary = "backward of (mean * n) / num_tokens, one optimizer per parameter stepped "
                 "from its gradient hook; refuses clipping and accumulation",
      .cites = {{"recipes/qat_single_device.py", 578, 588,
                 "current_loss *= n, then / current_num_tokens with optimizer in backward"},
                {"recipes/qat_single_device.py", 405, 435, "optim_dict and its hooks"},
                {"recipes/full_finetune_single_device.py", 149, 160,
                 "refuses clipping and accumulation with optimizer in backward"},
                {"torchtune/training/memory.py", 222, 245, "register_optim_in_bwd_hooks"}},
      .make = [] { return std::make_unique<OptimizerInBackward>(); },
      .cannot_run = one_device_only,
  });
}

}  // namespace gradnorm::harness::recipes
