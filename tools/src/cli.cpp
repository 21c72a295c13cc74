// gradnorm: runs named scenarios x registered steps against the float64 oracle. Exit codes:
// 0 every row as expected, 1 some verdict was not what was expected, 2 usage or input
// error, 3 a rank failed (threw outside the recipe, exited or hung; the rank is named),
// 70 an internal error (a gradnorm bug: EX_SOFTWARE of sysexits.h).
#include "gradnorm/tools/cli.hpp"

#include <CLI/CLI.hpp>
#include <fnmatch.h>
#include <unistd.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <c10/util/Exception.h>

#include <algorithm>
#include <unordered_set>
#include <charconv>
#include <limits>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/oracles/token_weights.hpp"
#include "gradnorm/python/python_step.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/harness/transport.hpp"
#include "version.hpp"
#include "bench.hpp"
#include "floor_bench.hpp"
#include "diff_command.hpp"
#include "report_paths.hpp"
#include "gradnorm/reports/diff.hpp"
#include "gradnorm/reports/html.hpp"
#include "export.hpp"
#include "stream.hpp"
#include "fuzz.hpp"
#include "process_supervisor.hpp"
#include "gradnorm/scenarios/catalogue.hpp"
#include "gradnorm/scenarios/files.hpp"
#include "gradnorm/scenarios/scenario_file.hpp"

namespace {

using namespace gradnorm;

constexpr int kExitAsExpected = 0;
constexpr int kExitUnexpected = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInternal = 70;

// A file option's check (files.hpp): the message says what the path is (a folder, a FIFO, a
// device, a symbolic link loop), where CLI::ExistingFile said "does not exist" of a loop.
const CLI::Validator readable_file(
    [](std::string& path) {
      const std::optional<std::string> why = scenarios::why_unreadable(path);
      return why ? "'" + path + "' " + *why : std::string();
    },
    "FILE");

// This process's rank when it runs as one (--launcher env or slurm), for naming it when it fails.
std::optional<int> g_process_rank;
// A scenario may take up to this share of the machine's memory unless --memory-budget says
// otherwise: the rest is the system's, and the estimate's margin.
constexpr double kDefaultMemoryFraction = 0.5;

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

// True when some file holds [[scenario]] tables (a file may hold only [[variant]] tables).
bool files_have_scenarios(const std::vector<std::string>& files) {
  for (const std::string& file : files) {
    if (!scenarios::load_scenario_file_contents(file).scenarios.empty()) return true;
  }
  return false;
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

// A step written in Python, from the command line.
struct PythonStepOptions {
  std::string source;  // FILE.py[:FUNCTION]; empty: none
  std::string name;
  std::string reference = "baseline";
  std::string role = "candidate";
  std::string findings_of;
  // Real framework code (--recipe FRAMEWORK:TARGET), its config overrides, and the model it
  // gives scenarios whose model is built in.
  std::string recipe;
  std::vector<std::string> recipe_args;
  std::string recipe_model;
};

void add_recipe_options(CLI::App& command, PythonStepOptions& options);

// `recipes`: the command also takes --recipe (run, bench and fuzz).
void add_python_step_options(CLI::App& command, PythonStepOptions& options, bool recipes = false) {
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

// The steps a run declares (--python-step, [[variant]] tables) always run, with what
// --variant selects; without --variant and without declared steps, every variant runs.
std::vector<harness::VariantSpec> pick_run_variants(const std::vector<std::string>& patterns,
                                                    const std::vector<std::string>& declared) {
  if (declared.empty()) return pick_variants(patterns);
  std::vector<std::string> wanted = declared;
  if (!patterns.empty()) {
    for (const harness::VariantSpec& v : pick_variants(patterns)) wanted.push_back(v.name);
  }
  std::vector<harness::VariantSpec> out;
  for (const harness::VariantSpec& v : harness::variants()) {
    if (std::find(wanted.begin(), wanted.end(), v.name) != wanted.end()) out.push_back(v);
  }
  return out;
}

struct RunOptions {
  std::vector<std::string> scenario_patterns;
  std::vector<std::string> variant_patterns;
  std::string json_path;
  std::string markdown_path;
  std::string digests_path;
  std::string junit_path;
  std::string html_path;
  std::vector<tools::ReportPath> given_reports;  // every report option, as given
  bool quiet = false;
  bool ignore_findings = false;
  std::string launcher = "threads";
  int processes = 0;
  bool processes_given = false;  // --nproc was on the command line
  double timeout_seconds = 60;
  std::string fault;
  std::string backend = "gloo";
  std::vector<std::string> scenario_files;
  PythonStepOptions python_step;
  int jobs = 0;  // 0: every core
  std::string memory_budget;  // empty: kDefaultMemoryFraction of the machine's memory
};

std::chrono::milliseconds timeout_of(const RunOptions& options) {
  return std::chrono::milliseconds(static_cast<long>(options.timeout_seconds * 1000));
}

// The same command line for a rank process, with "--launcher env" (added when --nproc
// alone chose processes, so a rank never starts ranks of its own).
std::vector<std::string> rank_arguments(int argc, char** argv) {
  std::vector<std::string> out;
  bool launcher_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--launcher" && i + 1 < argc) {
      out.push_back(arg);
      out.push_back("env");
      launcher_given = true;
      ++i;
    } else if (arg.rfind("--launcher=", 0) == 0) {
      out.push_back("--launcher=env");
      launcher_given = true;
    } else {
      out.push_back(arg);
    }
  }
  if (!launcher_given) {
    out.push_back("--launcher");
    out.push_back("env");
  }
  return out;
}

// `source`: what set the world size, for the message (--nproc, or a launcher's variable).
std::vector<scenarios::Scenario> with_world_size(std::vector<scenarios::Scenario> list, int world,
                                                 const std::string& source = "--nproc") {
  std::erase_if(list, [world](const scenarios::Scenario& s) { return s.world_size != world; });

  if (list.empty()) {
    throw scenarios::InvalidInput(fmt::format(
        "no selected scenario has world_size {}: pick one with --scenario (e.g. dist/5-3/float32 "
        "for 2 ranks) or change {}",
        world, source));
  }
  return list;
}

// What, besides -s and -v, runs one row of this run again: its scenario files and its
// Python step, as given.
std::vector<std::string> reproduce_arguments(const RunOptions& options) {
  std::vector<std::string> out;
  for (const std::string& file : options.scenario_files) {
    out.push_back("-f");
    out.push_back(file);
  }
  const PythonStepOptions& py = options.python_step;
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
  if (options.ignore_findings) out.push_back("--ignore-findings");
  return out;
}

// Every file a run reads, which no report may overwrite.
std::vector<std::string> run_inputs(const RunOptions& options,
                                    const std::vector<scenarios::Scenario>& scenario_list) {
  std::vector<std::string> inputs = options.scenario_files;
  if (!options.python_step.source.empty()) {
    inputs.push_back(options.python_step.source);
    const std::size_t colon = options.python_step.source.rfind(':');
    if (colon != std::string::npos) inputs.push_back(options.python_step.source.substr(0, colon));
  }
  for (const scenarios::Scenario& s : scenario_list) {
    if (!s.model_file.empty()) inputs.push_back(s.model_file);
  }
  const std::string& recipe = options.python_step.recipe;
  // FRAMEWORK:PATH.py, or transformers:PATH.py:NAME.
  const std::size_t py = recipe.rfind(".py");
  if (py != std::string::npos && (py + 3 == recipe.size() || recipe[py + 3] == ':')) {
    const std::size_t start = recipe.find(':') + 1;
    if (start <= py) inputs.push_back(recipe.substr(start, py + 3 - start));
  }
  return inputs;
}

// The HTML report's per-token weights: the token-weight probe on each multi-rank scenario of
// the run, with each variant the run judged there, at most kMaxWeightPlots of them.
constexpr std::size_t kMaxWeightPlots = 96;
std::vector<reports::WeightPlot> weight_plots(const oracles::Evaluation& evaluation) {
  std::vector<reports::WeightPlot> plots;
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    if (plots.size() >= kMaxWeightPlots) break;
    if (row.scenario.world_size < 2 || row.scenario.global_token_count() == 0) continue;
    if (harness::not_applicable(row.variant, row.scenario)) continue;
    const oracles::TokenWeightReport weights = oracles::probe_token_weights(row.scenario, row.variant);
    if (weights.outcome != "ok") continue;
    reports::WeightPlot plot{row.scenario.name, row.variant.name, weights.global_token_count,
                             weights.expected_weight, {}};
    for (const oracles::RankTokenWeights& rank : weights.ranks) plot.ranks.emplace_back(rank.rank, rank.weights);
    plots.push_back(std::move(plot));
  }
  return plots;
}

