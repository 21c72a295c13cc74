// The gradnorm CLI as a user runs it: exit codes (0 as expected, 1 unexpected verdicts,
// 2 usage or input error), what it prints, and the JSON report it writes.
#include "support/cli.hpp"
#include "support/files.hpp"
#include "support/scripted_model.hpp"
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradnorm/harness/variant.hpp"

namespace gradnorm {
namespace {

using testing_support::contains;
using testing_support::read_file;
using testing_support::TemporaryDirectory;

using testing_support::CliResult;
using testing_support::command_line;
using testing_support::run_shell;
using testing_support::explain;
using testing_support::run_cli;
using testing_support::shell_quote;

// --version names gradnorm's version, the torch it was built against and the build's
// options; every subcommand's --help names its page of the guide, and the page exists.
TEST(Cli, VersionNamesTheTorchAndTheBuildAndEveryHelpNamesItsGuidePage) {
  const CliResult version = run_cli({"--version"});
  EXPECT_EQ(version.exit_code, 0) << version.output;
  for (const char* line : {"gradnorm 0.1.0\n", "\ntorch 2.", "\nPython steps: CPython 3.", "\nNCCL backend (--backend nccl): ",
                           "\nbuild: "}) {
    EXPECT_TRUE(contains(version.output, line)) << line << " in:\n" << version.output;
  }
  for (const char* command : {"run", "list", "show", "explain", "export", "stream", "fuzz", "bench", "diff",
                              "validate-report"}) {
    const CliResult help = run_cli({command, "--help"});
    EXPECT_EQ(help.exit_code, 0) << command << ": " << help.output;
    const std::size_t at = help.output.find("The guide: docs/");
    ASSERT_NE(at, std::string::npos) << command << ": " << help.output;
    const std::string page = help.output.substr(at + 11, help.output.find(".md", at) + 3 - at - 11);
    EXPECT_TRUE(std::filesystem::exists(std::string(GRADNORM_SOURCE_DIR) + "/" + page)) << command << ": " << page;
  }
}

TEST(Cli, NoSubcommandIsAUsageError) {
  const std::vector<std::string> args;
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << explain(args, r);
}

TEST(Cli, ScenarioFileRunsItsScenariosAndRejectsTypos) {
  TemporaryDirectory folder("gradnorm-cli");
  const std::string good = (folder.path() / "good.toml").string();
  std::ofstream(good) << "[[scenario]]\nname = \"mine/6-2\"\nvalid_tokens = [[6], [2]]\n"
                         "[[scenario.expect]]\nvariant = \"skip\"\nverdict = \"fail\"\n"
                         "reason = \"ragged ranks\"\nchecks = [\"gradients\", \"logged-loss\"]\n";
  const std::vector<std::string> args = {"run", "-f", good, "-v", "baseline", "-v", "skip"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "mine/6-2")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "2 rows")) << explain(args, r);
  const std::string bad = (folder.path() / "bad.toml").string();
  std::ofstream(bad) << "[[scenario]]\nname = \"x\"\nvalid_tokns = [[1]]\n";
  const std::vector<std::string> bad_args = {"run", "-f", bad};
  const CliResult rejected = run_cli(bad_args);
  EXPECT_EQ(rejected.exit_code, 2) << explain(bad_args, rejected);
  EXPECT_TRUE(contains(rejected.output, "valid_tokns is not a scenario field")) << explain(bad_args, rejected);
}

// A scenario file names a TorchScript model beside it; the model is trained and judged.
TEST(Cli, ScenarioFileWithATorchScriptModel) {
  TemporaryDirectory folder("gradnorm-cli");
  testing_support::save_scripted_causal_lm((folder.path() / "lm.pt").string());
  const std::string file = (folder.path() / "scripted.toml").string();
  std::ofstream(file) << "[[scenario]]\nname = \"scripted/5-3\"\nvalid_tokens = [[5], [3]]\n"
                         "model = \"torchscript:lm.pt\"\n";
  const std::vector<std::string> args = {"run", "-f", file, "-v", "baseline", "-v",
                                         "broken/scale-pass-dropped", "-v", "lora-baseline"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "2 rows: 1 pass, 1 fail")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "negative controls caught 1/1")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "1 pairs left out")) << explain(args, r);

  std::ofstream(file) << "[[scenario]]\nname = \"scripted/missing\"\nvalid_tokens = [[5]]\n"
                         "model = \"torchscript:nowhere.pt\"\n";
  const std::vector<std::string> missing_args = {"run", "-f", file};
  const CliResult missing = run_cli(missing_args);
  EXPECT_EQ(missing.exit_code, 2) << explain(missing_args, missing);
  EXPECT_TRUE(contains(missing.output, "nowhere.pt' does not exist")) << explain(missing_args, missing);
}

// A scenario file names a Python file's model beside it (examples/python/models.toml); a
// model that cannot be trained stops the run with exit 2 before any row runs, naming it.
TEST(Cli, ScenarioFileWithAPythonModel) {
  const std::string examples = GRADNORM_SOURCE_DIR "/examples/python/";
  const std::vector<std::string> args = {"run", "-f", examples + "models.toml", "-v", "baseline",
                                         "-v", "skip", "-v", "broken/scale-pass-dropped"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "6 rows: 3 pass, 3 fail")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "negative controls caught 2/2")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "documented findings reproduced 1; unexpected 0")) << explain(args, r);

  TemporaryDirectory folder("gradnorm-cli");
  const std::string file = (folder.path() / "bad.toml").string();
  const std::string out = (folder.path() / "report.json").string();
  std::ofstream(file) << "[[scenario]]\nname = \"py/ok\"\nvalid_tokens = [[5]]\n"
                         "model = \"python:" << examples << "tiny_transformer.py:tiny_transformer\"\n"
                         "[[scenario]]\nname = \"py/typo\"\nvalid_tokens = [[5]]\n"
                         "model = \"python:" << examples << "tiny_transformer.py:tiny_transfomer\"\n";
  const std::vector<std::string> bad_args = {"run", "-f", file, "--json", out};
  const CliResult bad = run_cli(bad_args);
  EXPECT_EQ(bad.exit_code, 2) << explain(bad_args, bad);
  EXPECT_TRUE(contains(bad.output, "scenario 'py/typo': model 'python:")) << explain(bad_args, bad);
  EXPECT_TRUE(contains(bad.output, "defines no function 'tiny_transfomer'")) << explain(bad_args, bad);
  EXPECT_FALSE(contains(bad.output, "py/ok ")) << explain(bad_args, bad);  // no row ran
  EXPECT_FALSE(std::filesystem::exists(out)) << explain(bad_args, bad);
}

