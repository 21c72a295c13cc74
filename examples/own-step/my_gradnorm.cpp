// A complete gradnorm command with this project's steps added.
#include <gradnorm/tools/cli.hpp>

#include "own_steps.hpp"

int main(int argc, char** argv) {
  own_step::register_steps();
  return gradnorm::tools::run_command_line(argc, argv);
}
