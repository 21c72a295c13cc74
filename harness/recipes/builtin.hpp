#pragma once

namespace gradnorm::harness::recipes {

// Registers the built-in recipes, candidates and negative controls, in catalogue order.
void register_builtin_variants();

}  // namespace gradnorm::harness::recipes
