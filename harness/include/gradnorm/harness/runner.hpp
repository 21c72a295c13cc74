#pragma once
// Runs one scenario x variant on real LibTorch autograd and returns what a user would see,
// rank by rank.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/communicator.hpp"
#include "gradnorm/harness/observation.hpp"
#include "gradnorm/harness/variant.hpp"

namespace gradnorm::harness {

// Deliberate faults, to prove a broken rank fails the run promptly instead of hanging it.
enum class FaultKind { none, throw_error, exit_early, hang };

struct FaultInjection {
  int rank = -1;  // the rank that misbehaves; -1 for none
  int step = 0;   // at the start of this optimizer step
  FaultKind kind = FaultKind::none;
  // How "hang" hangs on this transport (threads: until the room aborts; a process: forever).
  std::function<void()> hang;
};

// Parses "RANK:KIND[@STEP]" with KIND one of throw, exit, hang; throws InvalidInput.
[[nodiscard]] FaultInjection parse_fault(const std::string& text);

// Thrown inside a rank when an injected fault makes it leave; the transport reports it.
struct RankExit {};

struct RunOptions {
  // How long a rank may wait for its peers in one collective before the run is aborted.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  FaultInjection fault;
};

struct RankedRun {
  std::vector<Observation> ranks;  // one per rank, in rank order
  // Set when a rank threw outside the recipe, exited or hung: names the rank and the cause.
  std::optional<std::string> fault;
};

// One rank's share of the run over `comm`. Recipe errors (a refusal, a LibTorch error) are
// recorded in the Observation; anything else propagates to the transport.
[[nodiscard]] Observation run_rank(const VariantSpec& variant, const scenarios::Scenario& scenario,
                                   const BatchSource& batches, Communicator& comm,
                                   const FaultInjection& fault);

// Ranks of multi-rank runs now running as threads of this process (0 when none): a fork
// then would copy one rank's thread into a child whose peers and locks did not come with it.
[[nodiscard]] int ranks_running_as_threads();

// Every rank as a thread of this process, reductions in rank order. Throws InvalidInput for
// an invalid scenario or a pair the harness cannot run (see not_applicable).
[[nodiscard]] RankedRun run_in_threads(const VariantSpec& variant,
                                       const scenarios::Scenario& scenario,
                                       const RunOptions& options = {});
[[nodiscard]] RankedRun run_in_threads(const VariantSpec& variant,
                                       const scenarios::Scenario& scenario,
                                       const BatchSource& batches, const RunOptions& options);

// World size 1 on the calling thread.
[[nodiscard]] Observation run_single_device(const VariantSpec& variant,
                                            const scenarios::Scenario& scenario);
// The same with micro-batches from `batches` instead of the scenario's generator; each must
// hold the valid count the scenario asks for (checked: InvalidInput otherwise).
[[nodiscard]] Observation run_single_device(const VariantSpec& variant,
                                            const scenarios::Scenario& scenario,
                                            const BatchSource& batches);

// The first line of an exception's text, without LibTorch's "Exception raised from" trailer.
[[nodiscard]] std::string first_line(const std::string& text);

}  // namespace gradnorm::harness
