#pragma once
// A self-contained HTML report (inline CSS, SVG and a few lines of script; nothing loaded
// from the network): the verdict matrix as a colour grid (scenario x variant, a title on
// hover and the figures on click), per-token weights per rank against 1/N for multi-rank
// scenarios, and each row's error against its tolerance, per dtype. For a comparison, the
// grid is coloured by what changed between base and head.

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "gradnorm/reports/diff.hpp"

namespace gradnorm::reports {

// What the token-weight probe read off one (scenario, variant): each valid token's weight
// in the consumed gradient, per rank, and the contract's 1/N.
struct WeightPlot {
  std::string scenario;
  std::string variant;
  long global_token_count = 0;
  double expected_weight = 0;
  std::vector<std::pair<int, std::vector<double>>> ranks;  // (rank, weights)
};

// One run's JSON report (to_json), with the weight plots the run measured.
[[nodiscard]] std::string render_html(const nlohmann::json& report, const std::vector<WeightPlot>& weights);

// A comparison: the grid by change, then the head report's error plots.
[[nodiscard]] std::string render_diff_html(const Diff& diff, const nlohmann::json& head);

}  // namespace gradnorm::reports
