// gradnorm::cli's run_command_line: the whole command line, fuzz included (cli.cpp).
#include "gradnorm/tools/cli.hpp"

#include "command_line.hpp"

namespace gradnorm::tools {

int run_command_line(int argc, char** argv) { return run_commands(argc, argv, &add_fuzz_command); }

}  // namespace gradnorm::tools