TEST(Cli, FuzzRunsEveryPropertyAndReplaysFromItsSeed) {
  const std::vector<std::string> args = {"fuzz", "--cases", "5", "--seed", "3"};
  const CliResult first = run_cli(args);
  EXPECT_EQ(first.exit_code, 0) << explain(args, first);
  EXPECT_TRUE(contains(first.output, "every property held")) << explain(args, first);
  EXPECT_TRUE(contains(first.output, "skip passes iff ranks are balanced")) << explain(args, first);
  EXPECT_TRUE(contains(first.output, "30 cases in ")) << explain(args, first);
  // The same cases and verdicts; only the throughput line is a wall-clock figure.
  auto without_timing = [](std::string text) {
    const auto at = text.find(" cases in ");
    if (at == std::string::npos) return text;
    const auto begin = text.rfind('\n', at) + 1;
    return text.erase(begin, text.find('\n', at) + 1 - begin);
  };
  EXPECT_EQ(without_timing(run_cli(args).output), without_timing(first.output));
}

// global-prenorm's documented all-masked finding, found again from scratch: rapidcheck
// shrinks to a single empty micro-batch, where the candidate steps on finite zeros while its
// reference's gradients turn NaN.
TEST(Cli, FuzzingACandidateShrinksToItsSmallestFinding) {
  const std::vector<std::string> args = {"fuzz", "-v", "global-prenorm", "--cases", "15", "--seed", "4"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "W=1 A=1 counts=[[0]] B=1 T=2")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "verdict error-mismatch")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "global-prenorm agrees where its reference does, on ragged ranks\nOK"))
      << explain(args, r);
  // Each property says how many cases held the step to each check (no clipping is drawn on
  // ragged ranks), and where it stopped counting.
  EXPECT_TRUE(contains(r.output, "checks judged: on 15 cases: steps 15, gradients 15, parameter-update 15, "
                                 "logged-loss 15, grad-norm 0, ranks-agree 15, error-behaviour 15"))
      << explain(args, r);
  EXPECT_TRUE(contains(r.output, "checks judged: on the 2 cases up to the counter-example: ")) << explain(args, r);
  // With empty ranks drawn too, the same finding on ranks: every rank empty, N = 0.
  EXPECT_TRUE(contains(r.output, "W=2 A=1 counts=[[0], [0]] B=1 T=2")) << explain(args, r);
}

// Negative control: a step that weighs tokens 1/n_r fails on the first ragged case, and the
// counter-example explains itself with its per-token weights.
TEST(Cli, FuzzingAWrongStepFailsWithAnExplainedCounterExample) {
  const std::vector<std::string> args = {"fuzz", "-v", "world-size-only", "--cases", "15", "--seed", "4"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "Falsifiable")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "per-token weights (token-probe model), contract 1/N")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "a property failed")) << explain(args, r);
}

TEST(Cli, FuzzRejectsZeroCases) {
  const std::vector<std::string> args = {"fuzz", "--cases", "0"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << explain(args, r);
}

TEST(Cli, ExplainPrintsPerRankWeights) {
  const std::vector<std::string> args = {"explain", "dist/5-3/float64", "-v", "skip"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "0.166667")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "weights rel L2 error 0.2582")) << explain(args, r);
}

TEST(Cli, UnknownVariantIsAUsageErrorNamingIt) {
  const std::vector<std::string> args = {"run", "--variant", "nope"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "unknown variant 'nope'")) << explain(args, r);
}

TEST(Cli, UnknownScenarioIsAUsageError) {
  const std::vector<std::string> args = {"run", "--scenario", "nope/x"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "unknown scenario")) << explain(args, r);
}

TEST(Cli, RunPrintsThePassingRows) {
  const std::vector<std::string> args = {"run", "--scenario", "single/n3/float32",
                                         "--variant", "baseline", "--variant", "skip"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "single/n3/float32")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "pass")) << explain(args, r);
  EXPECT_FALSE(contains(r.output, "UNEXPECTED")) << explain(args, r);
}

// The skip path's all-masked behaviour differs from the baseline's: a documented finding,
// so it is as expected unless findings are ignored (the CLI's exit-1 path).
TEST(Cli, IgnoringDocumentedFindingsExitsOne) {
  const std::vector<std::string> args = {"run", "--scenario", "single/all-masked-mean_ce/*",
                                         "--variant", "skip", "--ignore-findings"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "UNEXPECTED")) << explain(args, r);
}

TEST(Cli, DocumentedFindingsAreAsExpected) {
  const std::vector<std::string> args = {"run", "--scenario", "single/all-masked-mean_ce/*",
                                         "--variant", "skip"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "known finding")) << explain(args, r);
}

TEST(Cli, NegativeControlsAreCaught) {
  const std::vector<std::string> args = {"run", "--scenario", "single/n5/float32", "--variant",
                                         "broken/*"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "caught")) << explain(args, r);
}

// One flag from threads to Gloo processes: --nproc alone launches the ranks.
TEST(Cli, NprocAloneRunsRanksAsGlooProcesses) {
  TemporaryDirectory folder("gradnorm-cli");
  const std::string path = (folder.path() / "report.json").string();
  const std::vector<std::string> args = {"run", "--nproc", "2", "--scenario", "dist/4-4/float32",
                                         "--variant", "baseline", "--json", path};
  const CliResult r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << explain(args, r);
  const nlohmann::json report = nlohmann::json::parse(read_file(path));
  EXPECT_EQ(report["settings"]["transport"], "gloo processes x 2");
  ASSERT_EQ(report["records"].size(), 1u);
  EXPECT_EQ(report["records"][0]["verdict"], "pass");
  // Negative control: without --nproc the same run is threads.
  const std::vector<std::string> threads = {"run", "--scenario", "dist/4-4/float32", "--variant",
                                            "baseline", "--json", path};
  ASSERT_EQ(run_cli(threads).exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(read_file(path))["settings"]["transport"], "threads");
}

