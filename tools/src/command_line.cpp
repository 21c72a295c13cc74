// What the subcommands share (command_line.hpp).
#include "command_line.hpp"

#include "gradnorm/tools/cli.hpp"
#include "process_supervisor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "gradnorm/python/python_step.hpp"
#include "gradnorm/scenarios/catalogue.hpp"
#include "gradnorm/scenarios/files.hpp"
#include "gradnorm/scenarios/scenario_file.hpp"

namespace gradnorm::tools {

const CLI::Validator& readable_file() {
  static const CLI::Validator check(
    [](std::string& path) {
      const std::optional<std::string> why = scenarios::why_unreadable(path);
      return why ? "'" + path + "' " + *why : std::string();
    },
    "FILE");
  return check;
}

const CLI::Validator& finite_number() {
  static const CLI::Validator check(
      [](std::string& text) {
        double value = 0;
        try {
          std::size_t used = 0;
          value = std::stod(text, &used);
          if (used != text.size()) return std::string("is not a number: ") + text;
        } catch (const std::exception&) {
          return std::string("is not a number: ") + text;
        }
        return std::isfinite(value) ? std::string() : std::string("must be a finite number, got ") + text;
      },
      "FINITE");
  return check;
}

const CLI::Validator& seed_number() {
  static const CLI::Validator check(
      [](std::string& text) {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (text.empty() || error != std::errc() || stop != end) {
          return fmt::format("must be a whole number in [0, {}], got '{}'",
                             std::numeric_limits<std::uint64_t>::max(), text);
        }
        return std::string();
      },
      "SEED");
  return check;
}

std::optional<int>& process_rank() {
  static std::optional<int> rank;
  return rank;
}

namespace {

// The union of what each pattern selects, in the registry's own order; no pattern: all.
template <typename Item, typename Select>
std::vector<Item> pick(const std::vector<Item>& all, const std::vector<std::string>& patterns,
                       Select select) {
  if (patterns.empty()) return all;
  std::set<std::string> wanted;
  for (const std::string& pattern : patterns) {
    for (const Item& item : select(pattern)) wanted.insert(item.name);
  }
  std::vector<Item> out;
  for (const Item& item : all) {
    if (wanted.count(item.name)) out.push_back(item);
  }
  return out;
}

// True when some file holds [[scenario]] tables (a file may hold only [[variant]] tables).
bool files_have_scenarios(const std::vector<std::string>& files) {
  for (const std::string& file : files) {
    if (!scenarios::load_scenario_file_contents(file).scenarios.empty()) return true;
  }
  return false;
}

}  // namespace

// The catalogue plus every scenario file; only the files' scenarios when files are given
// and no pattern is.
std::vector<scenarios::Scenario> scenario_pool(const std::vector<std::string>& files,
                                               bool files_only) {
  std::vector<scenarios::Scenario> pool;
  // Where each name comes from. A file's scenario may not take a catalogue name even when
  // the catalogue is not in the pool: a report would then show two meanings under one name.
  std::unordered_map<std::string, std::string> origin;
  for (const scenarios::Scenario& s : scenarios::catalogue()) origin.emplace(s.name, "the catalogue");
  if (!files_only) pool = scenarios::catalogue();
  for (const std::string& file : files) {
    for (scenarios::Scenario& s : scenarios::load_scenario_file_contents(file).scenarios) {
      const auto [known, added] = origin.emplace(s.name, file);
      if (!added) {
        throw scenarios::InvalidInput(fmt::format(
            "{}: scenario '{}' is already defined in {}; give it a name of its own", file,
            s.name, known->second == file ? "this file" : known->second));
      }
      pool.push_back(std::move(s));
    }
  }
  return pool;
}

std::vector<scenarios::Scenario> pick_scenarios(const std::vector<std::string>& patterns,
                                                const std::vector<std::string>& files) {
  const auto pool = scenario_pool(files, patterns.empty() && files_have_scenarios(files));
  std::vector<scenarios::Scenario> picked = pick(pool, patterns, [&pool](std::string_view pattern) {
    return scenarios::select_scenarios(pool, pattern);
  });
  // A file whose scenarios -s selected none of ran none of them, silently: refused.
  if (!patterns.empty() && !files.empty()) {
    std::unordered_set<std::string> names;
    for (const scenarios::Scenario& p : picked) names.insert(p.name);
    for (const std::string& file : files) {
      const std::vector<scenarios::Scenario> own = scenarios::load_scenario_file_contents(file).scenarios;
      if (own.empty()) continue;
      const bool any = std::any_of(own.begin(), own.end(),
                                   [&names](const scenarios::Scenario& s) { return names.count(s.name) > 0; });
      if (!any) {
        throw scenarios::InvalidInput(fmt::format(
            "{}: none of its {} scenario(s) ('{}'{}) matches -s {}: select them by name or pattern, "
            "or leave out -f",
            file, own.size(), own.front().name, own.size() > 1 ? ", ..." : "", fmt::join(patterns, " -s ")));
      }
    }
  }
  return picked;
}

const scenarios::Scenario& find_named(const std::vector<scenarios::Scenario>& pool,
                                      const std::string& name) {
  return scenarios::find_scenario(pool, name);
}

std::vector<harness::VariantSpec> pick_variants(const std::vector<std::string>& patterns) {
  return pick(harness::variants(), patterns, harness::select_variants);
}

namespace {

void add_recipe_options(CLI::App& command, PythonStepOptions& options) {
  command.add_option("--recipe", options.recipe,
                     "judge a framework's own recipe code, unmodified: torchtune:NAME (a recipe "
                     "the installed torchtune ships), torchtune:PATH.py (your copy of one), "
                     "transformers:trainer (the installed transformers.Trainer), "
                     "transformers:PATH.py:NAME (your Trainer subclass or compute_loss_func), "
                     "trl:sft (TRL's SFTTrainer) or trl:PATH.py:NAME (your SFTTrainer subclass)");
  command.add_option("--recipe-arg", options.recipe_args,
                     "KEY=VALUE: override the recipe's config as `tune run` does, or set a "
                     "TrainingArguments (SFTConfig) field for transformers (trl) (repeatable); "
                     "keys the scenario decides are refused");
  command.add_option("--recipe-model", options.recipe_model,
                     "python:FILE.py:FUNCTION: the framework's model a recipe run gives scenarios "
                     "whose model is built in (default: examples/torchtune/tiny_llama.py, "
                     "examples/transformers/tiny_llama.py for transformers and trl)");
}

}  // namespace

void add_python_step_options(CLI::App& command, PythonStepOptions& options, bool recipes) {
  if (recipes) add_recipe_options(command, options);
  command.add_option("--python-step", options.source,
                     "judge a step written in Python: FILE.py[:FUNCTION] (default function "
                     "step); see docs/steps.md");
  command.add_option("--name", options.name,
                     "the Python step's variant name (default: py/ and the file's stem)");
  command.add_option("--reference", options.reference,
                     "the variant whose error behaviour the Python step must match (default "
                     "baseline)");
  command.add_option("--role", options.role, "candidate (default) or reference")
      ->check(CLI::IsMember({"candidate", "reference"}));
  command.add_option("--findings-of", options.findings_of,
                     "the Python step transcribes this variant: expect its documented findings");
}


void fork_ranks_warm(SupervisorOptions& supervisor) {
  supervisor.warm = [](int rank_argc, char** rank_argv) {
    harness::forget_declared_variants();  // the rank declares them from its own arguments
    return run_commands_again(rank_argc, rank_argv);
  };
  supervisor.before_fork = python::before_fork;
  supervisor.after_fork_parent = python::after_fork_parent;
  supervisor.after_fork_child = python::after_fork_child;
  supervisor.named_threads = python::python_threads;
}

std::vector<std::string> python_step_arguments(const PythonStepOptions& py) {
  std::vector<std::string> out;
  if (!py.source.empty()) {
    out.insert(out.end(), {"--python-step", py.source});
    if (!py.name.empty()) out.insert(out.end(), {"--name", py.name});
    if (py.reference != "baseline") out.insert(out.end(), {"--reference", py.reference});
    if (py.role != "candidate") out.insert(out.end(), {"--role", py.role});
    if (!py.findings_of.empty()) out.insert(out.end(), {"--findings-of", py.findings_of});
  }
  if (!py.recipe.empty()) {
    out.insert(out.end(), {"--recipe", py.recipe});
    for (const std::string& arg : py.recipe_args) out.insert(out.end(), {"--recipe-arg", arg});
    if (!py.recipe_model.empty()) out.insert(out.end(), {"--recipe-model", py.recipe_model});
    if (py.source.empty() && !py.name.empty()) out.insert(out.end(), {"--name", py.name});
  }
  return out;
}

// Registers the steps a run declares (--python-step, and [[variant]] tables in the scenario
// files) and returns their names, in declaration order. Rank processes re-run the same
// command line, so each registers the same steps in its own interpreter.
std::vector<std::string> declare_steps(const PythonStepOptions& cli_step,
                                       const std::vector<std::string>& files) {
  std::vector<std::string> names;
  auto declare = [&names](python::PythonVariant v) {
    const harness::VariantSpec spec = python::make_python_variant(v);
    names.push_back(spec.name);
    harness::register_variant(spec);
  };
  for (const std::string& file : files) {
    for (const scenarios::VariantDeclaration& d : scenarios::load_scenario_file_contents(file).variants) {
      if (!d.recipe.empty()) {
        try {
          const harness::VariantSpec spec = python::make_recipe_variant(
              python::RecipeVariant{d.recipe, d.recipe_args, d.name, d.reference, d.findings_of});
          names.push_back(spec.name);
          harness::register_variant(spec);
        } catch (const scenarios::InvalidInput& error) {
          throw scenarios::InvalidInput(fmt::format("{}: {}", d.where, error.what()));
        }
        continue;
      }
      try {
        declare(python::PythonVariant{d.name, python::parse_step_source(d.python),
                                      python::parse_python_role(d.role), d.reference,
                                      d.findings_of});
      } catch (const scenarios::InvalidInput& error) {
        throw scenarios::InvalidInput(fmt::format("{}: {}", d.where, error.what()));
      }
    }
  }
  if (!cli_step.recipe.empty()) {
    const harness::VariantSpec spec = python::make_recipe_variant(python::RecipeVariant{
        cli_step.recipe, cli_step.recipe_args, cli_step.source.empty() ? cli_step.name : "",
        cli_step.reference, cli_step.source.empty() ? cli_step.findings_of : ""});
    names.push_back(spec.name);
    harness::register_variant(spec);
  } else if (!cli_step.recipe_args.empty() || !cli_step.recipe_model.empty()) {
    throw scenarios::InvalidInput("--recipe-arg and --recipe-model describe a --recipe; none given");
  }
  if (!cli_step.source.empty()) {
    declare(python::PythonVariant{cli_step.name, python::parse_step_source(cli_step.source),
                                  python::parse_python_role(cli_step.role), cli_step.reference,
                                  cli_step.findings_of});
  } else if ((!cli_step.name.empty() || !cli_step.findings_of.empty()) && cli_step.recipe.empty()) {
    throw scenarios::InvalidInput("--name and --findings-of describe a --python-step or a "
                                  "--recipe; none given");
  }
  return names;
}

// The model a --recipe substitutes for built-in ones, as a scenario's model fields.
scenarios::Scenario recipe_model_probe(const PythonStepOptions& step) {
  const std::string spec =
      step.recipe_model.empty() ? python::default_recipe_model(step.recipe) : step.recipe_model;
  scenarios::Scenario probe;
  constexpr std::string_view kPython = "python:";
  if (spec.rfind(kPython, 0) == 0) {
    // As a scenario file's model: split at the first colon after the file's last '/'.
    const std::string rest = spec.substr(kPython.size());
    const auto slash = rest.find_last_of('/');
    const auto colon = rest.find(':', slash == std::string::npos ? 0 : slash);
    if (colon != std::string::npos && colon > 0 && colon + 1 < rest.size()) {
      probe.model = scenarios::ModelKind::python;
      probe.model_file = std::filesystem::absolute(rest.substr(0, colon)).lexically_normal().string();
      probe.model_function = rest.substr(colon + 1);
    }
  }
  if (probe.model != scenarios::ModelKind::python) {
    throw scenarios::InvalidInput(fmt::format(
        "--recipe-model '{}': expected python:FILE.py:FUNCTION (the framework's module)", spec));
  }
  return probe;
}

namespace {


std::string_view trimmed(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// The clip a --recipe-arg sets: Trainer's and SFTTrainer's max_grad_norm=V, Lightning's
// gradient_clip_val=V, DeepSpeed's gradient_clipping=V.
struct RecipeClip {
  std::string suffix;  // "@max_grad_norm=V", V as given: the scenarios judged are named for it
  double value;
};

// The framework's clip argument given as --recipe-arg KEY=V: its name suffix and value, or
// nothing where it is not given. Every such framework clips to V where V > 0 and not at all
// where V is 0 (TrainingArguments' documented meaning; Lightning's Precision.clip_gradients
// returns for V <= 0; DeepSpeed's engine clips where gradient_clipping > 0), so the scenario
// the oracle judges clips to V, or not at all.
std::optional<RecipeClip> recipe_clip(const PythonStepOptions& step) {
  const std::string_view key = python::recipe_clip_argument(step.recipe);
  if (key.empty()) return std::nullopt;
  std::optional<RecipeClip> found;
  for (const std::string& arg : step.recipe_args) {
    const auto equals = arg.find('=');
    if (equals == std::string::npos || trimmed(std::string_view(arg).substr(0, equals)) != key) {
      continue;
    }
    const std::string text(trimmed(std::string_view(arg).substr(equals + 1)));
    double value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
        value < 0) {
      throw scenarios::InvalidInput(fmt::format(
          "--recipe-arg {}: {} is a number >= 0 (0: no clipping), the norm the gradients are "
          "clipped to; the scenarios judged clip to it too",
          arg, key));
    }
    if (found) throw scenarios::InvalidInput(fmt::format("--recipe-arg {} is given twice", key));
    found.emplace(RecipeClip{fmt::format("@{}={}", key, text), value});
  }
  return found;
}

}  // namespace

std::vector<std::string> recipe_scenario_patterns(std::vector<std::string> patterns,
                                                  const PythonStepOptions& step) {
  if (step.recipe.empty()) return patterns;
  const std::string prefix = recipe_model_probe(step).model_function + "/";
  // Only this run's clip suffix: a name clipped otherwise is no scenario of this run.
  const auto clip = recipe_clip(step);
  const std::string suffix = clip ? clip->suffix : "";
  for (std::string& pattern : patterns) {
    if (pattern.size() > prefix.size() && pattern.rfind(prefix, 0) == 0) pattern.erase(0, prefix.size());
    if (!suffix.empty() && pattern.size() > suffix.size() &&
        pattern.compare(pattern.size() - suffix.size(), suffix.size(), suffix) == 0) {
      pattern.erase(pattern.size() - suffix.size());
    }
  }
  return patterns;
}

std::vector<scenarios::Scenario> with_recipe_model(std::vector<scenarios::Scenario> list,
                                                   const PythonStepOptions& step, bool recipes) {
  if (!recipes) return list;
  const scenarios::Scenario probe = recipe_model_probe(step);
  const auto clip = recipe_clip(step);
  std::vector<scenarios::Scenario> out;
  std::size_t left_out = 0;
  for (scenarios::Scenario s : list) {
    if (s.model == scenarios::ModelKind::causal_lm) {
      if (s.dtype == scenarios::DType::float64) {
        ++left_out;
        continue;
      }
      s.model = probe.model;
      s.model_file = probe.model_file;
      s.model_function = probe.model_function;
      s.name = probe.model_function + "/" + s.name;
    }
    if (clip) {  // named for it: the scenario's contract is no longer the catalogue's
      s.clip_max_norm = clip->value > 0 ? std::optional<double>(clip->value) : std::nullopt;
      s.name += clip->suffix;
    }
    out.push_back(std::move(s));
  }
  if (left_out > 0 && out.empty()) {
    throw scenarios::InvalidInput(fmt::format(
        "--recipe: every selected scenario is float64, which the framework's model does not "
        "compute in (torchtune's decoder returns float32 logits, transformers' Llama normalises "
        "in float32): choose float32 or bfloat16 scenarios"));
  }
  return out;
}

}  // namespace gradnorm::tools
