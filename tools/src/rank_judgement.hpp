#pragma once
// `fuzz --nproc W`: each generated case runs on W rank processes (`run --launcher env
// --judgement FILE`); rank 0 leaves the case's judgement of the step in FILE, which the
// fuzzing process reads back to hold the step to the oracle where its reference agrees.

#include <optional>
#include <string>
#include <vector>

#include "gradnorm/oracles/evaluation.hpp"

namespace gradnorm::tools {

struct RankJudgement {
  std::vector<std::string> judged;         // Judgement::judged_checks
  std::vector<std::string> disagreements;  // Judgement::disagreements
  bool reference_agrees = true;
  std::string explanation;                 // oracles::explain, without the weight probe
  std::optional<std::string> skipped;      // the pair was not run: why
};

// Rank 0: the judgement of `variant` (and of its reference, when another step) on the one
// scenario of `evaluation`, written atomically to `path`.
void write_rank_judgement(const oracles::Evaluation& evaluation, const std::string& variant,
                          const std::string& path);
// Throws std::runtime_error naming `path` when it is missing or not what the writer wrote.
[[nodiscard]] RankJudgement read_rank_judgement(const std::string& path);

}  // namespace gradnorm::tools