TEST(Cli, JsonReportHasOneRecordPerVariantAndIsReproducible) {
  TemporaryDirectory folder("gradnorm-cli");
  const std::string first = (folder.path() / "first.json").string();
  const std::string second = (folder.path() / "second.json").string();
  const std::vector<std::string> args = {"run", "--scenario", "single/n3/float32", "--json", first};
  const CliResult r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << explain(args, r);
  const std::string text = read_file(first);
  nlohmann::json report;
  ASSERT_NO_THROW(report = nlohmann::json::parse(text)) << text.substr(0, 2000);
  ASSERT_TRUE(report.contains("records")) << text.substr(0, 2000);
  const nlohmann::json& records = report.at("records");
  ASSERT_EQ(records.size(), harness::variants().size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    const nlohmann::json& record = records.at(i);
    EXPECT_EQ(record.value("variant", ""), harness::variants().at(i).name);
    EXPECT_EQ(record.value("scenario", ""), "single/n3/float32");
    for (const char* key : {"scenario", "variant", "verdict", "rel_l2_error", "max_abs_error",
                            "max_ulp", "bitwise_equal_baseline", "grad_norm", "logged_loss",
                            "error"}) {
      EXPECT_TRUE(record.contains(key)) << "record " << i << " lacks '" << key << "'";
    }
  }
  EXPECT_FALSE(std::filesystem::exists(first + ".partial"));

  const std::vector<std::string> again = {"run", "--scenario", "single/n3/float32", "--json", second};
  const CliResult r2 = run_cli(again);
  ASSERT_EQ(r2.exit_code, 0) << explain(again, r2);
  EXPECT_TRUE(read_file(second) == text) << "two runs wrote different JSON: " << first << " vs "
                                         << second;
  EXPECT_EQ(r2.output, r.output);
}

TEST(Cli, JsonIntoAMissingFolderIsAnInputErrorNamingThePath) {
  const std::string path = "/nonexistent-dir/x.json";
  const std::vector<std::string> args = {"run", "--scenario", "single/n3/float32", "--variant",
                                         "baseline", "--json", path};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << explain(args, r);
  EXPECT_TRUE(contains(r.output, path)) << explain(args, r);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Cli, ListVariants) {
  const std::vector<std::string> args = {"list", "--variants"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "baseline")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "broken/scale-pass-dropped")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "torchtune@bd2a0fc7 recipes/full_finetune_distributed.py:1027-1069"))
      << explain(args, r);
  EXPECT_FALSE(contains(r.output, "single/n3/float32")) << explain(args, r);
}

TEST(Cli, ShowDescribesTheScenarioAndItsOracle) {
  const std::vector<std::string> args = {"show", "single/n5/float32"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "N = 5")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "oracle step 0")) << explain(args, r);
}

TEST(Cli, ShowUnknownScenarioIsAUsageError) {
  const std::vector<std::string> args = {"show", "nope"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "unknown scenario 'nope'")) << explain(args, r);
}

// The first line where two digest files part, for a failure message that says where.
std::string first_difference(const std::string& expected, const std::string& actual) {
  std::istringstream want(expected), got(actual);
  std::string a, b;
  for (int line = 1;; ++line) {
    const bool more_a = static_cast<bool>(std::getline(want, a));
    const bool more_b = static_cast<bool>(std::getline(got, b));
    if (!more_a && !more_b) return "no difference";
    if (a != b || more_a != more_b) {
      return "line " + std::to_string(line) + ": expected '" + (more_a ? a : "<end>") +
             "', got '" + (more_b ? b : "<end>") + "'";
    }
  }
}

// Every rank of every row of the default matrix sees the same numbers as when the golden
// file was written. The last bits are the CPU's: ATen and MKL pick their kernels by what the
// CPU offers, and an AVX2 machine (AMD EPYC) gives 3918 of 5608 digests other than the
// machine the first file was written on, at the same commit. So tests/tools/golden holds one
// file per kind of machine measured (default_matrix_digests*.tsv, the suffix naming it), and
// the run must equal one of them exactly. A change meant to alter numbers regenerates each
// on its machine with `gradnorm run -q --digests FILE` and says why.
// Runs the default matrix with --digests into DIR; the file's path.
std::string default_matrix_digests(const TemporaryDirectory& dir) {
  const std::string path = (dir.path() / "digests.tsv").string();
  const std::vector<std::string> args = {"run", "-q", "--digests", path};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  return path;
}

TEST(Cli, DefaultMatrixDigestsAreUnchanged) {
  TemporaryDirectory dir;
  const std::string path = default_matrix_digests(dir);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string actual = read_file(path);
  std::vector<std::filesystem::path> goldens;
  for (const auto& entry : std::filesystem::directory_iterator(GRADNORM_DIGEST_GOLDEN_DIR)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("default_matrix_digests", 0) == 0 && entry.path().extension() == ".tsv") {
      goldens.push_back(entry.path());
    }
  }
  std::sort(goldens.begin(), goldens.end());
  ASSERT_FALSE(goldens.empty()) << "no default_matrix_digests*.tsv in " << GRADNORM_DIGEST_GOLDEN_DIR;
  std::string differences;
  for (const std::filesystem::path& golden : goldens) {
    const std::string expected = read_file(golden.string());
    ASSERT_GT(std::count(expected.begin(), expected.end(), '\n'), 3000)
        << golden << ": golden file too short";
    if (expected == actual) return;
    differences += golden.filename().string() + ": " + first_difference(expected, actual) + "\n";
  }
  ADD_FAILURE() << "the default matrix's digests equal none of the machines measured:\n"
                << differences;
}

// Negative control: the digest file tells apart two variants that differ in the last bit
// (baseline and skip round 1/N differently at N = 3).
TEST(Cli, DigestsTellApartVariantsThatDifferInOneUlp) {
  TemporaryDirectory dir;
  const std::string path = (dir.path() / "digests.tsv").string();
  const std::vector<std::string> args = {"run", "-q", "-s", "single/n3/float32", "-v", "baseline",
                                         "-v", "skip", "--digests", path};
  const CliResult r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << explain(args, r);
  std::istringstream lines(read_file(path));
  std::string header, baseline, skip;
  std::getline(lines, header);
  std::getline(lines, baseline);
  std::getline(lines, skip);
  ASSERT_TRUE(contains(baseline, "\tbaseline\t0\t")) << baseline;
  ASSERT_TRUE(contains(skip, "\tskip\t0\t")) << skip;
  EXPECT_NE(baseline.substr(baseline.rfind('\t')), skip.substr(skip.rfind('\t')));
}


// scenario \t variant \t rank -> digest, from a --digests file.
std::map<std::string, std::string> digests_by_row(const std::string& path) {
  std::map<std::string, std::string> out;
  std::istringstream lines(read_file(path));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto last = line.rfind('\t');
    out[line.substr(0, last)] = line.substr(last + 1);
  }
  return out;
}

