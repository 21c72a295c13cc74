#pragma once
// `gradnorm bench --floor FILE`: the reference stream's per-case check written straight
// against LibTorch on one thread, no harness: what its operations alone cost per case.
// Prints figures; asserts nothing about them.

#include <string>

namespace gradnorm::tools {

int floor_bench_command(const std::string& stream_path);

}  // namespace gradnorm::tools
