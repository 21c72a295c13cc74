// Hardening, second pass (docs/reliability.md): every path a command reads or writes, and
// the entries into user code, refused or protected as scenario files are. Each case is one a
// hostile user tried: before its fix it replaced a device node, read without end, wrote
// half an export, exited 3 with no rank, or wrote a report where a step had moved the
// working folder. The controls beside them prove the same commands still work.
#include "support/cli.hpp"
#include "support/files.hpp"
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace gradnorm {
namespace {

namespace fs = std::filesystem;
using testing_support::contains;
using testing_support::explain;
using testing_support::read_file;
using testing_support::run_cli;
using testing_support::shell_quote;
using testing_support::TemporaryDirectory;

bool is_empty_folder(const fs::path& folder) { return !fs::exists(folder) || fs::is_empty(folder); }

void expect_refused(const std::vector<std::string>& args, const std::string& says, int status = 2) {
  const testing_support::CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, status) << explain(args, r);
  EXPECT_TRUE(contains(r.output, says)) << "wanted '" << says << "': " << explain(args, r);
}

// stream --out on a device node replaced the node with a regular file, exit 0 (as root it
// destroyed /dev/full). Here a device node of the test's own (/dev/null's numbers), a FIFO
// and a folder: each stays what it was, exit 2 before the stream is drawn.
TEST(HostilePaths, StreamNeverReplacesWhatIsNotARegularFile) {
  TemporaryDirectory folder("gradnorm-hostile");
  const fs::path fifo = folder.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path device = folder.path() / "null";
  const bool have_device = ::mknod(device.c_str(), S_IFCHR | 0600, ::makedev(1, 3)) == 0;
  expect_refused({"stream", "--cases", "3", "--out", fifo.string()}, "is a FIFO");
  EXPECT_TRUE(fs::is_fifo(fifo));
  if (have_device) {  // mknod needs root; the FIFO and the folder prove the same path without it
    expect_refused({"stream", "--cases", "3", "--out", device.string()}, "is a device");
    EXPECT_TRUE(fs::is_character_file(device));
  }
  expect_refused({"stream", "--cases", "3", "--out", folder.path().string()}, "is a folder");
  // --cases beyond what run -f can read back (it wrote 2.7 GB that -f refused).
  expect_refused({"stream", "--cases", "10000000"}, "--cases");
  // Control: a regular file is written, and replaced atomically when it exists.
  const fs::path out = folder.path() / "stream.toml";
  std::ofstream(out) << "old";
  const std::vector<std::string> ok = {"stream", "--cases", "3", "--out", out.string()};
  const testing_support::CliResult r = run_cli(ok);
  EXPECT_EQ(r.exit_code, 0) << explain(ok, r);
  EXPECT_TRUE(contains(read_file(out), "stream/2"));
}

// validate-report /dev/zero and diff base.json /dev/urandom read without end (4 GB in 10 s);
// a FIFO blocked forever; a folder read as "not JSON"; a symbolic link loop as "does not
// exist". Each is now refused by what it is, before it is opened.
TEST(HostilePaths, ReportsAndScenarioFilesAreReadOnlyFromRegularFiles) {
  TemporaryDirectory folder("gradnorm-hostile");
  const fs::path fifo = folder.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path loop = folder.path() / "loop.json";
  fs::create_symlink(loop, loop);
  expect_refused({"validate-report", "/dev/zero"}, "'/dev/zero' is not a regular file (a device)");
  expect_refused({"validate-report", fifo.string()}, "is not a regular file (a FIFO)");
  expect_refused({"validate-report", folder.path().string()}, "is not a regular file (a folder)");
  expect_refused({"validate-report", loop.string()}, "is a symbolic link loop");
  expect_refused({"run", "-f", loop.string()}, "is a symbolic link loop");
  const fs::path base = folder.path() / "base.json";
  const std::vector<std::string> write = {"run", "-s", "single/n3/float32", "-v", "baseline",
                                          "--json", base.string()};
  ASSERT_EQ(run_cli(write).exit_code, 0);
  expect_refused({"diff", base.string(), "/dev/urandom"}, "'/dev/urandom' is not a regular file (a device)");
  expect_refused({"diff", base.string(), fifo.string()}, "(a FIFO)");
  // Control: the real report validates.
  EXPECT_EQ(run_cli({"validate-report", base.string()}).exit_code, 0);
}

// A report is checked, not only parsed: duplicated rows, a key twice in one object and a
// summary its records contradict were all "valid"; a head that lost every row said "no
// regression", exit 0.
TEST(HostilePaths, ReportsAreCheckedAgainstTheirOwnRecords) {
  TemporaryDirectory folder("gradnorm-hostile");
  const fs::path base = folder.path() / "base.json";
  const std::vector<std::string> write = {"run", "-s", "single/n3/float32", "-s", "single/n5/float32",
                                          "-v", "baseline", "--json", base.string()};
  ASSERT_EQ(run_cli(write).exit_code, 0);
  nlohmann::json report = nlohmann::json::parse(read_file(base));
  ASSERT_EQ(report["records"].size(), 2u);

  nlohmann::json doubled = report;
  doubled["records"][1] = doubled["records"][0];
  const fs::path twice = folder.path() / "twice.json";
  std::ofstream(twice) << doubled.dump();
  expect_refused({"validate-report", twice.string()}, "appears more than once", 1);

  nlohmann::json lying = report;
  lying["summary"]["pass"] = 7;
  const fs::path lies = folder.path() / "lies.json";
  std::ofstream(lies) << lying.dump();
  expect_refused({"validate-report", lies.string()}, "summary.pass is 7, but the records hold 2", 1);

  std::string text = report.dump();
  text.insert(1, "\"tool\": \"gradnorm\", ");  // the same key twice in the top object
  const fs::path keys = folder.path() / "keys.json";
  std::ofstream(keys) << text;
  expect_refused({"validate-report", keys.string()}, "has the key \"tool\" twice in one object");

  nlohmann::json empty = report;
  empty["records"] = nlohmann::json::array();
  empty["summary"]["rows"] = 0;
  empty["summary"]["pass"] = 0;
  const fs::path none = folder.path() / "none.json";
  std::ofstream(none) << empty.dump();
  expect_refused({"diff", base.string(), none.string()}, "the head judged nothing", 1);
  // A head that judged other rows only: nothing was compared, which fails as a regression
  // does (it said "no regression").
  nlohmann::json renamed = report;
  for (nlohmann::json& record : renamed["records"]) record["scenario"] = "renamed/" + record["scenario"].get<std::string>();
  const fs::path other = folder.path() / "other.json";
  std::ofstream(other) << renamed.dump();
  expect_refused({"diff", base.string(), other.string()},
                 "nothing compared (the head shares none of the base's 2 rows)", 1);
  // Controls: the report against itself, and the empty one as the base.
  EXPECT_EQ(run_cli({"diff", base.string(), base.string()}).exit_code, 0);
  EXPECT_EQ(run_cli({"diff", none.string(), base.string()}).exit_code, 0);
}

// export: two names for one file reported both exported and kept one; a name that cannot be
// a file failed after earlier files were written; "q/" exported as a hidden q/.pt; an --out
// that is a file, /dev/null or under /proc was exit 3 ("filesystem error") with no rank.
TEST(HostilePaths, ExportChecksEveryTargetBeforeTheFirstIsWritten) {
  TemporaryDirectory folder("gradnorm-hostile");
  const auto scenario_file = [&](const std::string& name, const std::vector<std::string>& names) {
    const fs::path file = folder.path() / name;
    std::ofstream out(file);
    for (const std::string& n : names) out << "[[scenario]]\nname = \"" << n << "\"\nvalid_tokens = [[3]]\n";
    return file.string();
  };
  const fs::path out = folder.path() / "out";
  const std::string long_name(300, 'x');
  const struct {
    std::vector<std::string> names;
    std::string says;
  } cases[] = {
      {{"m/a/b", "m/a//b"}, "has an empty part"},
      {{"n/a", "n/a.pt/x"}, "which scenario 'n/a.pt/x' needs as a folder"},
      {{"n/first", "n/" + long_name}, "longer than a file name may be"},
      {{"q/"}, "has an empty part"},
  };
  int index = 0;
  for (const auto& c : cases) {
    const std::string file = scenario_file("s" + std::to_string(index++) + ".toml", c.names);
    expect_refused({"export", "*", "--out", out.string(), "-f", file}, c.says);
    EXPECT_TRUE(is_empty_folder(out)) << "a refused export wrote into " << out;
  }
  const std::string one = scenario_file("one.toml", {"one/n3"});
  const fs::path regular = folder.path() / "regular";
  std::ofstream(regular) << "x";
  expect_refused({"export", "*", "--out", regular.string(), "-f", one}, "exists and is not a folder");
  expect_refused({"export", "*", "--out", "/dev/null", "-f", one}, "exists and is not a folder");
  expect_refused({"export", "*", "--out", "/proc/gradnorm-zz", "-f", one}, "takes no new file");
  // Control: the same export to a fresh folder writes its one file.
  const std::vector<std::string> ok = {"export", "*", "--out", out.string(), "-f", one};
  const testing_support::CliResult r = run_cli(ok);
  EXPECT_EQ(r.exit_code, 0) << explain(ok, r);
  EXPECT_TRUE(fs::is_regular_file(out / "one" / "n3.pt"));
}

// --json /sys/x.json passed the early check (root may "write" there), ran every rank, then
// failed at write time with no summary line. The folder is now probed by creating a file.
TEST(HostilePaths, AReportFolderThatTakesNoFileIsRefusedBeforeTheRun) {
  expect_refused({"run", "-s", "single/n3/float32", "-v", "baseline", "--json", "/sys/gradnorm-x.json"},
                 "takes no new file");
  const testing_support::CliResult r =
      run_cli({"run", "-s", "single/n3/float32", "-v", "baseline", "--json", "/sys/gradnorm-x.json"});
  EXPECT_FALSE(contains(r.output, "rows:")) << "the run went ahead: " << r.output;
}

// A folder given as a Python step read "no such file".
TEST(HostilePaths, AFolderGivenAsAPythonStepIsNamedAsOne) {
  TemporaryDirectory folder("gradnorm-hostile");
  expect_refused({"run", "--python-step", folder.path().string() + ":step", "-s", "single/n3/float32"},
                 "is not a regular file (a folder)");
}

// A Python step that calls os.chdir moved every relative report path: --json rel.json was
// written to the folder the step chose. Report paths are absolute before any user code runs.
TEST(HostileUserCode, AStepThatChangesTheWorkingFolderMovesNoReport) {
  TemporaryDirectory folder("gradnorm-hostile");
  TemporaryDirectory elsewhere("gradnorm-hostile-elsewhere");
  const fs::path step = folder.path() / "moves.py";
  std::ofstream(step) << "import os, runpy\n"
                         "_baseline = runpy.run_path(" << shell_quote(GRADNORM_SOURCE_DIR "/examples/python/full_finetune.py")
                      << ")\n"
                         "def step(ctx):\n"
                         "    os.chdir(" << shell_quote(elsewhere.path().string()) << ")\n"
                         "    return _baseline['step'](ctx)\n";
  const std::vector<std::string> args = {"run", "--python-step", step.string() + ":step", "--findings-of",
                                         "baseline", "-s", "single/n3/float32", "--json", "rel.json"};
  const testing_support::CliResult r = run_cli(args, "cd " + shell_quote(folder.path().string()));
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(fs::is_regular_file(folder.path() / "rel.json")) << explain(args, r);
  EXPECT_FALSE(fs::exists(elsewhere.path() / "rel.json"));
}

std::string write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path.string();
}