// The rows of first-valid/X whose digest differs from X's, same variant and rank.
std::vector<std::string> first_valid_rows_unlike_their_twin(const std::map<std::string, std::string>& d,
                                                            int& compared) {
  const std::string prefix = "first-valid/";
  std::vector<std::string> unlike;
  compared = 0;
  for (const auto& [row, digest] : d) {
    if (row.rfind(prefix, 0) != 0) continue;
    ++compared;
    const auto twin = d.find(row.substr(prefix.size()));
    if (twin == d.end() || twin->second != digest) unlike.push_back(row);
  }
  return unlike;
}

// first-valid/X is X with its first labels valid and nothing else changed (catalogue.cpp):
// a step given only the shifted labels (every built-in) must see X's numbers bit for bit.
// This is also what lets a digest golden of another machine kind gain those rows from X's.
TEST(Cli, FirstValidScenariosGiveShiftedLabelStepsTheirTwinsNumbers) {
  TemporaryDirectory dir;
  const std::string path = default_matrix_digests(dir);
  ASSERT_FALSE(::testing::Test::HasFailure());
  int compared = 0;
  const std::vector<std::string> unlike = first_valid_rows_unlike_their_twin(digests_by_row(path), compared);
  EXPECT_GT(compared, 400) << "too few first-valid rows in the default matrix";
  EXPECT_TRUE(unlike.empty()) << unlike.size() << " rows differ from their twin, e.g. " << unlike.front();
}

// Python steps from the command line (docs/design.md §10).
const std::string kPythonExamples = GRADNORM_SOURCE_DIR "/examples/python/";

TEST(PythonCli, VariantTablesInAScenarioFileRunTheirSteps) {
  TemporaryDirectory folder;
  const std::string file = (folder.path() / "mine.toml").string();
  const std::string json_path = (folder.path() / "out.json").string();
  std::ofstream(file) << "[[scenario]]\nname = \"mine/6-2\"\nvalid_tokens = [[6], [2]]\n"
                      << "[[variant]]\nname = \"mine/baseline\"\npython = \"" << kPythonExamples
                      << "full_finetune.py\"\nfindings_of = \"baseline\"\n"
                      << "[[variant]]\nname = \"mine/skip\"\npython = \"" << kPythonExamples
                      << "skip.py:step\"\n";
  const std::vector<std::string> args = {"run", "-f", file, "--json", json_path};
  const CliResult r = run_cli(args);
  // The Python skip fails on ragged ranks: an unexpected verdict, exit 1.
  EXPECT_EQ(r.exit_code, 1) << explain(args, r);
  const nlohmann::json report = nlohmann::json::parse(read_file(json_path));
  std::map<std::string, std::string> verdicts;
  for (const auto& record : report.at("records")) {
    EXPECT_EQ(record.value("scenario", ""), "mine/6-2");
    verdicts[record.value("variant", "")] = record.value("verdict", "");
  }
  EXPECT_EQ(verdicts, (std::map<std::string, std::string>{{"mine/baseline", "pass"},
                                                          {"mine/skip", "fail"}}));
}

TEST(PythonCli, AVariantTableWithoutItsFileIsAnInputErrorNamingIt) {
  TemporaryDirectory folder;
  const std::string file = (folder.path() / "mine.toml").string();
  std::ofstream(file) << "[[variant]]\nname = \"gone\"\npython = \"steps/gone.py\"\n";
  const std::vector<std::string> args = {"run", "-f", file, "-s", "single/n5/float32"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "variant #1")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "steps/gone.py' does not exist")) << explain(args, r);
}

TEST(PythonCli, FuzzingAPythonStepFindsTheSkipsCounterExample) {
  const std::vector<std::string> good = {"fuzz", "--python-step", kPythonExamples + "full_finetune.py",
                                         "--cases", "60", "--seed", "3"};
  const CliResult held = run_cli(good);
  EXPECT_EQ(held.exit_code, 0) << explain(good, held);
  EXPECT_TRUE(contains(held.output, "py/full_finetune agrees where its reference does"))
      << explain(good, held);
  const std::vector<std::string> bad = {"fuzz", "--python-step", kPythonExamples + "skip.py",
                                        "--cases", "60", "--seed", "3"};
  const CliResult failed = run_cli(bad);
  EXPECT_EQ(failed.exit_code, 1) << explain(bad, failed);
  EXPECT_TRUE(contains(failed.output, "per-token weights")) << explain(bad, failed);
}

// Negative control of FirstValidScenariosGiveShiftedLabelStepsTheirTwinsNumbers: a step that
// counts the first labels (as a recipe counting before its shift does) tells them apart.
TEST(PythonCli, AStepCountingTheFirstLabelsSeesFirstValidScenariosDiffer) {
  TemporaryDirectory dir;
  const std::string step = (dir.path() / "counts_first.py").string();
  std::ofstream(step) << "import torch\n"
                         "def step(ctx):\n"
                         "    n = 0\n"
                         "    for b in ctx.micro_batches:\n"
                         "        n += int((b['labels'] != -100).sum()) + int((b['first_labels'] != -100).sum())\n"
                         "        ctx.loss_fn(ctx.model(b['tokens']), b['labels']).mul((b['labels'] != -100).sum()).backward()\n"
                         "    for p in ctx.model.parameters():\n"
                         "        if p.grad is not None:\n"
                         "            p.grad /= n\n"
                         "    ctx.optimizer.step()\n"
                         "    return {}\n";
  const std::string path = (dir.path() / "digests.tsv").string();
  const std::vector<std::string> args = {"run", "-q", "--python-step", step, "-s", "single/n5/float32",
                                         "-s", "first-valid/single/n5/float32", "--digests", path};
  const CliResult r = run_cli(args);
  ASSERT_EQ(r.exit_code, 1) << explain(args, r);  // the first-valid row fails its check
  int compared = 0;
  const std::vector<std::string> unlike = first_valid_rows_unlike_their_twin(digests_by_row(path), compared);
  EXPECT_EQ(compared, 1) << read_file(path);
  EXPECT_EQ(unlike.size(), 1u) << read_file(path);
}

TEST(PythonCli, ExportWritesOneFilePerScenarioAndNothingOnBadInput) {
  TemporaryDirectory folder;
  const std::string out = (folder.path() / "vectors").string();
  const std::vector<std::string> good = {"export", "dist/5-3/*", "--out", out};
  const CliResult written = run_cli(good);
  EXPECT_EQ(written.exit_code, 0) << explain(good, written);
  for (const char* dtype : {"float64", "float32", "bfloat16"}) {
    EXPECT_TRUE(std::filesystem::is_regular_file(out + "/dist/5-3/" + dtype + ".pt")) << dtype;
  }
  const std::string other = (folder.path() / "other").string();
  const std::vector<std::string> bad = {"export", "single/n5/float32", "no/such", "--out", other};
  const CliResult refused = run_cli(bad);
  EXPECT_EQ(refused.exit_code, 2) << explain(bad, refused);
  EXPECT_FALSE(std::filesystem::exists(other)) << explain(bad, refused);
}


