#pragma once
// Threads that run ranks, kept from one run to the next (docs/design.md §8): a run of W
// ranks as threads borrows W - 1 of them and runs rank 0 on the calling thread, so a stream
// of small scenarios does not start and stop W threads for each one. Starting a thread here
// costs more than a small scenario's whole step: a fresh stack and thread-local block to
// fault in, and a stack handed back to the kernel when it ends.

#include <functional>

namespace gradnorm::harness {

// Runs body(rank) for every rank in [0, world), all at once: rank 0 on the calling thread,
// each other rank on a thread of its own, borrowed from a process-wide pool (started when
// none is idle). Returns when every rank has returned. body must not throw. When a thread
// cannot be started, throws std::runtime_error naming the rank before any rank runs.
void run_ranks_concurrently(int world, const std::function<void(int)>& body);

// Threads started so far (idle or busy): for tests and benchmarks.
[[nodiscard]] int rank_threads_started();

}  // namespace gradnorm::harness