// The example baseline step, run from another file (runpy: no import of the example module).
std::string baseline_prelude() {
  return "import os, runpy, signal, time\n"
         "import numpy as np\n"
         "import torch\n"
         "_baseline = runpy.run_path(" +
         shell_quote(GRADNORM_SOURCE_DIR "/examples/python/full_finetune.py") + ")\n";
}

// A step module whose import or cannot_run never returned hung the run: --timeout did not
// apply before the ranks started. Both are input errors naming the file, exit 2.
TEST(HostileUserCode, AStepThatHangsInItsImportOrCannotRunIsStoppedByTimeout) {
  TemporaryDirectory folder("gradnorm-hostile");
  const std::string importing = write_file(folder.path() / "importing.py",
                                           "import time\nwhile True:\n    time.sleep(0.01)\n"
                                           "def step(ctx):\n    pass\n");
  expect_refused({"run", "--python-step", importing, "-s", "single/n3/float32", "--timeout", "1"},
                 "did not load within 1000 ms");
  const std::string asking = write_file(folder.path() / "asking.py",
                                        "def cannot_run(scenario):\n    while True:\n        pass\n"
                                        "def step(ctx):\n    pass\n");
  expect_refused({"run", "--python-step", asking, "-s", "single/n3/float32", "--timeout", "1"},
                 "cannot_run did not answer on scenario 'single/n3/float32' within 1000 ms");
}

