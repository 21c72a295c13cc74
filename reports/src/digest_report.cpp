#include <fmt/format.h>

#include "gradnorm/reports/report.hpp"

namespace gradnorm::reports {

std::string render_digests(const oracles::Evaluation& evaluation) {
  std::string out = "# scenario\tvariant\trank\tobservation digest\n";
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    for (std::size_t rank = 0; rank < row.rank_digests.size(); ++rank) {
      out += fmt::format("{}\t{}\t{}\t{:016x}\n", row.scenario.name, row.variant.name, rank,
                         row.rank_digests[rank]);
    }
  }
  return out;
}

}  // namespace gradnorm::reports
