#include <ATen/ATen.h>

#include <fmt/format.h>

#include <mutex>
#include <thread>

#include "gradnorm/harness/runner.hpp"
#include "rank_threads.hpp"

namespace gradnorm::harness {

FaultInjection parse_fault(const std::string& text) {
  FaultInjection fault;
  const auto colon = text.find(':');
  const auto at = text.find('@');
  auto fail = [&]() -> FaultInjection {
    throw scenarios::InvalidInput(fmt::format(
        "--inject-fault '{}': expected RANK:KIND[@STEP] with KIND one of throw, exit, hang "
        "(e.g. 1:hang or 0:throw@2)",
        text));
  };
  if (colon == std::string::npos) return fail();
  try {
    std::size_t used = 0;
    fault.rank = std::stoi(text.substr(0, colon), &used);
    if (used != colon || fault.rank < 0) return fail();
    const std::string kind = text.substr(colon + 1, at == std::string::npos ? std::string::npos : at - colon - 1);
    if (kind == "throw") fault.kind = FaultKind::throw_error;
    else if (kind == "exit") fault.kind = FaultKind::exit_early;
    else if (kind == "hang") fault.kind = FaultKind::hang;
    else return fail();
    if (at != std::string::npos) {
      fault.step = std::stoi(text.substr(at + 1), &used);
      if (used != text.size() - at - 1 || fault.step < 0) return fail();
    }
  } catch (const std::logic_error&) {
    return fail();
  }
  return fault;
}

RankedRun run_in_threads(const VariantSpec& variant, const scenarios::Scenario& scenario,
                         const RunOptions& options) {
  return run_in_threads(variant, scenario, scenario_batches(scenario), options);
}

RankedRun run_in_threads(const VariantSpec& variant, const scenarios::Scenario& scenario,
                         const BatchSource& batches, const RunOptions& options) {
  scenarios::validate(scenario);
  if (auto why = not_applicable(variant, scenario)) {
    throw scenarios::InvalidInput(fmt::format("variant '{}' cannot run scenario '{}': {}",
                                              variant.name, scenario.name, *why));
  }
  if (options.fault.rank >= scenario.world_size) {
    throw scenarios::InvalidInput(fmt::format("fault injected into rank {} but scenario '{}' has "
                                              "{} ranks",
                                              options.fault.rank, scenario.name,
                                              scenario.world_size));
  }
  const int world = scenario.world_size;
  auto room = std::make_shared<ThreadRoom>(world, options.timeout);
  FaultInjection fault = options.fault;
  fault.hang = [room, timeout = options.timeout, rank = fault.rank] {
    // Hang until the run is aborted, or abort it once the timeout passes with no progress.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!room->aborted() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    room->abort(fmt::format("rank {} hung: no progress within {} ms", rank, timeout.count()));
    throw CommunicationError(*room->aborted());
  };

  RankedRun out;
  out.ranks.resize(static_cast<std::size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    // What a rank that never finishes still reports: who it was.
    Observation& o = out.ranks[static_cast<std::size_t>(rank)];
    o.scenario = scenario.name;
    o.variant = variant.name;
    o.rank = rank;
  }
  std::mutex input_error_mutex;
  std::optional<std::string> input_error;
  auto run_one = [&](int rank) {
    ThreadCommunicator comm(room, rank);
    try {
      out.ranks[static_cast<std::size_t>(rank)] = run_rank(variant, scenario, batches, comm, fault);
    } catch (const RankExit&) {
      room->abort(fmt::format("rank {} exited before the run finished", rank));
    } catch (const CommunicationError&) {
      // The room already holds the cause, naming the rank that failed.
    } catch (const scenarios::InvalidInput& error) {
      std::lock_guard lock(input_error_mutex);
      if (!input_error) input_error = error.what();
      room->abort(fmt::format("rank {}: invalid input: {}", rank, error.what()));
    } catch (const std::exception& error) {
      room->abort(fmt::format("rank {} threw: {}", rank, first_line(error.what())));
    }
  };
  run_ranks_concurrently(world, run_one);  // rank 0 here, the others on pooled threads
  if (input_error) throw scenarios::InvalidInput(*input_error);
  out.fault = room->aborted();
  return out;
}

}  // namespace gradnorm::harness