// The body of a step that iterates a DataLoader with two worker processes (each a fork).
const std::string kDataLoaderWithWorkers =
    "    data = torch.utils.data.DataLoader(list(range(8)), num_workers=2)\n"
    "    assert sorted(int(x) for x in data) == list(range(8))\n";

// A step that forked (a DataLoader with workers) aborted the workers with std::system_error;
// an os.fork() child returned into the harness and stayed, deadlocked, after the run. Now a
// forked child computes freely, is refused the harness (its ctx), and ends when the step's
// call does; the parent's run is judged as usual. A NumPy scalar is a loss to log.
TEST(HostileUserCode, AStepThatForksKeepsItsVerdictAndLeavesNoProcessBehind) {
  TemporaryDirectory folder("gradnorm-hostile");
  const fs::path said = folder.path() / "child.txt";
  const std::string step = write_file(
      folder.path() / "forks.py",
      baseline_prelude() +
          "def step(ctx):\n" +
          kDataLoaderWithWorkers +
          "    pid = os.fork()\n"
          "    if pid == 0:\n"
          "        try:\n"
          "            ctx.optimizer.step()\n"
          "            open(" + shell_quote(said.string()) + ", 'w').write('reached the harness')\n"
          "        except RuntimeError as error:\n"
          "            open(" + shell_quote(said.string()) + ", 'w').write(str(error))\n"
          "        return None\n"
          "    os.waitpid(pid, 0)\n"
          "    out = _baseline['step'](ctx)\n"
          "    out['loss_to_log'] = np.float64(out['loss_to_log'])\n"
          "    return out\n");
  const std::vector<std::string> args = {"run", "--python-step", step, "--findings-of", "baseline",
                                         "-s", "single/n3/float32"};
  const testing_support::CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "1 rows: 1 pass")) << explain(args, r);
  EXPECT_TRUE(contains(read_file(said), "belong to the harness's process")) << read_file(said);
  // No process of this step outlives the run (the child's own pid is gone once waited).
  const testing_support::CliResult left = testing_support::run_shell(
      "pgrep -f " + shell_quote(std::string("^") + GRADNORM_CLI + " run --python-step " + step) + " | wc -l");
  EXPECT_EQ(left.output, "0\n");
}

