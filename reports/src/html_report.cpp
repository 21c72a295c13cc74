#include "gradnorm/reports/html.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "format.hpp"

namespace gradnorm::reports {
namespace {

using nlohmann::json;

std::string esc(const std::string& text) { return detail::xml_escape(text); }

std::string number_text(const json& v) {
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  if (v.is_number()) return detail::sci(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return "-";
}

const char* kStyle = R"css(
body { font: 13px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.summary { background: #f3f5f8; padding: 8px 12px; border-radius: 4px; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 11px; height: 11px; margin-right: 4px; vertical-align: -1px; }
svg text { font: 10px monospace; fill: #333; }
rect.cell { stroke: #fff; stroke-width: 1; cursor: pointer; }
rect.cell.unmet { stroke: #000; stroke-width: 2; }
rect.cell:hover { stroke: #000; }
#detail { white-space: pre-wrap; background: #f8f8f8; border: 1px solid #ddd; padding: 8px; min-height: 3em; }
.plots { display: flex; flex-wrap: wrap; gap: 18px; }
.plot { border: 1px solid #e3e6eb; padding: 6px; }
)css";

// Reads the figures of a clicked cell into the detail panel; records any script error in
// the page itself (body data-errors), so a headless browser's DOM dump shows it.
const char* kScript = R"js(
(function () {
  var errors = 0;
  window.addEventListener('error', function () { errors += 1; document.body.dataset.errors = String(errors); });
  var detail = document.getElementById('detail');
  var cells = document.querySelectorAll('rect.cell');
  cells.forEach(function (cell) {
    cell.addEventListener('click', function () { detail.textContent = cell.dataset.detail; });
  });
  document.body.dataset.cells = String(cells.length);
  document.body.dataset.errors = String(errors);
  document.body.dataset.ready = 'yes';
})();
)js";

struct Colour {
  const char* key;
  const char* fill;
  const char* label;
};

constexpr Colour kVerdictColours[] = {
    {"pass", "#3a9a4c", "pass"},
    {"fail", "#d2483c", "fail"},
    {"expected-error", "#4a78c2", "expected error"},
    {"error-mismatch", "#8a4fb0", "error mismatch"},
};

constexpr Colour kChangeColours[] = {
    {"regression", "#c0261c", "regression"},
    {"control-lost", "#7a0f0a", "control lost"},
    {"finding-lost", "#e09a2b", "finding lost"},
    {"still-unexpected", "#e6786e", "still unexpected"},
    {"fixed", "#2f8f43", "fixed"},
    {"verdict-changed", "#4a78c2", "verdict changed"},
    {"drift", "#d9c23a", "drift"},
    {"bits-changed", "#9fc3e6", "bits changed"},
    {"added", "#6cc07a", "added"},
    {"removed", "#999999", "removed"},
    {"unchanged", "#d5dbe3", "unchanged"},
};

template <std::size_t N>
const char* fill_of(const Colour (&colours)[N], const std::string& key) {
  for (const Colour& c : colours) {
    if (key == c.key) return c.fill;
  }
  return "#bbbbbb";
}

template <std::size_t N>
std::string legend(const Colour (&colours)[N]) {
  std::string out = "<p class=\"legend\">";
  for (const Colour& c : colours) {
    out += fmt::format("<span><i style=\"background:{}\"></i>{}</span>", c.fill, c.label);
  }
  return out + "<span><i style=\"background:#fff;outline:2px solid #000\"></i>not as expected</span></p>\n";
}

struct Cell {
  std::string scenario;
  std::string variant;
  std::string fill;
  bool unmet = false;
  std::string title;   // on hover
  std::string detail;  // on click
};

// The grid: one rect per cell, scenarios down, variants across, in first-seen order.
std::string grid(const std::vector<Cell>& cells) {
  std::vector<std::string> scenarios, variants;
  std::map<std::string, std::size_t> scenario_index, variant_index;
  for (const Cell& c : cells) {
    if (scenario_index.emplace(c.scenario, scenarios.size()).second) scenarios.push_back(c.scenario);
    if (variant_index.emplace(c.variant, variants.size()).second) variants.push_back(c.variant);
  }
  constexpr int kCell = 13;
  std::size_t label_width = 60;
  for (const std::string& s : scenarios) label_width = std::max(label_width, s.size() * 6 + 8);
  std::size_t header = 60;
  for (const std::string& v : variants) header = std::max(header, v.size() * 6 + 8);
  const std::size_t width = label_width + variants.size() * kCell + header / 2 + 10;  // rotated labels lean right
  const std::size_t height = header + scenarios.size() * kCell + 10;
  std::string out = fmt::format("<svg id=\"grid\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n", width, height);
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const std::size_t x = label_width + i * kCell + 9;
    out += fmt::format("<text transform=\"translate({},{}) rotate(-60)\">{}</text>\n", x, header - 4, esc(variants[i]));
  }
  for (std::size_t i = 0; i < scenarios.size(); ++i) {
    out += fmt::format("<text x=\"2\" y=\"{}\">{}</text>\n", header + i * kCell + 10, esc(scenarios[i]));
  }
  for (const Cell& c : cells) {
    const std::size_t x = label_width + variant_index.at(c.variant) * kCell;
    const std::size_t y = header + scenario_index.at(c.scenario) * kCell;
    out += fmt::format("<rect class=\"cell{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
                       "data-scenario=\"{}\" data-variant=\"{}\" data-detail=\"{}\"><title>{}</title></rect>\n",
                       c.unmet ? " unmet" : "", x, y, kCell, kCell, c.fill, esc(c.scenario), esc(c.variant),
                       esc(c.detail), esc(c.title));
  }
  return out + "</svg>\n";
}

std::string record_detail(const json& r) {
  std::string out = fmt::format("{} x {}\nverdict {} (expected: {}){}\n", r.value("scenario", ""), r.value("variant", ""),
                                r.value("verdict", ""), r.value("expectation", ""),
                                r.value("met", true) ? "" : ", NOT AS EXPECTED");
  for (const char* field : {"global_token_count", "rel_l2_error", "max_ulp", "logged_loss_rel_error",
                            "grad_norm_rel_error", "max_ulp_vs_baseline", "observation_digest"}) {
    if (r.contains(field)) out += fmt::format("{}: {}\n", field, number_text(r[field]));
  }
  if (r.contains("reasons") && r["reasons"].is_array()) {
    for (const json& reason : r["reasons"]) {
      if (reason.is_string()) out += "reason: " + reason.get<std::string>() + "\n";
    }
  }
  if (r.contains("why") && r["why"].is_string() && !r["why"].get<std::string>().empty()) {
    out += "why: " + r["why"].get<std::string>() + "\n";
  }
  return out;
}

// Each row's relative L2 error of its gradients (log scale) against its tolerance, per dtype.
std::string error_plots(const json& report) {
  std::map<std::string, std::vector<const json*>> by_dtype;
  for (const json& r : report.at("records")) by_dtype[r.value("dtype", "?")].push_back(&r);
  std::string out = "<div class=\"plots\">\n";
  for (const auto& [dtype, rows] : by_dtype) {
    constexpr double kLow = -17, kHigh = 1;  // log10 range shown; 0 plots at the bottom
    constexpr int kW = 520, kH = 200, kLeft = 44, kBottom = 18;
    double tolerance = 0;
    std::string points;
    std::size_t shown = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const json& r = *rows[i];
      if (r.contains("tolerance") && r["tolerance"].is_object()) tolerance = r["tolerance"].value("tensor_rel_l2", 0.0);
      if (!r.contains("rel_l2_error") || !r["rel_l2_error"].is_number()) continue;
      const double rel = r["rel_l2_error"].get<double>();
      const double level = rel > 0 ? std::clamp(std::log10(rel), kLow, kHigh) : kLow;
      const double x = kLeft + (kW - kLeft - 6) * (rows.size() > 1 ? static_cast<double>(i) / static_cast<double>(rows.size() - 1) : 0.5);
      const double y = (kH - kBottom) * (kHigh - level) / (kHigh - kLow) + 2;
      points += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2\" fill=\"{}\"><title>{} x {}: {}</title></circle>\n", x, y,
                            fill_of(kVerdictColours, r.value("verdict", "")), esc(r.value("scenario", "")),
                            esc(r.value("variant", "")), detail::sci(rel));
      ++shown;
    }
    out += fmt::format("<div class=\"plot\"><b>{}</b>: gradients' relative L2 error against the oracle, {} rows "
                       "(log scale, 1e-17 to 10; exact results at the bottom)<br>\n"
                       "<svg class=\"errors\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n",
                       esc(dtype), shown, kW, kH);
    for (int e = -16; e <= 0; e += 4) {
      const double y = (kH - kBottom) * (kHigh - e) / (kHigh - kLow) + 2;
      out += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/><text x=\"2\" y=\"{:.1f}\">1e{}</text>\n",
                         kLeft, kW, y, y, y + 3, e);
    }
    if (tolerance > 0) {
      const double y = (kH - kBottom) * (kHigh - std::log10(tolerance)) / (kHigh - kLow) + 2;
      out += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#d2483c\" stroke-dasharray=\"4 3\"/>"
                         "<text x=\"{}\" y=\"{:.1f}\">tolerance {}</text>\n",
                         kLeft, kW, y, y, kW - 110, y - 3, detail::sci(tolerance));
    }
    out += points + "</svg></div>\n";
  }
  return out + "</div>\n";
}

// Per rank, each token's weight in the consumed gradient (dots) against 1/N (the line).
std::string weight_plots(const std::vector<WeightPlot>& plots) {
  if (plots.empty()) return "<p>No multi-rank scenario in this run.</p>\n";
  std::string out = "<div class=\"plots\">\n";
  for (const WeightPlot& p : plots) {
    double high = p.expected_weight;
    for (const auto& [rank, weights] : p.ranks) {
      for (double w : weights) {
        if (std::isfinite(w)) high = std::max(high, w);
      }
    }
    high = high > 0 ? high * 1.15 : 1;
    constexpr int kW = 260, kH = 150, kLeft = 52, kBottom = 18;
    const std::size_t ranks = std::max<std::size_t>(1, p.ranks.size());
    const double band = static_cast<double>(kW - kLeft - 4) / static_cast<double>(ranks);
    std::string svg;
    auto y_of = [&](double w) { return (kH - kBottom) * (1 - w / high) + 2; };
    for (std::size_t i = 0; i < p.ranks.size(); ++i) {
      const auto& [rank, weights] = p.ranks[i];
      const double x0 = kLeft + band * static_cast<double>(i);
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\">r{} ({})</text>\n", x0 + 2, kH - 4, rank, weights.size());
      for (std::size_t t = 0; t < weights.size(); ++t) {
        if (!std::isfinite(weights[t])) continue;
        const double x = x0 + band * (0.15 + 0.7 * (weights.size() > 1 ? static_cast<double>(t) / static_cast<double>(weights.size() - 1) : 0.5));
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"1.8\" fill=\"#2b5fa8\"/>\n", x, y_of(weights[t]));
      }
    }
    const double y = y_of(p.expected_weight);
    out += fmt::format("<div class=\"plot\"><b>{}</b> x <b>{}</b>, N = {}<br>\n"
                       "<svg class=\"weights\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n"
                       "<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#d2483c\" stroke-dasharray=\"4 3\"/>"
                       "<text x=\"2\" y=\"{:.1f}\">1/N {:.3g}</text>\n<text x=\"2\" y=\"10\">{:.3g}</text>\n{}</svg></div>\n",
                       esc(p.scenario), esc(p.variant), p.global_token_count, kW, kH, kLeft, kW, y, y, y + 3,
                       p.expected_weight, high, svg);
  }
  return out + "</div>\n";
}

std::string page(const std::string& title, const std::string& body) {
  return fmt::format("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n"
                     "<style>{}</style>\n</head>\n<body>\n{}<script>{}</script>\n</body>\n</html>\n",
                     esc(title), kStyle, body, kScript);
}

}  // namespace

