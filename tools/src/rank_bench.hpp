#pragma once
// `gradnorm bench --ranks`: what rank processes cost against ranks as threads and one device,
// printed beside the targets docs/speed.md sets for them; whole commands, each a child
// process of its own, timed alternately. Prints figures; asserts nothing about them.

namespace gradnorm::tools {

int rank_bench_command(int repeat);

}  // namespace gradnorm::tools
