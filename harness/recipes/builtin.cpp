// Every built-in step, one registration line each: a new recipe, candidate or control is a
// new file plus one line here.
#include "../controls/controls.hpp"
#include "builtin.hpp"
#include "full_finetune.hpp"

namespace gradnorm::harness::recipes {

void register_builtin_variants() {
  register_full_finetune();
  register_optimizer_in_backward();
  register_lora_finetune();
  register_qat();
  register_knowledge_distillation();
  register_early_exit();
  controls::register_step_inside_skip_gate();
  controls::register_clip_inside_skip_gate();
  controls::register_logged_loss_divided_by_n();
  controls::register_scale_pass_dropped();
  controls::register_non_finite_zeroed();
}

}  // namespace gradnorm::harness::recipes
