// The gradnorm command: the built-in steps only.
#include "gradnorm/tools/cli.hpp"

int main(int argc, char** argv) { return gradnorm::tools::run_command_line(argc, argv); }
