#pragma once
// Processes the code under test starts and leaves running (a forward's subprocess.Popen, a
// fork, multiprocessing's workers, a grandchild that called setsid): gradnorm adopts them and
// ends them when its command ends (docs/reliability.md, "What user code starts").

#include <string>

namespace gradnorm::harness {

// Makes this process the subreaper of its descendants (PR_SET_CHILD_SUBREAPER): a process
// orphaned below it (its parent exited, a setsid grandchild) becomes its child instead of
// init's, so end_descendants still finds it. Not inherited by fork(); every gradnorm
// process (a run, a rank process) calls it for itself.
void adopt_orphans();

// Sends SIGKILL to every descendant of this process still alive, until none is left, and
// reaps what became its children. Returns how many it ended. Async-signal-safe (raw system
// calls and static buffers): a signal handler may call it before the process goes.
int end_descendants();

// After end_descendants: "sleep x18, python3.11" (their names, as /proc/PID/comm gives
// them, most frequent first), or empty.
[[nodiscard]] std::string ended_descendants_named();

}  // namespace gradnorm::harness
