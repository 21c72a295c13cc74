#pragma once
// The named scenarios every run starts from. Names are stable identities: reports, tests
// and filters refer to them.

#include <string_view>
#include <vector>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::scenarios {

// Every named scenario, in a fixed order; each passes validate().
[[nodiscard]] const std::vector<Scenario>& catalogue();

// The scenario called `name`; throws InvalidInput listing the names that share its prefix.
[[nodiscard]] const Scenario& find_scenario(std::string_view name);

// Scenarios whose name matches a shell-style pattern (`single/n*`, `*/float64`); an exact
// name matches itself. Throws InvalidInput when nothing matches.
[[nodiscard]] std::vector<Scenario> select_scenarios(std::string_view pattern);

// The same over another pool (the catalogue plus scenario files, say).
[[nodiscard]] const Scenario& find_scenario(const std::vector<Scenario>& pool, std::string_view name);
[[nodiscard]] std::vector<Scenario> select_scenarios(const std::vector<Scenario>& pool,
                                                     std::string_view pattern);

}  // namespace gradnorm::scenarios
