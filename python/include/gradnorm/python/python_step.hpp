#pragma once
// Steps written in Python (docs/design.md §10): a file defines `def step(ctx)`; gradnorm
// runs it in an interpreter embedded in this process (one per process, started on first
// use, with the environment's torch), on the harness's own tensors, and judges it like any step.
//
//   gradnorm::python::register_python_step({.name = "my-skip",
//                                           .source = {"recipes/my_skip.py", "step"},
//                                           .reference = "baseline"});

#include <chrono>
#include <string>
#include <vector>

#include "gradnorm/harness/variant.hpp"

namespace gradnorm::python {

// Where a step is: a Python file and the function in it.
struct StepSource {
  std::string file;
  std::string function = "step";
};

// "FILE.py" or "FILE.py:FUNCTION". Throws scenarios::InvalidInput for an empty file name or
// function name.
[[nodiscard]] StepSource parse_step_source(const std::string& text);

struct PythonVariant {
  std::string name;  // empty: "py/" and the file's stem
  StepSource source;
  harness::Role role = harness::Role::candidate;
  // The variant whose error behaviour this one must match.
  std::string reference = "baseline";
  // A transcription of a registered variant expects that variant's documented findings
  // (the scenario's own and the recipe's); empty: none.
  std::string findings_of;
};

// Loads the file into this process's interpreter and describes the step. The file may also
// define `cannot_run(scenario) -> str | None` (scenario: a dict of the scenario's fields),
// the reason a scenario is outside what the step handles. Throws scenarios::InvalidInput
// naming FILE:LINE for a file that does not import (a syntax error, a failed import), and
// for a missing function, an unknown reference or findings_of, or a negative control (a
// Python step cannot say where its own bug is visible).
[[nodiscard]] harness::VariantSpec make_python_variant(const PythonVariant& variant);

// Real framework code run as a step (docs/design.md §11): --recipe FRAMEWORK:TARGET, where
// TARGET is a recipe the installed framework ships (torchtune:full_finetune_single_device)
// or a recipe file of the user's (torchtune:PATH.py), driven unmodified through its config.
struct RecipeVariant {
  std::string spec;               // "torchtune:NAME" or "torchtune:PATH.py"
  std::vector<std::string> args;  // --recipe-arg KEY=VALUE, as given
  std::string name;               // empty: "torchtune/" and NAME (or the file's stem)
  std::string reference = "baseline";
  std::string findings_of;
};

// Loads the recipe (the framework's import, the file, the class, the overrides); throws
// scenarios::InvalidInput naming what is wrong: an unknown framework or recipe, a recipe
// gradnorm does not judge (and why), a file that does not import, a --recipe-arg the
// scenario decides.
[[nodiscard]] harness::VariantSpec make_recipe_variant(const RecipeVariant& variant);

// The model a recipe run (--recipe FRAMEWORK:TARGET) gives scenarios whose model is built in
// ("python:FILE:FUNCTION" at a tiny size): torchtune's own Llama 3 builder
// (examples/torchtune/tiny_llama.py, with LoRA for the LoRA and distilling recipes), or
// transformers' LlamaForCausalLM (examples/transformers/tiny_llama.py), or a plain torch
// module for Lightning (examples/python/tiny_transformer.py).
[[nodiscard]] std::string default_recipe_model(std::string_view recipe);
// The framework argument a --recipe-arg sets the clip with ("max_grad_norm" for Trainer and
// SFTTrainer, "gradient_clip_val" for Lightning), or empty where the framework has none.
[[nodiscard]] std::string_view recipe_clip_argument(std::string_view recipe);

// make_python_variant, then harness::register_variant.
void register_python_step(const PythonVariant& variant);

// How long one call of a Python step may run before it counts as hung and is ended
// (default 60 s; the CLI passes --timeout).
void set_step_timeout(std::chrono::milliseconds timeout);

// Makes this process's c10d Gloo groups through the embedded interpreter's
// torch.distributed (harness/gloo_groups.hpp): rank processes need it, and
// gradnorm::tools::run_command_line calls it. The world group becomes torch.distributed's
// default group, so a Python step on a rank process uses the real process group.
void install_gloo_groups();

// Lets harness::make_model build model = "python:FILE.py:FUNCTION" scenarios in this
// process's interpreter (harness/model.hpp): FUNCTION(vocab_size=, hidden_size=,
// sequence_length=) returns a torch.nn.Module mapping token ids [B, T] to logits [B, T, V].
// gradnorm::tools::run_command_line calls it. A file, function or module a step cannot
// train (missing, raising, wrong logits, non-floating or no trainable parameters) is a
// scenarios::InvalidInput naming the scenario and the file.
void install_python_models();

// Takes the interpreter's GIL for good, if it was started: call on the main thread once
// nothing runs any more, just before the process exits (run_command_line does), so that
// torch's thread-local Python objects can be destroyed at exit.
void hold_interpreter_until_exit();

// Forking a process that runs the embedded interpreter (warm rank processes, docs/ranks.md):
// before_fork takes the GIL and CPython's fork locks, after_fork_parent and
// after_fork_child (in the child, which is then the only thread) give them back; the child's
// os.environ becomes ENVIRONMENT ("KEY=VALUE" entries), the C environment with it. Each does
// nothing where the interpreter never started.
void before_fork();
// fuzz --nproc: this process only plans runs for rank processes from now on, so a Python
// step's cannot_run answers as in a rank, which has a torch.distributed process group (warm
// ranks forget it). Nothing where the interpreter never started.
void plan_for_rank_processes();
// The names of the interpreter's Python threads but its main one (threading.enumerate()),
// none where it never started: what a supervisor that cannot fork warm ranks names.
[[nodiscard]] std::vector<std::string> python_threads();
void after_fork_parent();
void after_fork_child(const std::vector<std::string>& environment);

// Inside a Python process (the gradnorm package's extension module, `python -m gradnorm`):
// the harness uses the running interpreter, which already imported torch, instead of
// starting one, and never takes its GIL for good (hold_interpreter_until_exit). DESCRIPTION
// is what --version says of it. Call before anything uses Python.
void attach_to_running_interpreter(std::string description);
[[nodiscard]] bool attached_to_running_interpreter();

// The folder of the example models that --recipe runs use by default and bench --ranks
// times: the source tree's examples/ for a CMake build, the package's copy once installed.
void set_examples_dir(std::string folder);
[[nodiscard]] const std::string& examples_dir();

// The embedded Python, for `gradnorm --version`: the CPython version built in and the
// environment whose site-packages it takes (GRADNORM_PYTHON, or the one the build used),
// without starting the interpreter.
[[nodiscard]] std::string embedded_python_description();

// "candidate" or "reference"; throws InvalidInput for anything else.
[[nodiscard]] harness::Role parse_python_role(const std::string& text);

}  // namespace gradnorm::python
