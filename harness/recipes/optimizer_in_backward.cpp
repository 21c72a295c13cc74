// The full recipes with optimizer_in_bwd=True whatever the scenario says: one optimizer per
// parameter, stepped from its gradient hook (after the rank average, as FSDP's
// reduce-scatter runs before the hook).
#include "full_finetune.hpp"

namespace gradnorm::harness::recipes {
namespace {

class OptimizerInBackward final : public FullFinetune {
 public:
  void prepare(StepContext& context) override {
    refuse_optimizer_in_backward(context);
    training::register_optim_in_bwd_hooks(context);
  }
};

}  // namespace

void register_optimizer_in_backward() {
  register_variant({
      .name = "optimizer-in-backward",
      .role = Role::reference,
      .reference = "optimizer-in-backward",
      .summary = "optimizer_in_bwd=True: on one device backward of the mean (loss_factor 1.0), "
                 "across ranks of loss * n * dp_degree / N with the counts all-reduced first; "
                 "one optimizer per parameter stepped from its hook; refuses clipping and "
                 "accumulation",
      .cites = {{"recipes/full_finetune_single_device.py", 609, 645,
                 "loss_factor 1.0 with optimizer_in_bwd; loss_value = running_loss / 1.0"},
                {"recipes/full_finetune_distributed.py", 1009, 1024,
                 "all_reduce(num_tokens), all_reduce(running_loss), loss * (dp_degree / "
                 "num_tokens)"},
                {"recipes/full_finetune_single_device.py", 149, 160,
                 "refuses clipping and accumulation with optimizer_in_bwd"},
                {"torchtune/modules/optim.py", 15, 84, "OptimizerInBackward: step() a no-op"},
                {"torchtune/training/memory.py", 222, 245, "register_optim_in_bwd_hooks"}},
      .make = [] { return std::make_unique<OptimizerInBackward>(); },
  });
}

}  // namespace gradnorm::harness::recipes