// A smoke run of the Python benchmark: it prints a row per scenario (figures unchecked).
TEST(PythonCli, BenchPrintsThePythonStepsOverheadPerScenario) {
  const std::vector<std::string> args = {"bench", "--python-step", kPythonExamples + "full_finetune.py",
                                         "--findings-of", "baseline", "--repeat", "1"};
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "py/full_finetune (Python) against baseline (C++)")) << explain(args, r);
  for (const char* scenario : {"single/n5/float32", "dist/32-ranks-ragged/float32"}) {
    EXPECT_TRUE(contains(r.output, scenario)) << explain(args, r);
  }
}


// Scenarios judged on several workers give the same report, byte for byte, as on one.
TEST(Cli, ReportsAreByteIdenticalWhateverTheNumberOfWorkers) {
  TemporaryDirectory folder;
  auto report = [&](const std::string& jobs, const std::string& pattern) {
    const std::string path = (folder.path() / ("j" + jobs + ".json")).string();
    const std::vector<std::string> args = {"run", "-q", "-j", jobs, "-s", pattern, "-s",
                                           "single/n5*", "--json", path};
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << explain(args, r);
    return read_file(path);
  };
  const std::string one = report("1", "dist/*");
  EXPECT_FALSE(one.empty());
  EXPECT_EQ(one, report("2", "dist/*"));
  EXPECT_EQ(one, report("5", "dist/*"));
  // The comparison can fail: another selection is another report.
  EXPECT_NE(one, report("2", "dist/5-3*"));
}


TEST(PythonCli, ExportRefusesScenarioNamesThatLeaveTheOutputFolder) {
  TemporaryDirectory folder;
  const std::string file = (folder.path() / "escape.toml").string();
  std::ofstream(file) << "[[scenario]]\nname = \"../../escaped\"\nvalid_tokens = [[5]]\n"
                      << "[[scenario]]\nname = \"/tmp/absolute\"\nvalid_tokens = [[5]]\n";
  const std::string out = (folder.path() / "deep" / "out").string();
  for (const char* name : {"../../escaped", "/tmp/absolute"}) {
    const std::vector<std::string> args = {"export", "-f", file, "--out", out, "--", name};
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << explain(args, r);
    EXPECT_TRUE(contains(r.output, "cannot be a file name under --out")) << explain(args, r);
  }
  EXPECT_FALSE(std::filesystem::exists(folder.path() / "escaped.pt"));
  EXPECT_FALSE(std::filesystem::exists(out));
}


// Smoke runs of the speed commands: they print their tables (figures unchecked).
TEST(Cli, ScalePassBenchAndStreamRun) {
  const std::vector<std::string> bench = {"bench", "--scale-pass", "1000000", "--repeat", "1"};
  const CliResult b = run_cli(bench);
  EXPECT_EQ(b.exit_code, 0) << explain(bench, b);
  EXPECT_TRUE(contains(b.output, "1000000 bfloat16")) << explain(bench, b);
  EXPECT_TRUE(contains(b.output, "scale / step")) << explain(bench, b);
  TemporaryDirectory folder;
  const std::string file = (folder.path() / "stream.toml").string();
  const std::vector<std::string> stream = {"stream", "--cases", "20", "--seed", "4", "--out", file};
  EXPECT_EQ(run_cli(stream).exit_code, 0);
  const std::vector<std::string> again = {"stream", "--cases", "20", "--seed", "4"};
  EXPECT_EQ(run_cli(again).output, read_file(file));  // the same seed, the same stream
  const std::vector<std::string> other = {"stream", "--cases", "20", "--seed", "5"};
  EXPECT_NE(run_cli(other).output, read_file(file));  // and the comparison can fail
  // One measurement of the growth table, on a generated scenario, as threads and processes.
  for (const char* launcher : {"threads", "processes"}) {
    const std::string out = (folder.path() / (std::string(launcher) + ".txt")).string();
    const std::vector<std::string> one = {"bench-one", launcher, "2", "1", out, "2", "64"};
    const CliResult measured = run_cli(one);
    EXPECT_EQ(measured.exit_code, 0) << explain(one, measured);
    EXPECT_FALSE(read_file(out).empty()) << launcher;
  }
  const std::vector<std::string> judged = {"run", "-f", file, "-v", "baseline", "-q"};
  const CliResult r = run_cli(judged);
  EXPECT_TRUE(contains(r.output, "20 rows")) << explain(judged, r);
}

}  // namespace
}  // namespace gradnorm

