#pragma once
// Scenarios from a TOML file, for cases the catalogue does not name:
//
//   [[scenario]]
//   name = "mine/5-3"
//   world_size = 2
//   valid_tokens = [[5], [3]]      # [rank][micro-batch]
//   dtype = "float32"
//   clip_max_norm = 1.0
//   [[scenario.expect]]            # optional documented findings
//   variant = "skip"
//   verdict = "fail"
//   reason = "ranks are ragged"
//
// Every Scenario field may be given under its own name; the rest keep their defaults. An
// unknown key, a wrong type or an impossible value throws InvalidInput naming the file, the
// scenario and the field.

#include <string>
#include <vector>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::scenarios {

[[nodiscard]] std::vector<Scenario> load_scenario_file(const std::string& path);
[[nodiscard]] std::vector<Scenario> parse_scenarios(const std::string& toml_text,
                                                    const std::string& source_name);

}  // namespace gradnorm::scenarios
