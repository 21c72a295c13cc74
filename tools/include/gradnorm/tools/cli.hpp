#pragma once
// The whole `gradnorm` command line as a library call, so a user's own executable is a
// complete gradnorm with their steps added (docs/design.md §6):
//
//   int main(int argc, char** argv) {
//     my_project::register_my_steps();   // gradnorm::harness::register_variant(...)
//     return gradnorm::tools::run_command_line(argc, argv);
//   }
//
// Rank processes (--nproc W) re-run this same executable, so they register the same steps.

namespace gradnorm::tools {

// Parses argv as `gradnorm` does and runs the command. Returns the exit status: 0 every
// row as expected, 1 a verdict was not what was expected of it, 2 a usage or input error,
// 3 a rank failed (threw outside the recipe, exited or hung). Return its status from main:
// on return the embedded Python's GIL stays with this thread until the process exits.
int run_command_line(int argc, char** argv);

}  // namespace gradnorm::tools