std::string render_html(const json& report, const std::vector<WeightPlot>& weights) {
  std::vector<Cell> cells;
  for (const json& r : report.at("records")) {
    const bool met = r.value("met", true);
    std::string title = fmt::format("{} x {}: {} (expected: {}), grad rel L2 {}", r.value("scenario", ""),
                                    r.value("variant", ""), r.value("verdict", ""), r.value("expectation", ""),
                                    number_text(r.value("rel_l2_error", json())));
    cells.push_back(Cell{r.value("scenario", ""), r.value("variant", ""), fill_of(kVerdictColours, r.value("verdict", "")),
                         !met, title, record_detail(r)});
  }
  const json& s = report.value("summary", json::object());
  std::string body = "<h1>gradnorm: loss and gradient normalisation check</h1>\n";
  body += fmt::format("<p class=\"summary\">{} rows: {} pass, {} fail, {} expected-error, {} error-mismatch; "
                      "negative controls caught {}/{}; documented findings reproduced {}; <b>unexpected {}</b></p>\n",
                      number_text(s.value("rows", json())), number_text(s.value("pass", json())),
                      number_text(s.value("fail", json())), number_text(s.value("expected_error", json())),
                      number_text(s.value("error_mismatch", json())), number_text(s.value("negative_controls_caught", json())),
                      number_text(s.value("negative_controls_visible", json())),
                      number_text(s.value("findings_reproduced", json())), number_text(s.value("unexpected", json())));
  body += "<h2>Verdicts: scenario x variant</h2>\n" + legend(kVerdictColours) +
          "<p>Hover a cell for its verdict, click it for its figures.</p>\n<pre id=\"detail\"></pre>\n" + grid(cells);
  body += "<h2>Per-token weights per rank (multi-rank scenarios)</h2>\n"
          "<p>Each dot is one valid token's weight in the gradient the optimizer consumed, read off by the "
          "token-weight probe; the dashed line is the contract's 1/N.</p>\n" +
          weight_plots(weights);
  body += "<h2>Errors against tolerance, per dtype</h2>\n" + error_plots(report);
  return page("gradnorm report", body);
}