// An os.fork() from a step whose two ranks were threads of one process hung once (exit 3
// after the timeout): the child held the other rank's locks with no thread to release them.
// There a fork is refused, naming the cause and what works instead; the same step with its
// ranks as processes (--nproc 2) forks its DataLoader's workers and passes (the control).
TEST(HostileUserCode, AForkFromRanksThatAreThreadsIsRefusedAndRankProcessesMayFork) {
  TemporaryDirectory folder("gradnorm-hostile");
  const std::string step = write_file(
      folder.path() / "workers.py",
      baseline_prelude() +
          "def step(ctx):\n" +
          kDataLoaderWithWorkers +
          "    return _baseline['step'](ctx)\n");
  const std::vector<std::string> threads = {"run", "--python-step", step, "--findings-of",
                                            "baseline", "-s", "dist/5-3/float32"};
  const testing_support::CliResult refused = run_cli(threads);
  EXPECT_EQ(refused.exit_code, 1) << explain(threads, refused);  // a verdict: the step raised
  EXPECT_TRUE(contains(refused.output, "os.fork inside a gradnorm step whose 2 ranks are threads"))
      << explain(threads, refused);
  EXPECT_TRUE(contains(refused.output, "--nproc W")) << explain(threads, refused);
  std::vector<std::string> processes = threads;
  processes.insert(processes.end(), {"--nproc", "2"});
  const testing_support::CliResult r = run_cli(processes);
  EXPECT_EQ(r.exit_code, 0) << explain(processes, r);
  EXPECT_TRUE(contains(r.output, "1 rows: 1 pass")) << explain(processes, r);
}

// signal.alarm in a step killed the run with no message (SIGALRM's default action).
TEST(HostileUserCode, ATimerSignalInAStepIsRefusedNamingTimeout) {
  TemporaryDirectory folder("gradnorm-hostile");
  const std::string step = write_file(folder.path() / "alarm.py",
                                      "import signal\ndef step(ctx):\n    signal.alarm(1)\n");
  const std::vector<std::string> args = {"run", "--python-step", step, "-s", "single/n3/float32"};
  const testing_support::CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << explain(args, r);  // a verdict: the step raised where it must not
  EXPECT_TRUE(contains(r.output, "signal.alarm inside a gradnorm step")) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "--timeout bounds a step's time")) << explain(args, r);
}

