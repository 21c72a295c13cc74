#pragma once
// Runs scenarios x variants, judges each against the oracle and records what was expected
// of it: a reference or candidate must pass (or signal an expected error); a negative
// control must be flagged wherever its bug is visible.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradnorm/harness/transport.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/oracles/verdict.hpp"

namespace gradnorm::oracles {

enum class Expectation {
  agree,           // reference or candidate: pass or expected-error
  flag,            // negative control where its bug is visible: anything but pass
  not_applicable,  // negative control where its bug cannot show (e.g. clipping never bites)
  finding,         // a documented finding (Scenario::expected_verdicts): that exact verdict
};

struct EvaluationRow {
  scenarios::Scenario scenario;
  harness::VariantSpec variant;
  harness::Observation observation;  // rank 0's; every rank is judged
  // harness::digest of every rank's observation, in rank order: equal digests before and
  // after a change prove the change altered no number a user sees.
  std::vector<std::uint64_t> rank_digests;
  int world_size = 1;
  std::optional<std::string> fault;  // the run aborted: which rank and why
  Verdict verdict;
  Expectation expectation = Expectation::agree;
  bool met = true;            // the verdict is what the expectation asks for
  // Negative controls: why the bug is (in)visible here. Findings: the documented reason.
  std::string applicability;
  PairComparison against_reference;  // this variant vs its reference variant, bit for bit
  long global_token_count = 0;
  double oracle_loss = 0;        // first step; NaN when no gradient exists
  double oracle_grad_norm = 0;   // first step, before clipping
  // What the variant's code printed on this scenario (harness/output_capture.hpp), every
  // rank's, each line after "[rank R] " when there are several; shown when the row fails.
  std::string output;
};

struct SkippedPair {
  std::string scenario;
  std::string variant;
  std::string why;
};

struct Evaluation {
  std::vector<EvaluationRow> rows;
  std::vector<SkippedPair> skipped;  // pairs the harness cannot run (not_applicable)
  // Set when a run aborted (a rank threw outside the recipe, exited or hung): the
  // evaluation stopped there and its rows are incomplete.
  std::optional<std::string> fault;
  [[nodiscard]] bool all_met() const;
  [[nodiscard]] int count_unmet() const;
};

struct EvaluateOptions {
  // How long a rank may wait in one collective before the run is aborted (threads; a
  // transport given below carries its own).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Where runs happen; null: ranks as threads of this process.
  harness::Transport* transport = nullptr;
  // When false, documented findings are ignored: every reference and candidate must agree.
  bool use_documented_findings = true;
  // Scenarios judged at once, each on a worker thread of its own (its ranks are threads of
  // their own too). Only where every run stays in this process (ranks as threads); a
  // transport whose ranks are processes runs scenarios one at a time, in step with its peers.
  // The result is the same, bit for bit, whatever the number.
  int workers = 1;
};

// Scenarios outer, variants inner, both in the given order; deterministic. A run that
// faults ends the evaluation after its row (rows past it are dropped even when a worker
// already judged them).
[[nodiscard]] Evaluation evaluate(const std::vector<scenarios::Scenario>& scenarios,
                                  const std::vector<harness::VariantSpec>& variants,
                                  const EvaluateOptions& options = {});

[[nodiscard]] std::string_view to_string(Expectation expectation);

}  // namespace gradnorm::oracles
