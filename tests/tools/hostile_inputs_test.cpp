// Hardening, second pass (README "Reliability"): every path a command reads or writes, and
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
