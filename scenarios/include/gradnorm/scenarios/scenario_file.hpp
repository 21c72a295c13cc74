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
//   checks = ["gradients"]        # the checks it fails (docs/design.md §12)
//
//   [[variant]]                    # optional: a step written in Python (docs/design.md §10)
//   name = "my-skip"
//   python = "steps/my_skip.py"    # FILE[:FUNCTION], relative to this file; function "step"
//   role = "candidate"             # or "reference"
//   reference = "baseline"         # whose error behaviour it must match
//   findings_of = "skip"           # optional: a transcription expects that variant's findings
//
// Every Scenario field may be given under its own name; the rest keep their defaults. An
// unknown key, a wrong type or an impossible value throws InvalidInput naming the file, the
// scenario and the field.

#include <cstddef>
#include <string>
#include <vector>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::scenarios {

// A [[variant]] table: a step the file brings, not yet loaded.
struct VariantDeclaration {
  std::string where;        // "FILE: variant #I", for messages
  std::string name;
  std::string python;       // FILE[:FUNCTION], FILE resolved against the scenario file's folder
  // Or real framework code: "torchtune:NAME" or "torchtune:PATH.py" (PATH resolved against
  // the scenario file's folder), with its config overrides (KEY=VALUE, as --recipe-arg).
  std::string recipe;
  std::vector<std::string> recipe_args;
  std::string role = "candidate";
  std::string reference = "baseline";
  std::string findings_of;  // empty: none
};

struct ScenarioFile {
  std::vector<Scenario> scenarios;
  std::vector<VariantDeclaration> variants;
};

// The largest scenario file read: 64 MiB holds about 240,000 scenarios as `gradnorm stream`
// writes them (272 bytes each); a larger one is more likely a wrong path (a log, an image)
// than scenarios.
inline constexpr std::size_t kMaxScenarioFileBytes = std::size_t{64} << 20;

// A file needs at least one [[scenario]] or [[variant]] table.
[[nodiscard]] ScenarioFile load_scenario_file_contents(const std::string& path);
[[nodiscard]] ScenarioFile parse_scenario_file(const std::string& toml_text,
                                               const std::string& source_name);

// One [[scenario]] table holding every field of `scenario` (documented findings included),
// which parse_scenario_file reads back as the same scenario: a counter-example replays from
// it. A TorchScript model's file is written as an absolute path.
[[nodiscard]] std::string scenario_table(const Scenario& scenario);

// The scenarios alone; a file without a [[scenario]] table is an error here.
[[nodiscard]] std::vector<Scenario> load_scenario_file(const std::string& path);
[[nodiscard]] std::vector<Scenario> parse_scenarios(const std::string& toml_text,
                                                    const std::string& source_name);

}  // namespace gradnorm::scenarios