namespace gradnorm {
namespace {

// The largest matrix (every catalogue scenario x every variant) still fits one pull-request
// comment, and the full detail stays in the JSON, which the schema accepts.
TEST(Reports, TheDefaultMatrixMarkdownFitsOneCommentAndItsJsonIsValid) {
  TemporaryDirectory folder("gradnorm-reports");
  const std::string md = (folder.path() / "r.md").string();
  const std::string json = (folder.path() / "r.json").string();
  const std::string junit = (folder.path() / "r.xml").string();
  const std::vector<std::string> args = {"run", "-q", "--markdown", md, "--json", json, "--junit", junit};
  const CliResult r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << explain(args, r);
  const std::string text = read_file(md);
  EXPECT_LE(text.size(), 65536u) << "the Markdown report is " << text.size() << " bytes";
  EXPECT_TRUE(contains(text, "Documented findings reproduced: 654")) << text.substr(0, 2000);
  const CliResult valid = run_cli({"validate-report", json});
  EXPECT_EQ(valid.exit_code, 0) << valid.output;
  // A report with a field of the wrong kind is refused, naming where (negative control).
  nlohmann::json broken = nlohmann::json::parse(read_file(json));
  broken["records"][3]["verdict"] = "maybe";
  const std::string bad = (folder.path() / "bad.json").string();
  std::ofstream(bad) << broken.dump();
  const CliResult invalid = run_cli({"validate-report", bad});
  EXPECT_EQ(invalid.exit_code, 1) << invalid.output;
  EXPECT_TRUE(contains(invalid.output, "[3]")) << invalid.output;
  EXPECT_EQ(run_cli({"validate-report", (folder.path() / "missing.json").string()}).exit_code, 2);
}

// Report paths are checked before the run: none lands on an input, on another report of the
// same run, or on something that is not a regular file; an empty path is refused.
TEST(Reports, UnsafeReportPathsAreInputErrorsBeforeAnythingRuns) {
  TemporaryDirectory folder("gradnorm-reports");
  const std::string scenarios = (folder.path() / "s.toml").string();
  std::ofstream(scenarios) << "[[scenario]]\nname = \"file/one\"\nvalid_tokens = [[3]]\n";
  const std::string fifo = (folder.path() / "fifo").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string same = (folder.path() / "same").string();
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--json", scenarios}, "is an input of this run"},
      {{"--markdown", same, "--json", same}, "name the same file"},
      {{"--json", fifo}, "is a FIFO"},
      {{"--junit", "/dev/null"}, "is a device"},
      {{"--json", folder.path().string()}, "is a folder"},
      {{"--json", ""}, "--json: the path is empty"},
  };
  const std::string before = read_file(scenarios);
  for (const Case& c : cases) {
    std::vector<std::string> args = {"run", "-f", scenarios, "-v", "baseline"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << explain(args, r);
    EXPECT_TRUE(contains(r.output, c.says)) << explain(args, r);
    EXPECT_FALSE(contains(r.output, "rows:")) << "the run went ahead: " << explain(args, r);
  }
  EXPECT_EQ(read_file(scenarios), before);
  EXPECT_FALSE(std::filesystem::exists(same));
  // The control: the same run with a safe path writes its report.
  const std::string ok = (folder.path() / "ok.json").string();
  const std::vector<std::string> good = {"run", "-f", scenarios, "-v", "baseline", "--json", ok};
  const CliResult r = run_cli(good);
  EXPECT_EQ(r.exit_code, 0) << explain(good, r);
  EXPECT_TRUE(std::filesystem::is_regular_file(ok));
  for (const auto& entry : std::filesystem::directory_iterator(folder.path())) {
    EXPECT_FALSE(contains(entry.path().filename().string(), "partial")) << entry.path();
  }
}

// A run killed while it works leaves no report and no temporary behind.
TEST(Reports, AKilledRunLeavesNoPartialReport) {
  TemporaryDirectory folder("gradnorm-reports");
  const std::string json = (folder.path() / "r.json").string();
  const std::string line = command_line({"run", "-q", "--json", json}) + " > /dev/null 2>&1 & pid=$!; "
                           "sleep 0.8; kill -TERM $pid; wait $pid; echo $?";
  FILE* pipe = popen(("sh -c " + shell_quote(line)).c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buffer[64] = {};
  const std::size_t n = std::fread(buffer, 1, sizeof buffer - 1, pipe);
  pclose(pipe);
  EXPECT_EQ(std::string(buffer, n), "143\n") << "not ended by SIGTERM";
  EXPECT_TRUE(std::filesystem::is_empty(folder.path())) << "something was left in " << folder.path();
}

// End to end: a base run and a head whose step is broken give a comment that names the
// regression and a command that reproduces it (exit 1 when run), JUnit with the failure.
TEST(Reports, DiffOfABrokenHeadNamesTheRegressionAndItsReproduction) {
  TemporaryDirectory folder("gradnorm-diff");
  const std::string base = (folder.path() / "base.json").string();
  const std::string head = (folder.path() / "head.json").string();
  const std::string steps = std::string(GRADNORM_SOURCE_DIR) + "/";
  const std::vector<std::string> base_run = {"run", "-q", "-s", "dist/5-3/float32", "-s", "single/n3/float32",
                                             "--python-step", steps + "examples/python/full_finetune.py",
                                             "--name", "py/step", "-v", "baseline", "--json", base};
  const CliResult b = run_cli(base_run);
  ASSERT_EQ(b.exit_code, 0) << explain(base_run, b);
  std::vector<std::string> head_run = base_run;
  head_run[7] = steps + "tests/python/steps/local_mean.py";
  head_run.back() = head;
  const CliResult h = run_cli(head_run);
  ASSERT_EQ(h.exit_code, 1) << explain(head_run, h);
  const std::string md = (folder.path() / "comment.md").string();
  const std::string junit = (folder.path() / "diff.xml").string();
  const std::vector<std::string> diff = {"diff", base, head, "--markdown", md, "--junit", junit};
  const CliResult d = run_cli(diff);
  EXPECT_EQ(d.exit_code, 1) << explain(diff, d);
  const std::string comment = read_file(md);
  EXPECT_TRUE(contains(comment, "## **gradnorm: 1 regression**")) << comment;
  EXPECT_TRUE(contains(comment, "`dist/5-3/float32` | `py/step`")) << comment;
  const std::string reproduce = "gradnorm run --python-step " + steps + "tests/python/steps/local_mean.py --name py/step -s dist/5-3/float32 -v py/step";
  ASSERT_TRUE(contains(comment, "reproduce: `" + reproduce + "`")) << comment;
  const CliResult again = run_cli({"run", "--python-step", steps + "tests/python/steps/local_mean.py", "--name",
                                   "py/step", "-s", "dist/5-3/float32", "-v", "py/step"});
  EXPECT_EQ(again.exit_code, 1) << "the reproduce command does not reproduce:\n" << again.output;
  EXPECT_TRUE(contains(read_file(junit), "failures=\"1\"")) << read_file(junit);
  // The base against itself: no regression, exit 0 (the control).
  const CliResult same = run_cli({"diff", base, base});
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_TRUE(contains(same.output, "no regression")) << same.output;
  // Not a report: exit 2, naming it.
  const CliResult bad = run_cli({"diff", base, steps + "README.md"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "is not JSON")) << bad.output;
}

}  // namespace
}  // namespace gradnorm

namespace gradnorm {
namespace {

// The floor benchmark is the stream's check written straight against LibTorch: on the same
// cases it must reach gradnorm's verdicts (a second, independent reading), and it refuses a
// file that is not of the stream's kind.
TEST(Bench, TheFloorReachesGradnormsVerdictsOnTheStream) {
  TemporaryDirectory folder("gradnorm-floor");
  const std::string stream = (folder.path() / "stream.toml").string();
  const std::string json = (folder.path() / "r.json").string();
  ASSERT_EQ(run_cli({"stream", "--cases", "40", "--seed", "3", "--out", stream}).exit_code, 0);
  const CliResult run = run_cli({"run", "-q", "-f", stream, "-v", "baseline", "-v", "skip", "--json", json});
  ASSERT_LE(run.exit_code, 1) << run.output;
  int baseline_pass = 0, skip_pass = 0;
  const nlohmann::json report = nlohmann::json::parse(read_file(json));
  for (const nlohmann::json& r : report.at("records")) {
    const bool pass = r.at("verdict").get<std::string>() == "pass";
    (r.at("variant").get<std::string>() == "baseline" ? baseline_pass : skip_pass) += pass ? 1 : 0;
  }
  const CliResult floor = run_cli({"bench", "--floor", stream});
  ASSERT_EQ(floor.exit_code, 0) << floor.output;
  const std::string tally = "baseline " + std::to_string(baseline_pass) + " pass / " +
                            std::to_string(40 - baseline_pass) + " fail, skip " + std::to_string(skip_pass) +
                            " / " + std::to_string(40 - skip_pass);
  EXPECT_TRUE(contains(floor.output, tally)) << "want '" << tally << "' in\n" << floor.output;
  EXPECT_LT(skip_pass, 40) << "the stream should hold ragged cases the skip fails";
  const std::string other = (folder.path() / "other.toml").string();
  std::ofstream(other) << "[[scenario]]\nname = \"x\"\nvalid_tokens = [[3]]\nmodel = \"linear_head\"\n";
  const CliResult refused = run_cli({"bench", "--floor", other});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(contains(refused.output, "not of the reference stream's kind")) << refused.output;
}

}  // namespace
}  // namespace gradnorm

namespace gradnorm {
namespace {

// CLI11's Range lets NaN through; --timeout nan would then run with a negative timeout.
// The control: a finite timeout runs.
TEST(Cli, NonFiniteNumbersOnTheCommandLineAreUsageErrors) {
  for (const char* value : {"nan", "inf", "-inf", "NaN"}) {
    const std::vector<std::string> args = {"run", "-q", "-s", "single/n3/float32", "-v", "baseline", "--timeout", value};
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << explain(args, r);
    EXPECT_TRUE(contains(r.output, "must be a finite number")) << explain(args, r);
  }
  const std::vector<std::string> ok = {"run", "-q", "-s", "single/n3/float32", "-v", "baseline", "--timeout", "5"};
  EXPECT_EQ(run_cli(ok).exit_code, 0);
  const CliResult diff = run_cli({"diff", "a.json", "b.json", "--drift-factor", "nan"});
  EXPECT_EQ(diff.exit_code, 2) << diff.output;
}

}  // namespace
}  // namespace gradnorm

namespace gradnorm {
namespace {

// Silent acceptances that are now input errors (exit 2) before any rank starts: --nproc with
// --launcher threads, and a fault injected into a rank that the processes do not have. The
// control: a fault in an existing rank process fails the run as a rank failure (exit 3).
TEST(Cli, ContradictoryLaunchOptionsAreInputErrors) {
  const std::vector<std::string> both = {"run", "-q", "-s", "dist/5-3/float32", "--nproc", "2", "--launcher", "threads"};
  const CliResult r = run_cli(both);
  EXPECT_EQ(r.exit_code, 2) << explain(both, r);
  EXPECT_TRUE(contains(r.output, "cannot go with --launcher threads")) << explain(both, r);
  const std::vector<std::string> far = {"run", "-q", "-s", "dist/5-3/float32", "-v", "baseline", "--nproc", "2",
                                        "--inject-fault", "5:throw"};
  const CliResult f = run_cli(far);
  EXPECT_EQ(f.exit_code, 2) << explain(far, f);
  EXPECT_TRUE(contains(f.output, "rank 5 does not exist with --nproc 2")) << explain(far, f);
  const std::vector<std::string> near = {"run", "-q", "-s", "dist/5-3/float32", "-v", "baseline", "--nproc", "2",
                                         "--inject-fault", "1:throw", "--timeout", "20"};
  const CliResult n = run_cli(near);
  EXPECT_EQ(n.exit_code, 3) << explain(near, n);
}

}  // namespace
}  // namespace gradnorm

namespace gradnorm {
namespace {

// run_cli with shell commands before gradnorm (resource limits, say).
CliResult run_cli_after(const std::string& prelude, const std::vector<std::string>& args) {
  return run_shell("bash -c " + shell_quote(prelude + "; exec " + command_line(args)) + " 2>&1");
}

std::string write_scenarios(const TemporaryDirectory& folder, const std::string& name,
                            const std::string& text) {
  const std::string path = (folder.path() / name).string();
  std::ofstream(path) << text;
  return path;
}

// The command is an input error (exit 2) whose message holds `needle`.
::testing::AssertionResult refused(const std::vector<std::string>& args, const std::string& needle) {
  const CliResult r = run_cli(args);
  if (r.exit_code == 2 && contains(r.output, needle)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected exit 2 saying '" << needle << "'\n" << explain(args, r);
}

// The command runs with every row as expected (exit 0).
::testing::AssertionResult succeeds(const std::vector<std::string>& args) {
  const CliResult r = run_cli(args);
  if (r.exit_code == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected exit 0\n" << explain(args, r);
}

std::string counts_rows(int ranks) {
  std::string rows;
  for (int rank = 0; rank < ranks; ++rank) rows += rank == 0 ? "[1]" : ", [1]";
  return "[" + rows + "]";
}

// 64 rank threads whose stacks (1 GiB each, by the stack limit) cannot fit a 12 GiB address
// space: the run used to end in std::terminate (SIGABRT, no exit code); it is an error
// naming the rank that got no thread. The control: the same run without the limits passes.
TEST(Cli, ARankThreadThatCannotStartIsAnErrorNamingIt) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the limit leaves";
#endif
  TemporaryDirectory folder("gradnorm-cli-threads");
  const std::string file = write_scenarios(folder, "wide.toml",
      "[[scenario]]\nname = \"wide/64\"\nvalid_tokens = " + counts_rows(64) + "\n");
  const std::vector<std::string> args = {"run", "-q", "-f", file, "-v", "baseline"};
  const CliResult r = run_cli_after("ulimit -s 1048576 && ulimit -v 12582912", args);
  EXPECT_EQ(r.exit_code, 3) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "could not start a thread for rank")) << explain(args, r);
  EXPECT_FALSE(contains(r.output, "rank ?")) << explain(args, r);
  EXPECT_TRUE(succeeds(args));
}

// Input errors a rank used to meet only once running, now refused before any rank starts.
TEST(Cli, FaultsThatCouldNeverFireAreInputErrors) {
  const std::vector<std::string> late = {"run", "-q", "-s", "dist/5-3/float32", "-v", "baseline",
                                         "--inject-fault", "1:throw@1"};
  EXPECT_TRUE(refused(late, "has 1 step (0..0), so step 1 never comes"));
  const std::vector<std::string> far = {"run", "-q", "-s", "dist/5-3/float32", "-v", "baseline",
                                        "--inject-fault", "2:throw"};
  EXPECT_TRUE(refused(far, "has 2 ranks (0..1), so rank 2 would never fail"));
  // Control: a fault that does fire fails the run as a rank failure.
  const std::vector<std::string> fires = {"run", "-q", "-s", "dist/5-3/float32", "-v", "baseline",
                                          "--inject-fault", "1:throw@0"};
  EXPECT_EQ(run_cli(fires).exit_code, 3);
}

// A documented finding whose pattern matches no variant could never be checked: refused.
// Control: the same finding for a variant that exists runs.
TEST(Cli, AFindingForNoVariantIsAnInputError) {
  TemporaryDirectory folder("gradnorm-cli-findings");
  const std::string text = "[[scenario]]\nname = \"mine/6-2\"\nvalid_tokens = [[6], [2]]\n"
                           "[[scenario.expect]]\nvariant = \"VARIANT\"\nverdict = \"fail\"\n"
                           "reason = \"ragged ranks\"\nchecks = [\"gradients\", \"logged-loss\"]\n";
  auto with = [&](const std::string& variant) {
    std::string out = text;
    out.replace(out.find("VARIANT"), 7, variant);
    return out;
  };
  const std::string typo = write_scenarios(folder, "typo.toml", with("skpi"));
  const std::vector<std::string> args = {"run", "-q", "-f", typo, "-v", "skip"};
  EXPECT_TRUE(refused(args, "finding for variant 'skpi' matches no variant"));
  const std::string good = write_scenarios(folder, "good.toml", with("sk*"));
  const std::vector<std::string> good_args = {"run", "-q", "-f", good, "-v", "skip"};
  EXPECT_TRUE(succeeds(good_args));
}

// A file's scenario may not reuse a catalogue name, even when the file runs alone (when the
// catalogue is not loaded to run); two files may not share a name either.
TEST(Cli, AFileScenarioMayNotTakeACatalogueName) {
  TemporaryDirectory folder("gradnorm-cli-names");
  const std::string file = write_scenarios(folder, "clash.toml",
      "[[scenario]]\nname = \"dist/5-3/float32\"\nvalid_tokens = [[1], [1]]\n");
  const std::vector<std::string> args = {"run", "-q", "-f", file, "-v", "baseline"};
  EXPECT_TRUE(refused(args, "'dist/5-3/float32' is already defined in the catalogue"));
  const std::string a = write_scenarios(folder, "a.toml", "[[scenario]]\nname = \"mine/x\"\n");
  const std::string b = write_scenarios(folder, "b.toml", "[[scenario]]\nname = \"mine/x\"\n");
  const std::vector<std::string> twice = {"run", "-q", "-f", a, "-f", b, "-v", "baseline"};
  EXPECT_TRUE(refused(twice, "'mine/x' is already defined in " + a));
  const std::vector<std::string> one = {"run", "-q", "-f", a, "-v", "baseline"};
  EXPECT_TRUE(succeeds(one));
}

// A file that is not a regular file is refused at once: -f /dev/zero used to read 4 GiB.
TEST(Cli, AScenarioFileThatIsADeviceIsRefused) {
  const std::vector<std::string> args = {"run", "-q", "-f", "/dev/zero"};
  EXPECT_TRUE(refused(args, "'/dev/zero' is not a regular file"));
}

// Seeds are whole numbers that fit 64 bits: CLI11 read -1 as 2^64 - 1 and 2^64 as 2^64 - 1.
TEST(Cli, OutOfRangeSeedsAreInputErrors) {
  for (const char* seed : {"-1", "18446744073709551616", "1e3", ""}) {
    for (const char* command : {"fuzz", "stream"}) {
      const std::vector<std::string> args = {command, "--cases", "1", "--seed", seed};
      EXPECT_TRUE(refused(args, "must be a whole number in [0, 18446744073709551615]"));
    }
  }
  const std::vector<std::string> largest = {"stream", "--cases", "1", "--seed", "18446744073709551615"};
  EXPECT_TRUE(succeeds(largest));
}

// A scenario whose estimate passes the budget is refused before any rank starts, with the
// estimate and the budget; --memory-budget moves the line. The control: the default
// scenario fits a 1 GiB budget and runs.
TEST(Cli, AScenarioAboveTheMemoryBudgetIsRefusedWithItsEstimate) {
  TemporaryDirectory folder("gradnorm-cli-memory");
  const std::string huge = write_scenarios(folder, "huge.toml",
      "[[scenario]]\nname = \"huge\"\nvocab_size = 1048576\nhidden_size = 65536\n");
  const std::vector<std::string> args = {"run", "-q", "-f", huge, "-v", "baseline"};
  EXPECT_TRUE(refused(args, "scenario 'huge' needs about"));
  EXPECT_TRUE(refused(args, "of this machine's"));
  const std::string small = write_scenarios(folder, "small.toml",
      "[[scenario]]\nname = \"small\"\nvocab_size = 20000\nhidden_size = 64\n");
  const std::vector<std::string> tight = {"run", "-q", "-f", small, "-v", "baseline", "--memory-budget", "512M"};
  EXPECT_TRUE(refused(tight, "more than the memory budget of 0.5 GiB (--memory-budget 512M)"));
  for (const char* bad : {"lots", "-1G", "0", "150%", "nan", "8X", "inf"}) {
    const std::vector<std::string> b = {"run", "-q", "-f", small, "--memory-budget", bad};
    EXPECT_TRUE(refused(b, "expected a size such as 8G"));
  }
  const std::vector<std::string> fits = {"run", "-q", "-s", "single/n5/float32", "-v", "baseline", "--memory-budget", "1GiB"};
  EXPECT_TRUE(succeeds(fits));
}

// learning_rate = 1e308 passed validation and then failed inside the rank (exit 3).
TEST(Cli, AScaleTheDtypeCannotHoldIsAnInputError) {
  TemporaryDirectory folder("gradnorm-cli-overflow");
  const std::string file = write_scenarios(folder, "lr.toml",
      "[[scenario]]\nname = \"lr\"\nlearning_rate = 1e308\n");
  const std::vector<std::string> args = {"run", "-q", "-f", file, "-v", "baseline"};
  EXPECT_TRUE(refused(args, "learning_rate is 1e+308 but float32 holds at most"));
}

}  // namespace
}  // namespace gradnorm
