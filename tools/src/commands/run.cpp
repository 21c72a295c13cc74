// `gradnorm run`: scenarios x variants against the oracle, the verdicts and the reports.
#include <fnmatch.h>
#include <unistd.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "../bench.hpp"
#include "../command_line.hpp"
#include "../process_supervisor.hpp"
#include "../rank_judgement.hpp"
#include "../report_paths.hpp"
#include "gradnorm/tools/cli.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/output_capture.hpp"
#include "gradnorm/harness/transport.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/token_weights.hpp"
#include "gradnorm/python/python_step.hpp"
#include "gradnorm/reports/html.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/files.hpp"
#include "gradnorm/scenarios/scenario_file.hpp"

namespace gradnorm::tools {
namespace {

// A scenario may take up to this share of the machine's memory unless --memory-budget says
// otherwise: the rest is the system's, and the estimate's margin.
constexpr double kDefaultMemoryFraction = 0.5;

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
  std::string log_path;  // what the code under test printed (harness/output_capture.hpp)
  std::vector<ReportPath> given_reports;  // every report option, as given
  bool quiet = false;
  bool verbose = false;  // what the code under test prints, printed as it comes
  bool ignore_findings = false;
  bool plan = false;
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
  // fuzz --nproc's rank processes (hidden): rank 0 writes the one case's judgement of the
  // first -v step here (rank_judgement.hpp) instead of reporting.
  std::string judgement_path;
};

std::chrono::milliseconds timeout_of(const RunOptions& options) {
  return std::chrono::milliseconds(static_cast<long>(options.timeout_seconds * 1000));
}

// The same command line for a rank process, with "--launcher env" (added when --nproc
// alone chose processes, so a rank never starts ranks of its own).
// Whether --nproc forks warm rank processes: GRADNORM_WARM_RANKS=1 (exec is the default).
bool warm_ranks() {
  const char* value = std::getenv("GRADNORM_WARM_RANKS");
  return value != nullptr && std::string(value) == "1";
}

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
// Python step, as given, and for ranks that were processes (PROCESSES of them; 0: threads)
// --nproc, so a step that needs a process group (DDP) runs where it can.
std::vector<std::string> reproduce_arguments(const RunOptions& options, int processes) {
  std::vector<std::string> out;
  for (const std::string& file : options.scenario_files) {
    out.push_back("-f");
    out.push_back(file);
  }
  const std::vector<std::string> step = python_step_arguments(options.python_step);
  out.insert(out.end(), step.begin(), step.end());
  if (options.ignore_findings) out.push_back("--ignore-findings");
  if (processes > 0) out.insert(out.end(), {"--nproc", std::to_string(processes)});
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

// What the code under test printed in this process (harness/output_capture.hpp): each row's,
// then what no row owned (imports, a recipe's set-up), for --log.
struct PrintedOutput {
  std::string log;
  std::size_t lines = 0;
};
PrintedOutput printed_output(const oracles::Evaluation& evaluation) {
  PrintedOutput out;
  auto add = [&out](const std::string& heading, const std::string& text) {
    if (text.empty()) return;
    out.log += fmt::format("== {} ==\n{}", heading, text);
    out.lines += static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
  };
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    add(fmt::format("{} x {}", row.scenario.name, row.variant.name), row.output);
  }
  add("outside every row (imports, set-up)", harness::take_run_output());
  return out;
}

int report(const oracles::Evaluation& evaluation, const RunOptions& options,
           const harness::RunSettings& settings, int processes = 0) {
  if (evaluation.fault) {
    // Nothing half-done is presented as complete: no report files for an aborted run.
    fmt::print(stderr, "gradnorm: run aborted: {}\n", *evaluation.fault);
    return kExitRankFailed;
  }
  if (evaluation.rows.empty() && !evaluation.skipped.empty()) {
    // Every pair selected is one the harness cannot run: nothing was judged, which is not a
    // run that went as expected. No report: it would hold no row.
    const oracles::SkippedPair& first = evaluation.skipped.front();
    fmt::print(stderr,
               "gradnorm: nothing to judge: every selected pair is left out ({}), e.g. {} x {}: {}\n",
               evaluation.skipped.size(), first.scenario, first.variant, first.why);
    return kExitUsage;
  }
  // Reports are complete before anything is printed as done; each is written atomically.
  // Built only when a report is made from it: for a large run it is not free.
  const bool wants_json = !options.json_path.empty() || !options.junit_path.empty() || !options.html_path.empty();
  const nlohmann::json json_report =
      wants_json ? reports::to_json(evaluation, settings, reproduce_arguments(options, processes)) : nlohmann::json();
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
  const PrintedOutput printed = printed_output(evaluation);
  if (!options.log_path.empty()) reports::write_file_atomically(options.log_path, printed.log);
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
  if (printed.lines > 0 && options.log_path.empty() && !options.quiet) {
    fmt::print(stderr,
               "gradnorm: the code under test printed {} line{}, held back from the table (a "
               "failing row shows its own); --log PATH keeps them, --verbose prints them as "
               "they come\n",
               printed.lines, printed.lines == 1 ? "" : "s");
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
  // Memory: ranks as threads hold every rank in this process; a rank process holds one, and
  // the supervisor's W processes share this machine.
  const MemoryBudget budget = memory_budget(options.memory_budget);
  const bool one_rank = options.launcher == "env" || options.launcher == "slurm";
  double largest = 0;
  for (const scenarios::Scenario& s : scenario_list) {
    const int processes = options.launcher == "processes" ? s.world_size : 1;
    const int ranks_each = options.launcher == "threads" ? s.world_size : 1;
    // A python: model's own parameters, from its build (once per process, before its check
    // runs a forward): a 400 MB parameter reached 14.5 GB under a 300M budget when a model
    // from a file counted as none.
    const double elements = [&s] {
      harness::DeterminismGuard one_thread;  // as the check below builds it
      return harness::model_parameter_elements(s);
    }();
    const double need = processes * scenarios::estimate_memory_bytes(s, ranks_each, elements);
    if (need > budget.bytes) {
      throw scenarios::InvalidInput(fmt::format(
          "scenario '{}' needs about {} by gradnorm's estimate ({:.3g} parameter elements per "
          "rank, {} rank{} here, {} x {} x {} logits a micro-batch), more than the memory budget "
          "of {}; make it smaller or raise --memory-budget",
          s.name, gib(need), elements, one_rank ? 1 : s.world_size,
          s.world_size == 1 || one_rank ? "" : "s", s.micro_batch_size,
          s.sequence_length, s.vocab_size, budget.says));
    }
    largest = std::max(largest, need);
  }
  // A model from a file is loaded, built and checked now, once per process and before any
  // row runs: a bad file is an input error, and a Python model's random draws are made
  // here, one build at a time, never beside a running step (python/src/python_model.cpp).
  // On one intra-op thread, as every judged step runs: a forward on more would start ATen's
  // OpenMP pool here, whose threads a supervisor must not have to fork warm rank processes.
  for (const scenarios::Scenario& s : scenario_list) {
    if (scenarios::model_from_file(s.model)) {
      harness::DeterminismGuard one_thread;
      harness::check_model_is_a_function(s, *harness::make_model(s, harness::ModelConfig{s.model}));
    }
  }
  // Scenarios judged at once share the budget; fewer at once change no result (design §8).
  if (workers != nullptr && largest > 0) {
    const double fit = std::floor(budget.bytes / largest);
    *workers = std::max(1, static_cast<int>(std::min(fit, static_cast<double>(*workers))));
  }
}

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

// The recipe whose framework's model the catalogue's scenarios take (with_recipe_model):
// --recipe's; without one, that of the scenario files' recipe variants, so that a file of
// Trainer variants trains transformers' Llama as --recipe transformers:trainer does (it took
// torchtune's decoder, and every row was an error). Variants whose frameworks train different
// models cannot share a catalogue scenario: *conflict says so, for the run to refuse if it
// selects one.
PythonStepOptions recipe_model_step(const RunOptions& options, std::string* conflict) {
  PythonStepOptions step = options.python_step;
  if (!step.recipe.empty() || !step.recipe_model.empty()) return step;
  std::string first_where, first_model;
  for (const std::string& file : options.scenario_files) {
    for (const scenarios::VariantDeclaration& d : scenarios::load_scenario_file_contents(file).variants) {
      if (d.recipe.empty()) continue;
      const std::string model = python::default_recipe_model(d.recipe);
      if (step.recipe.empty()) {
        step.recipe = d.recipe;
        first_where = fmt::format("{} ({})", d.where, d.recipe);
        first_model = model;
      } else if (model != first_model && conflict->empty()) {
        *conflict = fmt::format(
            "{} trains {} and {} ({}) trains {}: the catalogue's scenarios take one model, so "
            "select scenarios that name their own, or run the variants apart",
            first_where, first_model.substr(first_model.rfind('/') + 1), d.where, d.recipe,
            model.substr(model.rfind('/') + 1));
      }
    }
  }
  return step;
}

// --plan: the rows the run would judge and the pairs it would leave out, as JSON on standard
// output, nothing run (the pytest plugin's items: python/gradnorm/pytest_plugin.py).
void print_plan(const std::vector<scenarios::Scenario>& scenario_list,
                const std::vector<harness::VariantSpec>& variant_list) {
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json left_out = nlohmann::json::array();
  for (const scenarios::Scenario& s : scenario_list) {
    for (const harness::VariantSpec& v : variant_list) {
      if (const auto why = harness::not_applicable(v, s)) {
        left_out.push_back({{"scenario", s.name}, {"variant", v.name}, {"why", *why}});
      } else {
        rows.push_back({{"scenario", s.name}, {"variant", v.name}});
      }
    }
  }
  fmt::print("{}\n", nlohmann::json{{"rows", rows}, {"left_out", left_out}}.dump());
}

int run_command(const RunOptions& options, int argc, char** argv) {
  const bool recipes = run_has_recipe(options);
  std::string model_conflict;
  const PythonStepOptions model_step = recipe_model_step(options, &model_conflict);
  std::vector<scenarios::Scenario> picked = pick_scenarios(
      recipe_scenario_patterns(options.scenario_patterns, model_step), options.scenario_files);
  if (!model_conflict.empty() &&
      std::any_of(picked.begin(), picked.end(), [](const scenarios::Scenario& s) {
        return s.model == scenarios::ModelKind::causal_lm;
      })) {
    throw scenarios::InvalidInput(model_conflict);
  }
  auto scenario_list = with_recipe_model(std::move(picked), model_step, recipes);
  // Before anything runs: a report path that cannot or must not be written is an input error.
  if (options.verbose && !options.log_path.empty()) {
    throw scenarios::InvalidInput(
        "--verbose prints what the code under test prints, so --log would keep nothing: give one");
  }
  check_report_paths(options.given_reports, run_inputs(options, scenario_list));
  remove_partial_reports_on_signals();
  // From here on, what the code under test prints is held for its row (or printed live).
  harness::set_output_mode(options.verbose ? harness::OutputMode::live : harness::OutputMode::capture);
  harness::RunOptions run_options;
  run_options.timeout = timeout_of(options);
  // Before the steps load: their import and cannot_run run under --timeout too.
  python::set_step_timeout(run_options.timeout);
  // What a warm rank keeps of this process's registry: what was there before this run declared
  // its steps (a C++ program's own, registered in its main).
  harness::mark_registered_variants();
  const std::vector<std::string> declared =
      declare_steps(options.python_step, options.scenario_files);
  const auto variant_list = pick_run_variants(options.variant_patterns, declared);
  if (options.plan) {
    print_plan(options.launcher == "processes" ? with_world_size(scenario_list, options.processes)
                                               : scenario_list,
               variant_list);
    return kExitAsExpected;
  }
  if (!options.fault.empty()) run_options.fault = harness::parse_fault(options.fault);
  if (!options.judgement_path.empty() && (options.launcher != "env" || options.variant_patterns.empty())) {
    throw scenarios::InvalidInput("--judgement is fuzz --nproc's: it needs --launcher env and a -v step");
  }
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
    SupervisorOptions supervisor{.processes = options.processes,
                                 .timeout = run_options.timeout,
                                 .rank_arguments = rank_arguments(argc, argv)};
    if (warm_ranks()) fork_ranks_warm(supervisor);
    return supervise(supervisor);
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
    process_rank() = rendezvous.rank;
    scenario_list = with_world_size(scenario_list, rendezvous.world_size,
                                    options.launcher == "slurm" ? "the job's task count (SLURM_NTASKS)"
                                                                : "the launcher's WORLD_SIZE");
    check_before_running(scenario_list, run_options, options, &evaluate_options.workers);
    if (options.backend == "nccl") check_nccl_usable(rendezvous);
    harness::DeterminismGuard guard;
    transport = harness::make_process_group_transport(rendezvous, run_options, options.backend);
    note_rank_ready(rendezvous.rank);
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
      write_rank_done(rendezvous.rank);
      return kExitAsExpected;
    }
    if (!options.judgement_path.empty()) {
      write_rank_judgement(evaluation, options.variant_patterns.front(), options.judgement_path);
      write_rank_done(0);
      return kExitAsExpected;
    }
    harness::RunSettings settings = guard.settings();
    settings.transport = harness::describe_process_group(rendezvous, options.backend);
    const int code = report(evaluation, options, settings, rendezvous.world_size);
    if (code == kExitAsExpected || code == kExitUnexpected) write_rank_done(0);
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

class RunCommand : public Subcommand {
 public:
  RunCommand(CLI::App& app, int argc, char** argv) : Subcommand(nullptr), argc_(argc), argv_(argv) {
    app_ = app.add_subcommand("run", "run scenarios x variants and print the verdicts");
    app_->footer("The guide: docs/judging.md (verdicts), docs/reports.md (reports), docs/ranks.md (--nproc, launchers), docs/frameworks.md (--recipe).");
    app_->add_option("--scenario,-s", options_.scenario_patterns,
                    "scenario name or shell pattern (repeatable; default: the whole catalogue)");
    app_->add_option("--scenario-file,-f", options_.scenario_files,
                    "TOML file of [[scenario]] tables (repeatable); alone, runs only its scenarios")
        ->check(readable_file());
    app_->add_option("--variant,-v", options_.variant_patterns,
                    "variant name or shell pattern (repeatable; default: every variant)");
    app_->add_option("--json", options_.json_path, "write one JSON record per row to PATH");
    app_->add_option("--markdown", options_.markdown_path, "write a pull-request report to PATH");
    app_->add_option("--html", options_.html_path,
                    "write a self-contained HTML report to PATH: the verdict grid, per-token weights, "
                    "errors against tolerance");
    app_->add_option("--junit", options_.junit_path,
                    "write JUnit XML to PATH: a testcase per row, failures for unexpected rows");
    app_->add_option("--digests", options_.digests_path,
                    "write every rank's observation digest to PATH (one line per rank of a row)");
    app_->add_flag("--quiet,-q", options_.quiet, "print the summary line only");
    app_->add_option("--log", options_.log_path,
                    "write what the code under test printed (framework notices, warnings, its "
                    "prints) to PATH, row by row; the table shows a failing row's only");
    app_->add_flag("--verbose", options_.verbose,
                   "print what the code under test prints as it prints it, instead of holding "
                   "it back (-v is --variant)");
    app_->add_option("--launcher", options_.launcher,
                    "threads (default): ranks as threads; processes: --nproc W processes over "
                    "c10d Gloo started here; env: this process is one rank, from RANK, "
                    "WORLD_SIZE and MASTER_ADDR/MASTER_PORT (torchrun, its agent's store too) "
                    "or GRADNORM_STORE, or Slurm's variables without RANK; slurm: one rank of "
                    "srun, from SLURM_PROCID, SLURM_NTASKS and SLURM_JOB_NODELIST")
        ->check(CLI::IsMember({"threads", "processes", "env", "slurm"}));
    app_->add_option("--backend", options_.backend,
                    "c10d backend of rank processes: gloo (default) or nccl (raw NCCL on "
                    "cuda:LOCAL_RANK; needs a CUDA GPU and driver at run time, and a build that "
                    "found the CUDA toolkit's nccl.h)")
        ->check(CLI::IsMember({"gloo", "nccl"}));
    app_->add_option("--nproc", options_.processes,
                    "ranks as W processes over c10d Gloo (implies --launcher processes); runs the "
                    "selected scenarios with that world size")
        ->check(CLI::Range(1, 1024));
    app_->add_option("--timeout", options_.timeout_seconds,
                    "seconds a rank may wait for its peers in one collective, and a Python step may "
                    "run (its import, its cannot_run, each call of the step) (default 60)")
        ->check(finite_number())
        ->check(CLI::Range(0.01, 86400.0));
    app_->add_option("--inject-fault", options_.fault,
                    "make a rank fail on purpose: RANK:KIND[@STEP], KIND one of throw, exit, hang");
    add_python_step_options(*app_, options_.python_step, /*recipes=*/true);
    app_->add_option("--judgement", options_.judgement_path,
                     "(fuzz --nproc's rank processes) rank 0 writes the case's judgement to PATH")
        ->group("");
    app_->add_option("--jobs,-j", options_.jobs,
                    "scenarios judged at once with ranks as threads (default: two per core); the "
                    "results are the same whatever the number")
        ->check(CLI::Range(1, 1024));
    app_->add_option("--memory-budget", options_.memory_budget,
                    "the most memory a scenario may need by gradnorm's estimate, as a size (8G, "
                    "512M) or a share of this machine's memory (75%); default: half of it. A "
                    "scenario above it is an input error, before any rank starts");
    app_->add_flag("--ignore-findings", options_.ignore_findings,
                  "treat documented findings as failures: every reference and candidate must "
                  "agree with the oracle");

    app_->add_flag("--plan", options_.plan,
                   "print the rows this run would judge and the pairs it would leave out, as JSON, "
                   "and run nothing (the pytest plugin's items)");

    // --nproc W alone means ranks as W Gloo processes: one flag from threads to processes.
    app_->callback([this] {
      // Made absolute before any user code runs: a step that changes the working folder
      // (os.chdir) moves no report.
      for (std::string* path : {&options_.json_path, &options_.markdown_path, &options_.digests_path,
                                &options_.junit_path, &options_.html_path, &options_.log_path}) {
        *path = scenarios::absolute_path(*path);
      }
      options_.given_reports = {
          {"--json", options_.json_path, app_->count("--json") > 0},
          {"--markdown", options_.markdown_path, app_->count("--markdown") > 0},
          {"--digests", options_.digests_path, app_->count("--digests") > 0},
          {"--junit", options_.junit_path, app_->count("--junit") > 0},
          {"--html", options_.html_path, app_->count("--html") > 0},
          {"--log", options_.log_path, app_->count("--log") > 0}};
      options_.processes_given = app_->count("--nproc") > 0;
      if (app_->count("--nproc") > 0 && app_->count("--launcher") == 0) {
        options_.launcher = "processes";
      }
    });
  }

  int run() override { return run_command(options_, argc_, argv_); }

 private:
  RunOptions options_;
  int argc_;
  char** argv_;
};

}  // namespace

std::unique_ptr<Subcommand> add_run_command(CLI::App& app, int argc, char** argv) {
  return std::make_unique<RunCommand>(app, argc, argv);
}

}  // namespace gradnorm::tools