int report(const oracles::Evaluation& evaluation, const RunOptions& options,
           const harness::RunSettings& settings) {
  if (evaluation.fault) {
    // Nothing half-done is presented as complete: no report files for an aborted run.
    fmt::print(stderr, "gradnorm: run aborted: {}\n", *evaluation.fault);
    return tools::kExitRankFailed;
  }
  // Reports are complete before anything is printed as done; each is written atomically.
  // Built only when a report is made from it: for a large run it is not free.
  const bool wants_json = !options.json_path.empty() || !options.junit_path.empty() || !options.html_path.empty();
  const nlohmann::json json_report =
      wants_json ? reports::to_json(evaluation, settings, reproduce_arguments(options)) : nlohmann::json();
  if (!options.json_path.empty()) {
    reports::write_file_atomically(options.json_path, json_report.dump(2) + "\n");
  }
  if (!options.junit_path.empty()) {
    reports::write_file_atomically(options.junit_path, reports::render_junit(json_report));
  }
  if (!options.html_path.empty()) {
    reports::write_file_atomically(options.html_path,
                                   reports::render_html(json_report, weight_plots(evaluation)));
  }
  if (!options.markdown_path.empty()) {
    reports::write_file_atomically(options.markdown_path,
                                   reports::render_markdown(evaluation, settings));
  }
  if (!options.digests_path.empty()) {
    reports::write_file_atomically(options.digests_path, reports::render_digests(evaluation));
  }
  const std::string table = reports::render_table(evaluation);
  if (options.quiet) {
    std::fputs(table.substr(table.rfind("\n", table.size() - 2) + 1).c_str(), stdout);
  } else {
    std::fputs(table.c_str(), stdout);
  }
  if (!evaluation.skipped.empty()) {
    fmt::print("{} pairs left out (the harness cannot run them), e.g. {} x {}: {}\n",
               evaluation.skipped.size(), evaluation.skipped.front().scenario,
               evaluation.skipped.front().variant, evaluation.skipped.front().why);
  }
  return evaluation.all_met() ? kExitAsExpected : kExitUnexpected;
}

// This machine's memory: physical memory, or the control group's limit when lower.
double machine_memory_bytes() {
  double bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  std::string text;
  if (limit >> text && text != "max") {
    try {
      bytes = std::min(bytes, std::stod(text));
    } catch (const std::logic_error&) {
    }
  }
  return bytes;
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1 << 30)); }

// The memory budget: "--memory-budget" as bytes with an optional K, M, G or T suffix (powers
// of 1024, "iB" or "B" may follow) or as a percentage of the machine's memory.
struct MemoryBudget {
  double bytes = 0;
  std::string says;  // how it was set, for messages
};