std::string render_diff_html(const Diff& diff, const json& head) {
  std::vector<Cell> cells;
  for (const DiffRow& row : diff.rows) {
    const std::string change(to_string(row.change));
    const bool bad = row.change == Change::regression || row.change == Change::control_lost;
    std::string detail_text = fmt::format("{} x {}\n{}: {}\n", row.scenario, row.variant, change, row.detail);
    if (bad) detail_text += "reproduce: " + reproduce_command(diff.reproduce_arguments, row.scenario, row.variant) + "\n";
    if (!row.head.is_null()) detail_text += "\nhead:\n" + record_detail(row.head);
    if (!row.base.is_null()) detail_text += "\nbase:\n" + record_detail(row.base);
    cells.push_back(Cell{row.scenario, row.variant, fill_of(kChangeColours, change), bad,
                         fmt::format("{} x {}: {}", row.scenario, row.variant, change), detail_text});
  }
  const int regressions = diff.count(Change::regression) + diff.count(Change::control_lost);
  std::string body = "<h1>gradnorm: base against head</h1>\n";
  body += fmt::format("<p class=\"summary\"><b>{} regression{}</b>; base {} rows, head {} rows; {} fixed, {} drift, "
                      "{} bits changed, {} added, {} removed, {} unchanged</p>\n",
                      regressions, regressions == 1 ? "" : "s", diff.base_rows, diff.head_rows,
                      diff.count(Change::fixed), diff.count(Change::drift), diff.count(Change::bits_changed),
                      diff.count(Change::added), diff.count(Change::removed), diff.count(Change::unchanged));
  body += "<h2>What changed: scenario x variant</h2>\n" + legend(kChangeColours) +
          "<p>Hover a cell for what changed, click it for both sides' figures.</p>\n<pre id=\"detail\"></pre>\n" +
          grid(cells);
  body += "<h2>Head: errors against tolerance, per dtype</h2>\n" + error_plots(head);
  return page("gradnorm diff", body);
}

}  // namespace gradnorm::reports
