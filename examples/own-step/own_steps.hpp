#pragma once
// Two home-grown training steps, registered with gradnorm: one right, one subtly wrong.

namespace own_step {

// Registers "own/token-sum" (normalises by the global token count: right) and
// "own/local-mean" (normalises by each rank's own count: right on one device and on
// balanced ranks, wrong on ragged ones). Call once, before any run.
void register_steps();

}  // namespace own_step