MemoryBudget memory_budget(const std::string& text) {
  const double machine = machine_memory_bytes();
  if (text.empty()) {
    return {machine * kDefaultMemoryFraction,
            fmt::format("{} of this machine's {}", gib(machine * kDefaultMemoryFraction), gib(machine))};
  }
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::logic_error&) {
  }
  std::string unit = text.substr(used);
  const auto fail = [&] {
    throw scenarios::InvalidInput(fmt::format(
        "--memory-budget '{}': expected a size such as 8G, 512M or 2.5GiB, or a share of this "
        "machine's memory such as 75%",
        text));
  };
  if (!std::isfinite(value) || value <= 0 || used == 0) fail();
  if (unit == "%") {
    if (value > 100) fail();
    return {machine * value / 100, fmt::format("{} ({} of this machine's {})", gib(machine * value / 100), text, gib(machine))};
  }
  if (unit.size() >= 2 && (unit.ends_with("iB") || unit.ends_with("ib"))) unit.resize(unit.size() - 2);
  else if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  double scale = 1;
  if (unit.size() > 1) fail();
  if (!unit.empty()) {
    const std::string units = "KMGT";
    const std::size_t power = units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0]))));
    if (power == std::string::npos) fail();
    scale = std::pow(1024.0, static_cast<double>(power + 1));
  }
  return {value * scale, fmt::format("{} (--memory-budget {})", gib(value * scale), text)};
}

// --backend nccl on a machine where NCCL cannot run (no toolkit at build time, no driver,
// no GPU) is an input error that says which, before any collective is tried.
void check_nccl_usable(const harness::Rendezvous& rendezvous) {
  // One sentence for every reason, a build without NCCL included: the harness says it.
  const int device = rendezvous.local_rank >= 0 ? rendezvous.local_rank : rendezvous.rank;
  if (const auto why = harness::nccl_unavailable_reason(device)) {
    throw scenarios::InvalidInput(*why);  // the sentence names --backend nccl itself
  }
}

// Input errors a rank would only meet once running, found before any rank starts.
void check_before_running(const std::vector<scenarios::Scenario>& scenario_list,
                          const harness::RunOptions& run_options, const RunOptions& options,
                          int* workers) {
  const harness::FaultInjection& fault = run_options.fault;
  for (const scenarios::Scenario& s : scenario_list) {
    // (Processes checked --nproc already; a rank process's scenarios have its world size.)
    if (fault.rank >= 0 && options.launcher != "processes" && fault.rank >= s.world_size) {
      throw scenarios::InvalidInput(fmt::format(
          "--inject-fault {}: scenario '{}' has {} ranks (0..{}), so rank {} would never fail",
          options.fault, s.name, s.world_size, s.world_size - 1, fault.rank));
    }
    if (fault.rank >= 0 && fault.step >= s.steps) {
      throw scenarios::InvalidInput(fmt::format(
          "--inject-fault {}: scenario '{}' has {} step{} (0..{}), so step {} never comes",
          options.fault, s.name, s.steps, s.steps == 1 ? "" : "s", s.steps - 1, fault.step));
    }
    for (const scenarios::ExpectedVerdict& e : s.expected_verdicts) {
      const auto& all = harness::variants();
      if (std::none_of(all.begin(), all.end(), [&](const harness::VariantSpec& v) {
            return fnmatch(e.variant_pattern.c_str(), v.name.c_str(), 0) == 0;
          })) {
        // Named with its file: a [[scenario.expect]] table is found by file and scenario.
        std::string where = "the catalogue";
        for (const std::string& file : options.scenario_files) {
          const auto own = scenarios::load_scenario_file_contents(file).scenarios;
          if (std::any_of(own.begin(), own.end(), [&s](const scenarios::Scenario& o) { return o.name == s.name; })) {
            where = file;
          }
        }
        throw scenarios::InvalidInput(fmt::format(
            "{}: scenario '{}': the documented finding for variant '{}' matches no variant (see "
            "gradnorm list --variants); a finding that can never apply cannot be checked",
            where, s.name, e.variant_pattern));
      }
    }
  }
  // A model from a file is loaded, built and checked now, once per process and before any
  // row runs: a bad file is an input error, and a Python model's random draws are made
  // here, one build at a time, never beside a running step (python/src/python_model.cpp).
  for (const scenarios::Scenario& s : scenario_list) {
    if (scenarios::model_from_file(s.model)) {
      harness::check_model_is_a_function(s, *harness::make_model(s, harness::ModelConfig{s.model}));
    }
  }
  // Memory: ranks as threads hold every rank in this process; a rank process holds one, and
  // the supervisor's W processes share this machine.
  const MemoryBudget budget = memory_budget(options.memory_budget);
  const bool one_rank = options.launcher == "env" || options.launcher == "slurm";
  double largest = 0;
  for (const scenarios::Scenario& s : scenario_list) {
    const int processes = options.launcher == "processes" ? s.world_size : 1;
    const int ranks_each = options.launcher == "threads" ? s.world_size : 1;
    const double need = processes * scenarios::estimate_memory_bytes(s, ranks_each);
    if (need > budget.bytes) {
      throw scenarios::InvalidInput(fmt::format(
          "scenario '{}' needs about {} by gradnorm's estimate ({:.3g} parameter elements per "
          "rank, {} rank{} here, {} x {} x {} logits a micro-batch), more than the memory budget "
          "of {}; make it smaller or raise --memory-budget",
          s.name, gib(need), scenarios::parameter_elements(s), one_rank ? 1 : s.world_size,
          s.world_size == 1 || one_rank ? "" : "s", s.micro_batch_size,
          s.sequence_length, s.vocab_size, budget.says));
    }
    largest = std::max(largest, need);
  }
  // Scenarios judged at once share the budget; fewer at once change no result (design §8).
  if (workers != nullptr && largest > 0) {
    const double fit = std::floor(budget.bytes / largest);
    *workers = std::max(1, static_cast<int>(std::min(fit, static_cast<double>(*workers))));
  }
}

// A recipe builds its model with a framework builder, so a scenario whose model is built in
// (causal_lm) becomes the same scenario with the framework's model (--recipe-model), named
// FUNCTION/NAME; float64 ones are left out (torchtune trains in fp32 or bf16, its decoder's
// logits are float32). Other models stay, and the recipe says why it cannot run them.
// Whether the run judges a recipe: --recipe, or a [[variant]] with a recipe in a scenario file.
bool run_has_recipe(const RunOptions& options) {
  if (!options.python_step.recipe.empty()) return true;
  for (const std::string& file : options.scenario_files) {
    for (const scenarios::VariantDeclaration& d : scenarios::load_scenario_file_contents(file).variants) {
      if (!d.recipe.empty()) return true;
    }
  }
  return false;
}

