#pragma once
// Negative controls: known-broken steps, each a visible difference from the recipe it
// breaks, each in its own file with the rule for where its bug can show. Private to the
// harness.

namespace gradnorm::harness::controls {

void register_step_inside_skip_gate();
void register_clip_inside_skip_gate();
void register_logged_loss_divided_by_n();
void register_scale_pass_dropped();
void register_non_finite_zeroed();

}  // namespace gradnorm::harness::controls
