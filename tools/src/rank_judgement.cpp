#include "rank_judgement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "gradnorm/oracles/judgement.hpp"
#include "gradnorm/reports/report.hpp"

namespace gradnorm::tools {
namespace {

// One line each: "judged a,b", "disagreements c", "reference agrees|disagrees", then the
// explanation to the end of the file. Check names hold no comma or newline (kCheckNames).
std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string after(const std::string& line, const std::string& key, const std::string& path) {
  if (line.rfind(key + " ", 0) != 0 && line != key) {
    throw std::runtime_error(fmt::format("{}: expected a line \"{} ...\", read \"{}\"", path, key, line));
  }
  return line.size() > key.size() ? line.substr(key.size() + 1) : std::string();
}

}  // namespace

void write_rank_judgement(const oracles::Evaluation& evaluation, const std::string& variant,
                          const std::string& path) {
  const oracles::EvaluationRow* step = nullptr;
  const oracles::EvaluationRow* reference = nullptr;
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    if (row.variant.name == variant) step = &row;
  }
  if (step == nullptr) {
    std::string why = "not run";
    for (const oracles::SkippedPair& pair : evaluation.skipped) {
      if (pair.variant == variant) why = pair.why;
    }
    reports::write_file_atomically(path, "skipped " + why + "\n");
    return;
  }
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    if (row.variant.name == step->variant.reference && row.variant.name != variant) reference = &row;
  }
  oracles::Judgement judgement{.row = *step, .reference_row = std::nullopt};
  if (reference != nullptr) judgement.reference_row = *reference;
  reports::write_file_atomically(
      path, fmt::format("judged {}\ndisagreements {}\nreference {}\n{}", fmt::join(judgement.judged_checks(), ","),
                        fmt::join(judgement.disagreements(), ","),
                        judgement.reference_agrees() ? "agrees" : "disagrees",
                        oracles::explain(judgement, /*probe_weights=*/false)));
}

RankJudgement read_rank_judgement(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: rank 0 left no judgement", path));
  RankJudgement out;
  std::string line;
  std::getline(in, line);
  if (line.rfind("skipped ", 0) == 0) {
    out.skipped = line.substr(8);
    return out;
  }
  out.judged = split(after(line, "judged", path));
  std::getline(in, line);
  out.disagreements = split(after(line, "disagreements", path));
  std::getline(in, line);
  out.reference_agrees = after(line, "reference", path) == "agrees";
  std::stringstream rest;
  rest << in.rdbuf();
  out.explanation = rest.str();
  return out;
}

}  // namespace gradnorm::tools