// A model whose forward draws (dropout in training mode), changes its own buffers, cannot be
// differentiated (an in-place update of a tensor its backward needs) or computes NaN: the
// reference failed with nothing pointing at the model, or the oracle raised a raw autograd
// message (exit 3), or the step was blamed ("non-finite gradients, got nan, want nan"). Each
// is an input error naming the scenario and the model file, before any row runs; the same
// model without the fault runs (the control).
TEST(HostileUserCode, AModelThatIsNotAFunctionOfItsTokensIsRefusedNamingIt) {
  TemporaryDirectory folder("gradnorm-hostile");
  const std::string models = write_file(
      folder.path() / "models.py",
      "import torch\n"
      "class Lm(torch.nn.Module):\n"
      "    def __init__(self, vocab_size, hidden_size, fault):\n"
      "        super().__init__()\n"
      "        self.fault = fault\n"
      "        self.embedding = torch.nn.Embedding(vocab_size, hidden_size)\n"
      "        self.head = torch.nn.Linear(hidden_size, vocab_size)\n"
      "        self.register_buffer('scale', torch.ones(1))\n"
      "        self.register_buffer('calls', torch.zeros(1))\n"
      "    def forward(self, tokens):\n"
      "        x = self.embedding(tokens)\n"
      "        if self.fault == 'dropout':\n"
      "            x = torch.nn.functional.dropout(x, 0.5, training=True)\n"
      "        if self.fault == 'nan':\n"
      "            x = x * float('nan')\n"
      "        y = x * self.scale\n"
      "        if self.fault == 'inplace':\n"
      "            self.scale.mul_(1.0)\n"
      "        if self.fault == 'counter':\n"
      "            with torch.no_grad():\n"
      "                self.calls.add_(1.0)\n"
      "        return self.head(torch.cumsum(y, 1))\n"
      "def build(fault):\n"
      "    return lambda vocab_size, hidden_size, sequence_length: Lm(vocab_size, hidden_size, fault)\n"
      "clean, dropout, nan, inplace, counter = (build(f) for f in "
      "('clean', 'dropout', 'nan', 'inplace', 'counter'))\n");
  auto scenario = [&](const std::string& fault) {
    return write_file(folder.path() / (fault + ".toml"),
                      "[[scenario]]\nname = \"m/" + fault + "\"\nvalid_tokens = [[5]]\n"
                      "model = \"python:" + models + ":" + fault + "\"\n");
  };
  auto run = [&](const std::string& fault) {
    return std::vector<std::string>{"run", "-f", scenario(fault), "-v", "baseline"};
  };
  auto names = [&](const std::string& fault) {
    std::string out = "scenario 'm/" + fault + "': model 'python:" + models + ":" + fault + "'";
    return out;
  };
  expect_refused(run("dropout"), names("dropout") + " is not a function of its token ids");
  expect_refused(run("nan"), names("nan") + " gives non-finite logits");
  expect_refused(run("inplace"), names("inplace") + " cannot be differentiated in float64");
  expect_refused(run("counter"), names("counter") + " changes its buffer 'calls' in forward");
  const testing_support::CliResult r = run_cli(run("clean"));
  EXPECT_EQ(r.exit_code, 0) << explain(run("clean"), r);
  EXPECT_TRUE(contains(r.output, "1 rows: 1 pass")) << explain(run("clean"), r);
}

// explain on a valid model-from-file scenario that run accepts exited 2 with an internal
// contradiction (the token probe kept the scenario's model file): it explains.
TEST(HostileUserCode, ExplainRunsOnAScenarioWithAModelFromAFile) {
  const std::vector<std::string> args = {"explain", "pymodel/5-3", "-f",
                                         GRADNORM_SOURCE_DIR "/examples/python/models.toml"};
  const testing_support::CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  EXPECT_TRUE(contains(r.output, "orthogonal per-token gradients")) << explain(args, r);
}