std::vector<scenarios::Scenario> with_recipe_model(std::vector<scenarios::Scenario> list,
                                                   const PythonStepOptions& step, bool recipes) {
  if (!recipes) return list;
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

int run_command(const RunOptions& options, int argc, char** argv) {
  const bool recipes = run_has_recipe(options);
  auto scenario_list = with_recipe_model(
      pick_scenarios(options.scenario_patterns, options.scenario_files), options.python_step, recipes);
  // Before anything runs: a report path that cannot or must not be written is an input error.
  tools::check_report_paths(options.given_reports, run_inputs(options, scenario_list));
  tools::remove_partial_reports_on_signals();
  harness::RunOptions run_options;
  run_options.timeout = timeout_of(options);
  // Before the steps load: their import and cannot_run run under --timeout too.
  python::set_step_timeout(run_options.timeout);
  const std::vector<std::string> declared =
      declare_steps(options.python_step, options.scenario_files);
  const auto variant_list = pick_run_variants(options.variant_patterns, declared);
  if (!options.fault.empty()) run_options.fault = harness::parse_fault(options.fault);
  if (options.launcher == "threads" && options.processes_given) {
    throw scenarios::InvalidInput(
        "--nproc W starts W rank processes; it cannot go with --launcher threads (drop one)");
  }
  if (options.launcher == "threads" && options.backend != "gloo") {
    // It was silently ignored: rank threads meet in the harness's own rooms, not over c10d.
    throw scenarios::InvalidInput(fmt::format(
        "--backend {} is the c10d backend of rank processes; ranks as threads use none: add "
        "--nproc W (or --launcher env, slurm)",
        options.backend));
  }
  int workers = options.jobs > 0
                    ? options.jobs
                    : 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  if (options.launcher == "processes") {
    if (options.processes < 1) {
      throw scenarios::InvalidInput("--launcher processes needs --nproc W (the number of ranks)");
    }
    if (run_options.fault.rank >= options.processes) {
      throw scenarios::InvalidInput(fmt::format(
          "--inject-fault {}: rank {} does not exist with --nproc {} (ranks 0..{})", options.fault,
          run_options.fault.rank, options.processes, options.processes - 1));
    }
    // Fail here, not in W children.
    check_before_running(with_world_size(scenario_list, options.processes), run_options, options,
                         nullptr);
    if (options.backend == "nccl") {
      harness::Rendezvous last;  // rank r of the supervisor's W reduces on cuda:r
      last.rank = options.processes - 1;
      check_nccl_usable(last);
    }
    return tools::supervise(tools::SupervisorOptions{
        .processes = options.processes,
        .timeout = run_options.timeout,
        .rank_arguments = rank_arguments(argc, argv)});
  }

  oracles::EvaluateOptions evaluate_options{
      .timeout = run_options.timeout,
      .use_documented_findings = !options.ignore_findings,
      // Two scenarios per core by default: a scenario's rank threads wait for each other at
      // every collective, and another scenario's ranks fill those waits (docs/design.md §8).
      .workers = workers};
  std::unique_ptr<harness::Transport> transport;
  if (options.launcher == "env" || options.launcher == "slurm") {
    const harness::Rendezvous rendezvous = options.launcher == "slurm"
                                               ? harness::rendezvous_from_slurm()
                                               : harness::rendezvous_from_environment();
    g_process_rank = rendezvous.rank;
    scenario_list = with_world_size(scenario_list, rendezvous.world_size,
                                    options.launcher == "slurm" ? "the job's task count (SLURM_NTASKS)"
                                                                : "the launcher's WORLD_SIZE");
    check_before_running(scenario_list, run_options, options, &evaluate_options.workers);
    if (options.backend == "nccl") check_nccl_usable(rendezvous);
    harness::DeterminismGuard guard;
    transport = harness::make_process_group_transport(rendezvous, run_options, options.backend);
    evaluate_options.transport = transport.get();
    const oracles::Evaluation evaluation = [&] {
      try {
        return oracles::evaluate(scenario_list, variant_list, evaluate_options);
      } catch (const harness::RankExit&) {
        throw;  // an injected exit vanishes without a word, as a crashed rank would
      } catch (const scenarios::InvalidInput& error) {
        transport->abort(fmt::format("rank {}: {}", rendezvous.rank, error.what()));
        throw;
      } catch (const harness::CommunicationError& error) {
        throw harness::CommunicationError(transport->abort(harness::first_line(error.what())));
      } catch (const std::exception& error) {
        throw harness::CommunicationError(transport->abort(
            fmt::format("rank {} threw: {}", rendezvous.rank, harness::first_line(error.what()))));
      }
    }();
    // Every rank has every observation: a rank serving the store may now let it go.
    transport->finish();
    if (rendezvous.rank != 0) {  // rank 0 reports for everyone
      tools::write_rank_done(rendezvous.rank);
      return kExitAsExpected;
    }
    harness::RunSettings settings = guard.settings();
    settings.transport = harness::describe_process_group(rendezvous, options.backend);
    const int code = report(evaluation, options, settings);
    if (code == kExitAsExpected || code == kExitUnexpected) tools::write_rank_done(0);
    return code;
  }

  check_before_running(scenario_list, run_options, options, &evaluate_options.workers);
  // A recipe sets torch's process-wide default dtype while it builds its model
  // (torchtune.training.set_default_dtype): a scenario judged beside it on another thread
  // would build tensors in the other's dtype (measured: float32 rows off by 2^-10, bfloat16
  // parameters refused by the recipe's own dtype check). One scenario at a time, then.
  if (recipes) evaluate_options.workers = 1;
  harness::DeterminismGuard guard;
  harness::ThreadTransport threads(run_options);
  evaluate_options.transport = &threads;
  const oracles::Evaluation evaluation =
      oracles::evaluate(scenario_list, variant_list, evaluate_options);
  harness::RunSettings settings = guard.settings();
  settings.transport = "threads";
  return report(evaluation, options, settings);
}

// The catalogue (or, with files, the files' scenarios) and the variants; `names_only`: one
// name per line, for scripts (the CMake function that registers scenario files as tests).
int list_command(bool scenarios_only, bool variants_only, bool names_only,
                 const std::vector<std::string>& files) {
  if (!variants_only) {
    for (const scenarios::Scenario& s : scenario_pool(files, !files.empty())) {
      fmt::print("{}\n", names_only ? s.name : scenarios::describe(s));
    }
  }
  if (!scenarios_only) {
    for (const harness::VariantSpec& v : harness::variants()) {
      if (names_only) {
        fmt::print("{}\n", v.name);
        continue;
      }
      fmt::print("{:<32} {:<17} reference {}\n", v.name, harness::to_string(v.role), v.reference);
      fmt::print("    {}\n", v.summary);
      for (const harness::Citation& c : v.cites) fmt::print("    {}\n", harness::to_string(c));
    }
  }
  return kExitAsExpected;
}

int show_command(const std::string& name, const std::vector<std::string>& files) {
  const auto pool = scenario_pool(files, false);
  const scenarios::Scenario& s = find_named(pool, name);
  fmt::print("{}\n", scenarios::describe(s));
  fmt::print("N = {} valid tokens; per rank:", s.global_token_count());
  for (int rank = 0; rank < s.world_size; ++rank) fmt::print(" {}", s.rank_token_count(rank));
  fmt::print("\n");
  harness::DeterminismGuard guard;
  const oracles::OracleResult oracle =
      oracles::run_oracle(s, harness::model_config_for(harness::find_variant("baseline"), s));
  fmt::print("contract: {}\n", oracle.contract);
  for (std::size_t step = 0; step < oracle.steps.size(); ++step) {
    fmt::print("oracle step {}: loss {:.9g}, grad norm {:.9g}, clip coef {:.6g}\n", step,
               oracle.steps[step].loss, oracle.steps[step].total_norm, oracle.steps[step].clip_coef);
  }
  for (const scenarios::ExpectedVerdict& e : s.expected_verdicts) {
    fmt::print("documented finding: {} -> {}: {}\n", e.variant_pattern, e.verdict, e.reason);
  }
  return kExitAsExpected;
}

std::string weight_range(const std::vector<double>& weights) {
  if (weights.empty()) return "-";
  const auto [low, high] = std::minmax_element(weights.begin(), weights.end());
  if (*low == *high) return fmt::format("{:.6g}", *low);
  return fmt::format("{:.6g} .. {:.6g}", *low, *high);
}

int explain_command(const std::string& name, const std::vector<std::string>& variant_patterns,
                    const std::vector<std::string>& files) {
  const auto pool = scenario_pool(files, false);
  const scenarios::Scenario& s = find_named(pool, name);
  std::vector<std::string> patterns = variant_patterns;
  if (patterns.empty()) patterns = {"baseline", "skip", "world-size-only", "global-prenorm"};
  const auto variant_list = pick_variants(patterns);
  harness::DeterminismGuard guard;
  fmt::print("{}: W={}, N={}; tokens per rank:", s.name, s.world_size, s.global_token_count());
  for (int rank = 0; rank < s.world_size; ++rank) fmt::print(" {}", s.rank_token_count(rank));
  fmt::print("\nToken-weight probe: one zero-initialised parameter row per token position, so each\n"
             "token's gradient is its own row and its weight is read off exactly.\n\n");
  fmt::print("{:<32} {:>5} {:>7} {:>14} {:>22} {:>9}\n", "variant", "rank", "tokens", "expected",
             "observed", "ratio");
  for (const harness::VariantSpec& v : variant_list) {
    if (auto why = harness::not_applicable(v, s)) {
      fmt::print("{:<32} not applicable: {}\n", v.name, *why);
      continue;
    }
    const oracles::TokenWeightReport report = oracles::probe_token_weights(s, v);
    if (report.outcome != "ok") {
      fmt::print("{:<32} {}\n", v.name, report.outcome);
      continue;
    }
    for (const oracles::RankTokenWeights& rank : report.ranks) {
      std::string ratio = "-";
      if (!rank.weights.empty()) {
        const auto [low, high] = std::minmax_element(rank.weights.begin(), rank.weights.end());
        ratio = *low == *high ? fmt::format("{:.4g}", *low / report.expected_weight)
                              : fmt::format("{:.4g}..{:.4g}", *low / report.expected_weight,
                                            *high / report.expected_weight);
      }
      fmt::print("{:<32} {:>5} {:>7} {:>14.6g} {:>22} {:>9}\n", v.name, rank.rank, rank.tokens,
                 report.expected_weight, weight_range(rank.weights), ratio);
    }
    fmt::print("{:<32} weights rel L2 error {:.4g} (orthogonal per-token gradients)\n", v.name,
               report.rel_l2_error);
  }
  return kExitAsExpected;
}

}  // namespace

