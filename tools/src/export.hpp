#pragma once
// `gradnorm export SCENARIO... --out DIR`: oracle vectors for Python test suites.

#include <string>
#include <vector>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::tools {

// Writes OUT/<scenario name>.pt per scenario (torch.load reads it; python/gradnorm_torch.py
// compares a step with it). Nothing is written unless every scenario exports.
int export_command(const std::vector<scenarios::Scenario>& scenario_list, const std::string& out);

}  // namespace gradnorm::tools