// The smaller ones: each was silently ignored, blamed the wrong field or file, or accepted
// what cannot be right.
TEST(HostileOptions, WhatWasSilentlyIgnoredOrMisnamedIsRefusedByName) {
  TemporaryDirectory folder("gradnorm-hostile");
  const fs::path mine = folder.path() / "mine.toml";
  std::ofstream(mine) << "[[scenario]]\nname = \"mine/6-2\"\nvalid_tokens = [[6], [2]]\n";
  // -f FILE -s PATTERN ran none of the file's scenarios, and said nothing.
  expect_refused({"run", "-f", mine.string(), "-s", "single/n3/float32", "-v", "baseline"},
                 "none of its 1 scenario(s) ('mine/6-2') matches -s single/n3/float32");
  // --backend nccl with ranks as threads, and bench --against without a Python step.
  expect_refused({"run", "-s", "dist/5-3/float32", "-v", "baseline", "--backend", "nccl"},
                 "--backend nccl is the c10d backend of rank processes");
  expect_refused({"bench", "--against", "baseline"}, "bench --against baseline: times a Python step");
  // valid_tokens = [[]] blamed accumulation_steps.
  const fs::path empty = folder.path() / "empty.toml";
  std::ofstream(empty) << "[[scenario]]\nname = \"e/x\"\nvalid_tokens = [[]]\n";
  expect_refused({"run", "-f", empty.string()}, "valid_tokens rank 0 holds no micro-batch ([])");
  // A finding naming no variant did not name its file.
  const fs::path unknown = folder.path() / "unknown.toml";
  std::ofstream(unknown) << "[[scenario]]\nname = \"u/y\"\nvalid_tokens = [[3]]\n[[scenario.expect]]\n"
                            "variant = \"nosuch\"\nverdict = \"fail\"\nreason = \"x\"\nchecks = [\"gradients\"]\n";
  expect_refused({"run", "-f", unknown.string()}, unknown.string() + ": scenario 'u/y': the documented finding");
  // A negative control, broken on purpose, was accepted as a Python step's reference.
  expect_refused({"run", "--python-step", GRADNORM_SOURCE_DIR "/examples/python/full_finetune.py", "--reference",
                  "broken/clip-inside-skip-gate", "-s", "single/n3/float32"},
                 "is a negative control, broken on purpose");
  // GRADNORM_STORE in a folder that does not exist was exit 3; under --launcher env the
  // world-size message said "change --nproc".
  const std::string env = "export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0";
  const std::vector<std::string> store = {"run", "--launcher", "env", "-s", "single/n3/float32", "-v", "baseline"};
  testing_support::CliResult r = run_cli(store, env + " GRADNORM_STORE=file:/nonexistent-gradnorm/dir/s");
  EXPECT_EQ(r.exit_code, 2) << explain(store, r);
  EXPECT_TRUE(contains(r.output, "the folder /nonexistent-gradnorm/dir does not exist")) << explain(store, r);
  const std::vector<std::string> world = {"run", "--launcher", "env", "-s", "dist/5-3/float32", "-v", "baseline"};
  r = run_cli(world, env + " GRADNORM_STORE=file:" + (folder.path() / "store").string());
  EXPECT_EQ(r.exit_code, 2) << explain(world, r);
  EXPECT_TRUE(contains(r.output, "or change the launcher's WORLD_SIZE")) << explain(world, r);
}

// A finding's reason holding "<!--" hid the rest of the Markdown comment on GitHub.
TEST(HostileOptions, AReasonCannotOpenHtmlInTheMarkdownReport) {
  TemporaryDirectory folder("gradnorm-hostile");
  const fs::path mine = folder.path() / "mine.toml";
  std::ofstream(mine) << "[[scenario]]\nname = \"mine/6-2\"\nvalid_tokens = [[6], [2]]\n"
                         "[[scenario.expect]]\nvariant = \"skip\"\nverdict = \"fail\"\n"
                         "reason = \"ragged <!-- ranks\"\nchecks = [\"gradients\", \"logged-loss\"]\n";
  const fs::path md = folder.path() / "r.md";
  const std::vector<std::string> args = {"run", "-f", mine.string(), "-v", "skip", "--markdown", md.string()};
  const testing_support::CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << explain(args, r);
  const std::string text = read_file(md);
  EXPECT_TRUE(contains(text, "ragged &lt;!-- ranks")) << text;
  EXPECT_FALSE(contains(text, "<!--")) << text;
}

}  // namespace
}  // namespace gradnorm