namespace gradnorm::tools {

int run_command_line(int argc, char** argv) {
  // The program ends when this returns (python::hold_interpreter_until_exit says why).
  struct HoldInterpreterAtReturn {
    ~HoldInterpreterAtReturn() { python::hold_interpreter_until_exit(); }
  } hold_at_return;
  // Rank processes make their c10d Gloo groups through torch.distributed (gloo_groups.hpp);
  // models from Python files are built by the same interpreter (harness/model.hpp).
  python::install_gloo_groups();
  python::install_python_models();
  CLI::App app{"gradnorm: proves whether a training step normalises losses and gradients like "
               "a float64 oracle"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return tools::version_text(); });
  app.footer("The guide: README.md, then docs/ (docs/judging.md first).");

  RunOptions run_options;
  // CLI11's Range lets NaN through (every comparison with it is false): refuse it, and the
  // infinities, by name.
  const CLI::Validator finite_number(
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
  // CLI11 reads "-1" into an unsigned seed as 2^64 - 1 and saturates 2^64: a seed is digits
  // that fit 64 bits, or an error.
  const CLI::Validator seed_number(
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
  CLI::App* run = app.add_subcommand("run", "run scenarios x variants and print the verdicts");
  run->footer("The guide: docs/judging.md (verdicts), docs/reports.md (reports), docs/ranks.md (--nproc, launchers), docs/frameworks.md (--recipe).");
  run->add_option("--scenario,-s", run_options.scenario_patterns,
                  "scenario name or shell pattern (repeatable; default: the whole catalogue)");
  run->add_option("--scenario-file,-f", run_options.scenario_files,
                  "TOML file of [[scenario]] tables (repeatable); alone, runs only its scenarios")
      ->check(readable_file);
  run->add_option("--variant,-v", run_options.variant_patterns,
                  "variant name or shell pattern (repeatable; default: every variant)");
  run->add_option("--json", run_options.json_path, "write one JSON record per row to PATH");
  run->add_option("--markdown", run_options.markdown_path, "write a pull-request report to PATH");
  run->add_option("--html", run_options.html_path,
                  "write a self-contained HTML report to PATH: the verdict grid, per-token weights, "
                  "errors against tolerance");
  run->add_option("--junit", run_options.junit_path,
                  "write JUnit XML to PATH: a testcase per row, failures for unexpected rows");
  run->add_option("--digests", run_options.digests_path,
                  "write every rank's observation digest to PATH (one line per rank of a row)");
  run->add_flag("--quiet,-q", run_options.quiet, "print the summary line only");
  run->add_option("--launcher", run_options.launcher,
                  "threads (default): ranks as threads; processes: --nproc W processes over "
                  "c10d Gloo started here; env: this process is one rank, from RANK, "
                  "WORLD_SIZE and MASTER_ADDR/MASTER_PORT (torchrun, its agent's store too) "
                  "or GRADNORM_STORE, or Slurm's variables without RANK; slurm: one rank of "
                  "srun, from SLURM_PROCID, SLURM_NTASKS and SLURM_JOB_NODELIST")
      ->check(CLI::IsMember({"threads", "processes", "env", "slurm"}));
  run->add_option("--backend", run_options.backend,
                  "c10d backend of rank processes: gloo (default) or nccl (raw NCCL on "
                  "cuda:LOCAL_RANK; needs a CUDA GPU and driver at run time, and a build that "
                  "found the CUDA toolkit's nccl.h)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  run->add_option("--nproc", run_options.processes,
                  "ranks as W processes over c10d Gloo (implies --launcher processes); runs the "
                  "selected scenarios with that world size")
      ->check(CLI::Range(1, 1024));
  run->add_option("--timeout", run_options.timeout_seconds,
                  "seconds a rank may wait for its peers in one collective, and a Python step may "
                  "run (its import, its cannot_run, each call of the step) (default 60)")
      ->check(finite_number)
      ->check(CLI::Range(0.01, 86400.0));
  run->add_option("--inject-fault", run_options.fault,
                  "make a rank fail on purpose: RANK:KIND[@STEP], KIND one of throw, exit, hang");
  add_python_step_options(*run, run_options.python_step, /*recipes=*/true);
  run->add_option("--jobs,-j", run_options.jobs,
                  "scenarios judged at once with ranks as threads (default: two per core); the "
                  "results are the same whatever the number")
      ->check(CLI::Range(1, 1024));
  run->add_option("--memory-budget", run_options.memory_budget,
                  "the most memory a scenario may need by gradnorm's estimate, as a size (8G, "
                  "512M) or a share of this machine's memory (75%); default: half of it. A "
                  "scenario above it is an input error, before any rank starts");
  run->add_flag("--ignore-findings", run_options.ignore_findings,
                "treat documented findings as failures: every reference and candidate must "
                "agree with the oracle");

  bool scenarios_only = false, variants_only = false;
  CLI::App* list = app.add_subcommand("list", "list the scenario catalogue and the variants");
  list->footer("The guide: docs/scenarios.md.");
  list->add_flag("--scenarios", scenarios_only, "scenarios only");
  list->add_flag("--variants", variants_only, "variants only");
  bool names_only = false;
  list->add_flag("--names", names_only, "names only, one per line");
  std::vector<std::string> list_files;
  list->add_option("--scenario-file,-f", list_files,
                   "list this file's scenarios instead of the catalogue (repeatable)")
      ->check(readable_file);

  std::string show_name;
  CLI::App* show = app.add_subcommand("show", "describe one scenario and its oracle");
  show->footer("The guide: docs/scenarios.md.");
  show->add_option("scenario", show_name, "scenario name")->required();
  std::vector<std::string> show_files;
  show->add_option("--scenario-file,-f", show_files, "TOML scenario file (repeatable)")
      ->check(readable_file);

  std::string explain_name;
  std::vector<std::string> explain_variants;
  CLI::App* explain = app.add_subcommand(
      "explain", "print each variant's effective per-token weight, per rank, against 1/N");
  explain->footer("The guide: docs/judging.md.");
  explain->add_option("scenario", explain_name, "scenario name")->required();
  std::vector<std::string> explain_files;
  explain->add_option("--scenario-file,-f", explain_files, "TOML scenario file (repeatable)")
      ->check(readable_file);
  explain->add_option("--variant,-v", explain_variants,
                      "variant name or pattern (repeatable; default: baseline, skip, "
                      "world-size-only, global-prenorm)");

  std::vector<std::string> export_patterns, export_files;
  std::string export_out;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "write oracle vectors (batches, initial parameters, the oracle's answers) that "
                "torch.load reads, one file per scenario, for Python test suites");
  export_cmd->footer("The guide: docs/steps.md (oracle vectors for pytest).");
  export_cmd->add_option("scenario", export_patterns, "scenario names or shell patterns")->required();
  export_cmd->add_option("--out", export_out, "the folder to write OUT/<scenario>.pt into")->required();
  export_cmd->add_option("--scenario-file,-f", export_files, "TOML scenario file (repeatable)")
      ->check(readable_file);

  tools::StreamOptions stream_options;
  CLI::App* stream = app.add_subcommand(
      "stream", "write the reference stream of ragged steps (the speed workload) as a scenario file");
  stream->footer("The guide: docs/speed.md.");
  // At most about 400 bytes a case (8 ranks x 4 counts): 100,000 cases stay within the
  // 64 MiB a scenario file may hold, so `run -f` reads every stream this writes.
  stream->add_option("--cases", stream_options.cases, "scenarios in the stream (default 300, at most 100000)")
      ->check(CLI::Range(1, 100000));
  stream->add_option("--seed", stream_options.seed, "the stream's seed (default 1)")
      ->check(seed_number);
  stream->add_option("--out", stream_options.out, "the TOML file to write (default: standard output)");

  tools::FuzzOptions fuzz_options;
  CLI::App* fuzz = app.add_subcommand(
      "fuzz", "check the harness's properties over many generated scenarios");
  fuzz->footer("The guide: docs/steps.md and docs/reliability.md.");
  fuzz->add_option("--cases", fuzz_options.cases, "cases per property (default 1000)")
      ->check(CLI::Range(1, 100000000));
  fuzz->add_option("--variant,-v", fuzz_options.variants,
                   "fuzz this step (name or pattern, repeatable): it must agree with the oracle "
                   "wherever its reference does; default: the harness's own properties");
  fuzz->add_option("--seed", fuzz_options.seed, "generator seed; the same seed replays the same cases")
      ->check(seed_number);
  PythonStepOptions fuzz_python_step;
  add_python_step_options(*fuzz, fuzz_python_step, /*recipes=*/true);

  tools::BenchOptions bench_options;
  CLI::App* bench = app.add_subcommand(
      "bench", "seconds per scenario and peak memory, ranks as threads and as Gloo processes");
  bench->footer("The guide: docs/speed.md.");
  bench->add_option("--repeat", bench_options.repeat, "runs per configuration (median reported)")
      ->check(CLI::Range(1, 1000));
  bench->add_option("--threads", bench_options.thread_ranks, "world sizes to run as threads")
      ->check(CLI::IsMember({2, 4, 8, 32, 64}));
  bench->add_option("--processes", bench_options.process_ranks, "world sizes to run as processes")
      ->check(CLI::IsMember({2, 4, 8, 32, 64}));
  PythonStepOptions bench_python_step;
  add_python_step_options(*bench, bench_python_step, /*recipes=*/true);
  std::string bench_against;
  long scale_pass_max = 0;
  bench->add_option("--scale-pass", scale_pass_max,
                    "time the scale pass the pull request skips, on 10^6 up to this many "
                    "gradient elements (e.g. 1000000000), against a copy and a whole step")
      ->check(CLI::Range(1'000'000L, 4'000'000'000L));
  bench->add_option("--against", bench_against,
                    "with --python-step: the C++ variant to time it against (default: "
                    "--findings-of, else --reference)");
  std::string one_launcher, one_out;
  int one_ranks = 0, one_repeat = 1;
  CLI::App* bench_one = app.add_subcommand("bench-one", "one bench measurement (used by bench)");
  bench_one->group("");  // internal
  bench_one->add_option("launcher", one_launcher)->required()->check(CLI::IsMember({"threads", "processes"}));
  bench_one->add_option("ranks", one_ranks)->required();
  bench_one->add_option("repeat", one_repeat)->required();
  bench_one->add_option("out", one_out)->required();
  int one_accumulation = 0, one_length = 0;
  bench_one->add_option("accumulation", one_accumulation);
  bench_one->add_option("length", one_length);
  std::string bench_floor;
  bench->add_option("--floor", bench_floor,
                    "time the per-case check of a stream file (`gradnorm stream`) written "
                    "straight against LibTorch on one thread, with no harness: the floor "
                    "under gradnorm's per-case cost")
      ->check(readable_file);
  bool bench_growth = false;
  bench->add_flag("--growth", bench_growth,
                  "tabulate time and peak memory per case against world size, sequence length "
                  "and accumulation, threads and processes");

  tools::DiffCommandOptions diff_options;
  CLI::App* diff = app.add_subcommand(
      "diff", "compare two JSON reports (a pull request's base and head): regressions, fixes, "
              "drift; exit 1 on a regression");
  diff->footer("The guide: docs/reports.md.");
  diff->add_option("base", diff_options.base, "the base's JSON report")->required();
  diff->add_option("head", diff_options.head, "the head's JSON report")->required();
  diff->add_option("--markdown", diff_options.markdown_path,
                   "write the pull-request comment to PATH (default: print it)");
  diff->add_option("--junit", diff_options.junit_path, "write JUnit XML to PATH");
  diff->add_option("--html", diff_options.html_path,
                   "write a self-contained HTML page to PATH: the grid by change, the head's errors");
  diff->add_option("--drift-ulp", diff_options.drift_ulp,
                   "a passing row drifts when its max ULP to the oracle grew by more than this (default 64)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 62));
  diff->add_option("--drift-factor", diff_options.drift_factor,
                   "... or its relative L2 error grew by this factor (default 2)")
      ->check(finite_number)
      ->check(CLI::Range(1.0, 1e12));
  std::string validate_path;
  CLI::App* validate_report = app.add_subcommand(
      "validate-report", "check a JSON report against gradnorm's report schema (docs/report.schema.json)");
  validate_report->footer("The guide: docs/reports.md.");
  validate_report->add_option("file", validate_path, "the JSON report")->required();

  // --nproc W alone means ranks as W Gloo processes: one flag from threads to processes.
  run->callback([&] {
    // Made absolute before any user code runs: a step that changes the working folder
    // (os.chdir) moves no report.
    for (std::string* path : {&run_options.json_path, &run_options.markdown_path, &run_options.digests_path,
                              &run_options.junit_path, &run_options.html_path}) {
      *path = scenarios::absolute_path(*path);
    }
    run_options.given_reports = {
        {"--json", run_options.json_path, run->count("--json") > 0},
        {"--markdown", run_options.markdown_path, run->count("--markdown") > 0},
        {"--digests", run_options.digests_path, run->count("--digests") > 0},
        {"--junit", run_options.junit_path, run->count("--junit") > 0},
        {"--html", run_options.html_path, run->count("--html") > 0}};
    run_options.processes_given = run->count("--nproc") > 0;
    if (run->count("--nproc") > 0 && run->count("--launcher") == 0) {
      run_options.launcher = "processes";
    }
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? kExitAsExpected : kExitUsage;
  }
  for (std::string* path : {&stream_options.out, &export_out, &diff_options.markdown_path,
                            &diff_options.junit_path, &diff_options.html_path}) {
    *path = scenarios::absolute_path(*path);
  }
  try {
    if (*run) return run_command(run_options, argc, argv);
    if (*list) return list_command(scenarios_only, variants_only, names_only, list_files);
    if (*diff) {
      diff_options.markdown_given = diff->count("--markdown") > 0;
      diff_options.junit_given = diff->count("--junit") > 0;
      diff_options.html_given = diff->count("--html") > 0;
      return tools::diff_command(diff_options);
    }
    if (*validate_report) return tools::validate_report_command(validate_path);
    if (*show) return show_command(show_name, show_files);
    if (*explain) return explain_command(explain_name, explain_variants, explain_files);
    if (*bench) {
      if (scale_pass_max > 0) return tools::scale_pass_bench_command(scale_pass_max, bench_options.repeat);
      if (bench_growth) return tools::growth_bench_command(bench_options.repeat);
      if (!bench_floor.empty()) return tools::floor_bench_command(bench_floor);
      if (bench_python_step.source.empty() && bench_python_step.recipe.empty()) {
        if (!bench_against.empty()) {  // it was silently ignored
          throw scenarios::InvalidInput("bench --against " + bench_against +
                                        ": times a Python step against a C++ variant; give --python-step "
                                        "FILE.py (or --recipe)");
        }
        return tools::bench_command(bench_options);
      }
      const auto start = std::chrono::steady_clock::now();
      const std::vector<std::string> declared = declare_steps(bench_python_step, {});
      const double startup =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string against = bench_against;
      if (against.empty()) {
        against = bench_python_step.findings_of.empty() ? bench_python_step.reference
                                                        : bench_python_step.findings_of;
      }
      const bool recipe = !bench_python_step.recipe.empty();
      return tools::python_bench_command(
          declared.front(), against, bench_options.repeat, startup,
          [&](scenarios::Scenario s) {
            if (!recipe) return s;
            std::vector<scenarios::Scenario> one = with_recipe_model({std::move(s)}, bench_python_step, true);
            return one.front();
          });
    }
    if (*stream) return tools::stream_command(stream_options);
    if (*export_cmd) {
      return tools::export_command(pick_scenarios(export_patterns, export_files), export_out);
    }
    if (*fuzz) {
      const std::vector<std::string> declared = declare_steps(fuzz_python_step, {});
      if (fuzz_options.variants.empty()) fuzz_options.variants = declared;
      if (!fuzz_python_step.recipe.empty()) {
        if (!fuzz_python_step.source.empty()) {
          throw scenarios::InvalidInput("fuzz: --recipe and --python-step each need a run of "
                                        "their own; give one");
        }
        fuzz_options.variants = declared;
        fuzz_options.recipe_model = [step = fuzz_python_step](scenarios::Scenario s) {
          return with_recipe_model({std::move(s)}, step, true).front();
        };
        // The generated scenarios run on one device, ranks as threads: a recipe that needs
        // more (a process group) is refused before any case runs.
        scenarios::Scenario probe = fuzz_options.recipe_model(scenarios::Scenario{});
        if (auto why = harness::not_applicable(harness::find_variant(declared.front()), probe)) {
          throw scenarios::InvalidInput(fmt::format(
              "fuzz --recipe {}: {} (fuzz generates one-device scenarios and runs them in this "
              "process; judge it with gradnorm run --recipe ... --nproc W)",
              fuzz_python_step.recipe, *why));
        }
      }
      return tools::fuzz_command(fuzz_options);
    }
    if (*bench_one) {
      return tools::bench_one_command(one_launcher, one_ranks, one_repeat, one_out,
                                      one_accumulation, one_length);
    }
  } catch (const scenarios::InvalidInput& error) {
    fmt::print(stderr, "gradnorm: {}\n", error.what());
    return kExitUsage;
  } catch (const harness::RankExit&) {
    std::_Exit(4);  // an injected exit: vanish without a word, as a crashed rank would
  } catch (const std::filesystem::filesystem_error& error) {
    // A path the user gave that the checks before the work let through (a folder removed
    // under a run): an input error naming it, never a rank failure.
    fmt::print(stderr, "gradnorm: {}\n", error.what());
    return kExitUsage;
  } catch (const std::exception& error) {
    // A rank that failed outside the recipe: leave the cause for the supervisor. Exit 3
    // means a rank failed, so it needs a rank: this process's own (a rank process of a run),
    // or the one a communication error names.
    const std::string rank_text = g_process_rank ? std::to_string(*g_process_rank) : "";
    const char* rank = g_process_rank ? rank_text.c_str() : *run ? std::getenv("RANK") : nullptr;
    const bool communication = dynamic_cast<const harness::CommunicationError*>(&error) != nullptr ||
                               dynamic_cast<const harness::RankFailure*>(&error) != nullptr;
    if (!communication && rank == nullptr) {
      fmt::print(stderr,
                 "gradnorm: internal error (a bug in gradnorm, not in your input or step; "
                 "please report it with the command line): {}\n",
                 harness::first_line(error.what()));
      return kExitInternal;
    }
    const std::string cause =
        communication ? harness::first_line(error.what())
                      : fmt::format("rank {} threw: {}", rank, harness::first_line(error.what()));
    tools::write_rank_status(rank ? std::atoi(rank) : -1, cause);
    fmt::print(stderr, "gradnorm: {}\n", cause);
    return tools::kExitRankFailed;
  }
  return kExitUsage;
}

}  // namespace gradnorm::tools
