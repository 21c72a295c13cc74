// The gradnorm CLI with ranks as real processes over c10d Gloo: the same records as ranks as
// threads, faults that fail the run promptly (exit 3) without leaving a process or a
// rendezvous folder behind, torchrun-style "--launcher env" ranks, and the input errors.
#include "support/files.hpp"
#include "gradnorm/harness/transport.hpp"
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace gradnorm {
namespace {

using testing_support::contains;
using testing_support::read_file;
using testing_support::TemporaryDirectory;

using nlohmann::json;
using namespace std::chrono_literals;

constexpr int kExitAsExpected = 0;
constexpr int kExitUsage = 2;
constexpr int kExitRankFailed = 3;

// Only a safety net so a broken build cannot hang the suite; no test asserts a duration.
constexpr auto kSafetyDeadline = 180s;


// What the child's environment changes: `set` overrides or adds, `unset` removes.
struct EnvironmentChanges {
  std::map<std::string, std::string> set;
  std::vector<std::string> unset;
};

struct ProcessResult {
  int exit_code = -1;  // -1 when the process did not exit normally
  bool killed_at_safety_deadline = false;
  std::string out;
  std::string err;
};

std::string describe(const std::vector<std::string>& args, const EnvironmentChanges& env,
                     const ProcessResult& result) {
  std::ostringstream text;
  text << "$";
  for (const auto& [key, value] : env.set) text << " " << key << "=" << value;
  for (const std::string& key : env.unset) text << " (unset " << key << ")";
  text << " gradnorm";
  for (const std::string& arg : args) text << " '" << arg << "'";
  text << "\n(exit " << result.exit_code
       << (result.killed_at_safety_deadline ? ", killed at the safety deadline" : "")
       << ")\n--- stdout\n" << result.out << "--- stderr\n" << result.err;
  return text.str();
}

// gradnorm started in the background with its stdout and stderr in files of `folder`.
class Child {
 public:
  Child(const std::vector<std::string>& args, const EnvironmentChanges& env,
        const std::filesystem::path& folder, const std::string& name)
      : out_path_(folder / (name + ".out")), err_path_(folder / (name + ".err")) {
    std::vector<std::string> argv_text{GRADNORM_CLI};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<std::string> env_text;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string text = *entry;
      const std::string key = text.substr(0, text.find('='));
      if (env.set.count(key) ||
          std::find(env.unset.begin(), env.unset.end(), key) != env.unset.end()) {
        continue;
      }
      env_text.push_back(text);
    }
    for (const auto& [key, value] : env.set) env_text.push_back(key + "=" + value);
    std::vector<char*> argv, envp;
    for (std::string& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int failed = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (failed != 0) throw std::runtime_error(std::string("posix_spawn failed: ") + strerror(failed));
  }
  [[nodiscard]] pid_t pid() const { return pid_; }
  ~Child() {
    if (!waited_) {
      kill(pid_, SIGKILL);
      int ignored = 0;
      waitpid(pid_, &ignored, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  ProcessResult wait() {
    ProcessResult result;
    const auto deadline = std::chrono::steady_clock::now() + kSafetyDeadline;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);  // its ranks follow through PR_SET_PDEATHSIG
        waitpid(pid_, &status, 0);
        result.killed_at_safety_deadline = true;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    waited_ = true;
    if (WIFEXITED(status) && !result.killed_at_safety_deadline) result.exit_code = WEXITSTATUS(status);
    result.out = read_file(out_path_);
    result.err = read_file(err_path_);
    return result;
  }

 private:
  std::filesystem::path out_path_, err_path_;
  pid_t pid_ = -1;
  bool waited_ = false;
};

ProcessResult run_cli(const std::vector<std::string>& args, const EnvironmentChanges& env = {}) {
  TemporaryDirectory folder("gradnorm-process-test");
  Child child(args, env, folder.path(), "gradnorm");
  return child.wait();
}

// A value no other process carries, to find this test's processes in /proc.
std::string unique_marker() {
  static std::atomic<int> counter{0};
  return std::to_string(getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "-" +
         std::to_string(counter++);
}

constexpr const char* kMarkerKey = "GRADNORM_TEST_MARKER";

// The test's own environment plus a fresh marker, which every rank process inherits.
EnvironmentChanges marked_environment() {
  EnvironmentChanges env;
  env.set[kMarkerKey] = unique_marker();
  return env;
}

// Every process (of ours: /proc/PID/environ is readable for those) whose environment holds
// `entry` ("KEY=VALUE") exactly.
std::vector<pid_t> processes_with_environment_entry(const std::string& entry) {
  std::vector<pid_t> out;
  std::error_code error;
  for (const auto& dir : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = dir.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const std::string environment = read_file(dir.path() / "environ");
    std::size_t start = 0;
    while (start < environment.size()) {
      std::size_t end = environment.find('\0', start);
      if (end == std::string::npos) end = environment.size();
      if (environment.compare(start, end - start, entry) == 0) {
        out.push_back(static_cast<pid_t>(std::stol(name)));
        break;
      }
      start = end + 1;
    }
  }
  return out;
}

testing::AssertionResult no_process_carries(const std::string& marker) {
  const std::vector<pid_t> left = processes_with_environment_entry(std::string(kMarkerKey) + "=" + marker);
  if (left.empty()) return testing::AssertionSuccess();
  testing::AssertionResult failure = testing::AssertionFailure();
  failure << left.size() << " process(es) of the run are still alive (orphans):";
  for (pid_t pid : left) {
    std::string command = read_file(std::filesystem::path("/proc") / std::to_string(pid) / "cmdline");
    std::replace(command.begin(), command.end(), '\0', ' ');
    failure << "\n  pid " << pid << ": " << command;
  }
  return failure;
}

std::set<std::string> rendezvous_folders() {
  std::set<std::string> out;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("gradnorm-ranks-", 0) == 0) out.insert(entry.path().string());
  }
  return out;
}

// Rendezvous folders made since `before` that no live rank still uses. Another run (a test
// beside this one, FuzzOnRankProcesses's hundreds) holds a folder of its own for a moment
// before its ranks start and after they end, so a folder is only left over when it stays,
// never used by a process naming it as its GRADNORM_STATUS_DIR, through the whole grace: one
// this run left stays for good. (Requiring no such folder at any one moment failed beside
// FuzzOnRankProcesses, whose runs follow each other closely.)
testing::AssertionResult no_rendezvous_folder_left(const std::set<std::string>& before,
                                                   std::chrono::milliseconds grace_period = 3s) {
  auto unused_new = [&before] {
    std::set<std::string> found;
    for (const std::string& folder : rendezvous_folders()) {
      if (before.count(folder)) continue;
      if (!processes_with_environment_entry("GRADNORM_STATUS_DIR=" + folder).empty()) continue;
      found.insert(folder);
    }
    return found;
  };
  std::set<std::string> staying = unused_new();
  const auto grace = std::chrono::steady_clock::now() + grace_period;
  while (!staying.empty() && std::chrono::steady_clock::now() < grace) {
    std::this_thread::sleep_for(50ms);
    const std::set<std::string> now = unused_new();
    std::set<std::string> still;
    std::set_intersection(staying.begin(), staying.end(), now.begin(), now.end(),
                          std::inserter(still, still.end()));
    staying = std::move(still);
  }
  if (staying.empty()) return testing::AssertionSuccess();
  const std::vector<std::string> left(staying.begin(), staying.end());
  testing::AssertionResult failure = testing::AssertionFailure();
  failure << "the run left its rendezvous folder behind:";
  for (const std::string& folder : left) failure << " " << folder;
  return failure;
}

json read_report(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  json report = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.contains("records")) {
    throw std::runtime_error("'" + path.string() + "' is not a gradnorm JSON report: " +
                             text.substr(0, 500));
  }
  return report;
}

std::string row_name(const json& record) {
  return record.value("scenario", "?") + " x " + record.value("variant", "?");
}

// The same rows in the same order, and every number a user sees identical bit for bit.
testing::AssertionResult same_records(const json& threads, const json& processes) {
  const json& a = threads.at("records");
  const json& b = processes.at("records");
  if (a.size() != b.size()) {
    return testing::AssertionFailure() << "threads wrote " << a.size() << " records, processes "
                                       << b.size();
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (row_name(a[i]) != row_name(b[i])) {
      return testing::AssertionFailure() << "record " << i << " is " << row_name(a[i])
                                         << " with threads but " << row_name(b[i])
                                         << " with processes";
    }
    for (const char* key : {"observation_digest", "verdict", "logged_loss", "grad_norm", "world_size"}) {
      if (!a[i].contains(key) || a[i].at(key) != b[i].value(key, json())) {
        return testing::AssertionFailure()
               << "record " << i << " (" << row_name(a[i]) << "): " << key << " is "
               << a[i].value(key, json()).dump() << " with threads but "
               << b[i].value(key, json()).dump() << " with processes";
      }
    }
  }
  return testing::AssertionSuccess();
}

// |a - b| within `relative` of the larger, or within a float32 epsilon: an error measured at
// float32 rounding level (1e-7) moves by a fraction of itself when Gloo adds in another order.
bool measured_alike(double a, double b, double relative) {
  return std::abs(a - b) <= std::max(relative * std::max(std::abs(a), std::abs(b)),
                                     static_cast<double>(FLT_EPSILON));
}

// The same rows in the same order, the same verdicts, and rel_l2_error measured alike.
testing::AssertionResult same_verdicts_close_errors(const json& threads, const json& processes,
                                                    double relative) {
  const json& a = threads.at("records");
  const json& b = processes.at("records");
  if (a.size() != b.size()) {
    return testing::AssertionFailure() << "threads wrote " << a.size() << " records, processes "
                                       << b.size();
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (row_name(a[i]) != row_name(b[i]) || a[i].value("verdict", "") != b[i].value("verdict", "") ||
        a[i].value("world_size", json()) != b[i].value("world_size", json())) {
      return testing::AssertionFailure()
             << "record " << i << ": threads " << row_name(a[i]) << " -> "
             << a[i].value("verdict", "?") << ", processes " << row_name(b[i]) << " -> "
             << b[i].value("verdict", "?");
    }
    const json& ea = a[i].value("rel_l2_error", json());
    const json& eb = b[i].value("rel_l2_error", json());
    if (ea.is_null() != eb.is_null() ||
        (ea.is_number() && !measured_alike(ea.get<double>(), eb.get<double>(), relative))) {
      return testing::AssertionFailure()
             << "record " << i << " (" << row_name(a[i]) << "): rel_l2_error " << ea.dump()
             << " with threads but " << eb.dump() << " with processes (allowed: " << relative
             << " relative or " << FLT_EPSILON << " absolute)";
    }
  }
  return testing::AssertionSuccess();
}

struct CrossCheck {
  json threads;
  json processes;
};

// Runs the same selection as threads and as `world` Gloo processes; both must exit 0, and
// the processes run must leave no process and no rendezvous folder.
CrossCheck run_both_ways(const std::vector<std::string>& selection, int world) {
  TemporaryDirectory folder("gradnorm-process-test");
  const std::string threads_json = (folder.path() / "threads.json").string();
  const std::string processes_json = (folder.path() / "processes.json").string();

  std::vector<std::string> threads_args{"run", "--quiet"};
  threads_args.insert(threads_args.end(), selection.begin(), selection.end());
  std::vector<std::string> processes_args = threads_args;
  threads_args.insert(threads_args.end(), {"--json", threads_json});
  processes_args.insert(processes_args.end(), {"--launcher", "processes", "--nproc",
                                               std::to_string(world), "--json", processes_json});

  const ProcessResult t = run_cli(threads_args);
  EXPECT_EQ(t.exit_code, kExitAsExpected) << describe(threads_args, {}, t);

  const std::set<std::string> folders_before = rendezvous_folders();
  const EnvironmentChanges env = marked_environment();
  const ProcessResult p = run_cli(processes_args, env);
  EXPECT_EQ(p.exit_code, kExitAsExpected) << describe(processes_args, env, p);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
  EXPECT_TRUE(no_rendezvous_folder_left(folders_before));

  CrossCheck out{read_report(threads_json), read_report(processes_json)};
  // Without this a CLI that ignored --launcher would pass every comparison below.
  EXPECT_EQ(out.threads["settings"].value("transport", ""), "threads");
  EXPECT_EQ(out.processes["settings"].value("transport", ""),
            "gloo processes x " + std::to_string(world));
  EXPECT_FALSE(out.threads.at("records").empty());
  for (const json& record : out.processes.at("records")) {
    EXPECT_EQ(record.value("world_size", 0), world) << row_name(record);
  }
  return out;
}

TEST(ProcessCrossCheck, TwoRanksAsProcessesSeeExactlyWhatThreadsSee) {
  const CrossCheck both = run_both_ways(
      {"--scenario", "dist/5-3/*", "--scenario", "dist/1-64/*", "--scenario", "dist/4-4/*",
       "--scenario", "dist/0-8/*", "--scenario", "dist/accum2-ragged/*"},
      2);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(same_records(both.threads, both.processes));

  // Negative controls: one changed digest, or two rows swapped, is caught.
  json tampered = both.processes;
  json& last = tampered["records"].back();
  last["observation_digest"] = last.value("observation_digest", "") + "0";
  EXPECT_FALSE(same_records(both.threads, tampered));
  json swapped = both.processes;
  ASSERT_GE(swapped["records"].size(), 2u);
  std::swap(swapped["records"][0], swapped["records"][1]);
  EXPECT_FALSE(same_records(both.threads, swapped));
}

TEST(ProcessCrossCheck, FourRanksAsProcessesSeeExactlyWhatThreadsSee) {
  const CrossCheck both = run_both_ways({"--scenario", "dist/8-0-0-0/*"}, 4);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(same_records(both.threads, both.processes));

  json tampered = both.processes;
  tampered["records"].front()["grad_norm"] = 1.5;
  EXPECT_FALSE(same_records(both.threads, tampered));
}

// Gloo's ring all-reduce adds eight ranks in another order than the threads' rank order, so
// the bits may differ; the verdicts may not, and the measured errors only by rounding.
TEST(ProcessCrossCheck, EightRanksAsProcessesReachTheSameVerdicts) {
  const CrossCheck both = run_both_ways({"--scenario", "dist/8-ranks-ragged/float32"}, 8);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(same_verdicts_close_errors(both.threads, both.processes, 1e-6));

  json tampered = both.processes;
  for (json& record : tampered["records"]) {
    if (record.value("rel_l2_error", json()).is_number() && record.value("rel_l2_error", 0.0) > 1e-3) {
      record["rel_l2_error"] = record.value("rel_l2_error", 0.0) * (1 + 1e-5);
      break;
    }
  }
  EXPECT_FALSE(same_verdicts_close_errors(both.threads, tampered, 1e-6));
  json flipped = both.processes;
  json& verdict = flipped["records"].front()["verdict"];
  verdict = verdict == "pass" ? "fail" : "pass";
  EXPECT_FALSE(same_verdicts_close_errors(both.threads, flipped, 1e-6));
}

// Meshes over Gloo: each FSDP subgroup is a ProcessGroupGloo of its own. Four-rank subgroups
// add in Gloo's order, so bits may differ from threads; verdicts may not.
TEST(ProcessCrossCheck, MeshesAsProcessesReachTheSameVerdicts) {
  const CrossCheck both = run_both_ways(
      {"--scenario", "dist/tp2/float32", "--scenario", "dist/cp2/float32", "--scenario",
       "dist/hsdp/float32"},
      4);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(same_verdicts_close_errors(both.threads, both.processes, 1e-6));
  json flipped = both.processes;
  json& verdict = flipped["records"].front()["verdict"];
  verdict = verdict == "pass" ? "fail" : "pass";
  EXPECT_FALSE(same_verdicts_close_errors(both.threads, flipped, 1e-6));
}

// The collective timeout each fault runs under. A hang is only detected when a collective
// times out, so hang cases keep it short. A rank that throws or exits ends the run at once
// whatever the timeout, so those cases take a long one: on a slow machine a short timeout
// could fire first and report the throwing rank's peer as a hang.
constexpr const char* kHangTimeoutSeconds = "2";
constexpr const char* kNoHangTimeoutSeconds = "60";

// A fault in one rank of a 2-process run: exit 3, the cause on stderr, and nothing left.
void expect_fault_reported(const std::string& fault, const std::string& rank,
                           const std::vector<std::string>& any_of_words,
                           const std::string& timeout_seconds) {
  const std::vector<std::string> args = {"run",       "--timeout", timeout_seconds, "-s",
                                         "dist/5-3/float32", "-v",  "baseline",   "--launcher",
                                         "processes", "--nproc",   "2",          "--inject-fault",
                                         fault};
  const std::set<std::string> folders_before = rendezvous_folders();
  const EnvironmentChanges env = marked_environment();
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitRankFailed) << describe(args, env, r);
  EXPECT_TRUE(contains(r.err, rank)) << describe(args, env, r);
  EXPECT_TRUE(std::any_of(any_of_words.begin(), any_of_words.end(),
                          [&](const std::string& word) { return contains(r.err, word); }))
      << "stderr names none of the expected causes\n" << describe(args, env, r);
  if (timeout_seconds != kHangTimeoutSeconds) {
    // The failure this timeout guards against: the throwing rank's peer blamed for a hang.
    EXPECT_FALSE(contains(r.err, "(hang)")) << describe(args, env, r);
  }
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey))) << describe(args, env, r);
  EXPECT_TRUE(no_rendezvous_folder_left(folders_before)) << describe(args, env, r);
}

TEST(ProcessFaults, ARankThatThrowsFailsTheRunAndIsNamed) {
  expect_fault_reported("1:throw", "rank 1", {"threw"}, kNoHangTimeoutSeconds);
}

TEST(ProcessFaults, ARankThatExitsFailsTheRunAndIsNamed) {
  expect_fault_reported("1:exit", "rank 1", {"vanished", "status 4"}, kNoHangTimeoutSeconds);
}

TEST(ProcessFaults, ARankThatHangsFailsTheRunAndIsNamed) {
  expect_fault_reported("1:hang", "rank 1", {"hang"}, kHangTimeoutSeconds);
}

TEST(ProcessFaults, RankZeroHangingIsNamedToo) {
  expect_fault_reported("0:hang", "rank 0", {"hang"}, kHangTimeoutSeconds);
}

// The checks above can fail: a marked process is seen, and a new folder is reported.
TEST(ProcessFaults, LeftoverChecksSeeAMarkedProcessAndAFolder) {
  const std::string marker = unique_marker();
  const std::string entry = std::string(kMarkerKey) + "=" + marker;
  char program[] = "/bin/sleep";
  char seconds[] = "60";
  char* argv[] = {program, seconds, nullptr};
  std::vector<char*> envp{const_cast<char*>(entry.c_str()), nullptr};
  pid_t sleeper = -1;
  ASSERT_EQ(posix_spawn(&sleeper, program, nullptr, nullptr, argv, envp.data()), 0);
  bool seen = false;
  for (int attempt = 0; attempt < 200 && !seen; ++attempt) {  // until exec has happened
    seen = !no_process_carries(marker);
    if (!seen) std::this_thread::sleep_for(10ms);
  }
  kill(sleeper, SIGKILL);
  int status = 0;
  waitpid(sleeper, &status, 0);
  EXPECT_TRUE(seen) << "the orphan scan did not see a live process carrying " << entry;
  EXPECT_TRUE(no_process_carries(marker));

  const std::set<std::string> before = rendezvous_folders();
  std::string pattern = "/tmp/gradnorm-ranks-XXXXXX";
  ASSERT_NE(mkdtemp(pattern.data()), nullptr);
  // No grace: the folder is gone again at once, before another run's check could see it.
  const testing::AssertionResult verdict = no_rendezvous_folder_left(before, 0ms);
  std::filesystem::remove(pattern);
  EXPECT_FALSE(verdict) << "a new folder " << pattern << " was not reported";
  EXPECT_TRUE(contains(verdict.message(), pattern)) << verdict.message();
}

int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    throw std::runtime_error("cannot bind a free port on 127.0.0.1");
  }
  close(fd);
  return ntohs(address.sin_port);
}

EnvironmentChanges torchrun_environment(int rank, int world, int port) {
  return EnvironmentChanges{
      .set = {{"RANK", std::to_string(rank)},
              {"WORLD_SIZE", std::to_string(world)},
              {"MASTER_ADDR", "127.0.0.1"},
              {"MASTER_PORT", std::to_string(port)}},
      .unset = {"GRADNORM_STORE", "GRADNORM_STATUS_DIR", "LOCAL_RANK"}};
}

TEST(EnvLauncher, TwoTorchrunStyleRanksMeetOverTcpAndRankZeroReports) {
  const std::vector<std::string> args = {"run", "--launcher", "env", "--timeout", "30", "-s",
                                         "dist/5-3/float32", "-v", "baseline", "-v", "skip"};
  const int port = free_tcp_port();
  TemporaryDirectory folder("gradnorm-process-test");
  const EnvironmentChanges env0 = torchrun_environment(0, 2, port);
  const EnvironmentChanges env1 = torchrun_environment(1, 2, port);
  Child rank0(args, env0, folder.path(), "rank0");
  Child rank1(args, env1, folder.path(), "rank1");
  const ProcessResult r0 = rank0.wait();
  const ProcessResult r1 = rank1.wait();

  EXPECT_EQ(r0.exit_code, kExitAsExpected) << describe(args, env0, r0);
  EXPECT_TRUE(contains(r0.out, "dist/5-3/float32")) << describe(args, env0, r0);
  EXPECT_TRUE(contains(r0.out, "known finding")) << describe(args, env0, r0);
  EXPECT_EQ(r1.exit_code, kExitAsExpected) << describe(args, env1, r1);
  EXPECT_EQ(r1.out, "") << "only rank 0 reports\n" << describe(args, env1, r1);
}

TEST(EnvLauncher, MissingWorldSizeIsAnInputErrorNamingIt) {
  const std::vector<std::string> args = {"run", "--launcher", "env", "--timeout", "2", "-s",
                                         "dist/5-3/float32", "-v", "baseline"};
  EnvironmentChanges env = torchrun_environment(0, 2, free_tcp_port());
  env.set.erase("WORLD_SIZE");
  env.unset.push_back("WORLD_SIZE");
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitUsage) << describe(args, env, r);
  EXPECT_TRUE(contains(r.err, "WORLD_SIZE")) << describe(args, env, r);
  EXPECT_EQ(r.out, "") << describe(args, env, r);
}

// An input error is found before any rank starts: no process, no rendezvous folder.
void expect_usage_error(const std::vector<std::string>& args, const std::string& message) {
  const std::set<std::string> folders_before = rendezvous_folders();
  const EnvironmentChanges env = marked_environment();
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitUsage) << describe(args, env, r);
  EXPECT_TRUE(contains(r.err, message)) << "stderr lacks '" << message << "'\n"
                                        << describe(args, env, r);
  EXPECT_EQ(r.out, "") << describe(args, env, r);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
  EXPECT_TRUE(no_rendezvous_folder_left(folders_before));
}

TEST(ProcessInputErrors, ProcessesWithoutNprocNamesNproc) {
  expect_usage_error({"run", "--launcher", "processes", "-s", "dist/5-3/float32"}, "--nproc");
}

TEST(ProcessInputErrors, NprocMatchingNoSelectedScenario) {
  expect_usage_error({"run", "--launcher", "processes", "--nproc", "3", "-s", "dist/5-3/float32"},
                     "no selected scenario has world_size 3");
}

TEST(ProcessInputErrors, UnknownLauncher) {
  expect_usage_error({"run", "--launcher", "bogus", "-s", "dist/5-3/float32"}, "bogus");
}

// Where NCCL cannot run (no GPU, no driver, no toolkit at build time), --backend nccl is an
// input error saying why, under the supervisor and as a rank of another launcher alike.
TEST(ProcessInputErrors, NcclWithoutAUsableGpuSaysWhyBeforeAnyRankStarts) {
  const auto why = harness::nccl_unavailable_reason(1);
  if (!why) GTEST_SKIP() << "NCCL can run here (a GPU for ranks 0 and 1): nothing to refuse";
  expect_usage_error({"run", "--nproc", "2", "--backend", "nccl", "-s", "dist/5-3/float32"}, *why);
  const std::vector<std::string> args = {"run", "--launcher", "env", "--backend", "nccl", "-s",
                                         "dist/5-3/float32", "-v", "baseline"};
  const EnvironmentChanges env = torchrun_environment(0, 2, free_tcp_port());
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitUsage) << describe(args, env, r);
  EXPECT_TRUE(contains(r.err, "--backend nccl")) << describe(args, env, r);
}


// Python steps as rank processes: each rank embeds its own interpreter and meets the others
// through the same Gloo process group as a C++ step (docs/design.md §10).
const std::string kPythonExamples = GRADNORM_SOURCE_DIR "/examples/python/";
const std::string kPythonSteps = GRADNORM_SOURCE_DIR "/tests/python/steps/";

TEST(PythonStepProcesses, TheBaselineTranscriptionAgreesAsTwoRankProcesses) {
  const CrossCheck both = run_both_ways(
      {"--python-step", kPythonExamples + "full_finetune.py", "--name", "py/baseline",
       "--findings-of", "baseline", "-s", "dist/5-3/*", "-s", "dist/0-8/*", "-s",
       "dist/5-3-clip-active/*"},
      2);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(same_records(both.threads, both.processes));
  for (const json& record : both.processes.at("records")) {
    EXPECT_EQ(record.value("variant", ""), "py/baseline");
    // Bit-identical to the C++ baseline it transcribes, over Gloo as over threads.
    EXPECT_TRUE(record.value("bitwise_equal_baseline", false)) << row_name(record);
  }
}

// A step that wraps ctx.model in DistributedDataParallel: DDP's reducer averages the gradients
// over the rank processes' real Gloo group, and the harness's optimizer records what it left.
TEST(PythonStepProcesses, DistributedDataParallelAroundTheModelPassesOnTwoRankProcesses) {
  // accum2-ragged accumulates two micro-batches: DDP's no_sync, then one average.
  const std::vector<std::string> args = {"run", "--python-step", kPythonExamples + "ddp.py",
                                         "-s", "dist/5-3/*", "-s", "dist/5-3-clip-active/*",
                                         "-s", "dist/accum2-ragged/*", "-v", "py/ddp",
                                         "--nproc", "2"};
  const EnvironmentChanges env = marked_environment();
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitAsExpected) << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "9 rows: 9 pass, 0 fail")) << describe(args, env, r);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
}

// A model from a Python file on two rank processes: DDP wraps the user's module itself;
// baseline and the DDP step pass, skip's documented finding on [5, 3] is reproduced and the
// dropped scale pass is caught, as on ranks as threads.
TEST(PythonStepProcesses, APythonModelFileIsTrainedAndJudgedOnTwoRankProcesses) {
  const std::vector<std::string> args = {"run", "--python-step", kPythonExamples + "ddp.py",
                                         "-f", kPythonExamples + "models.toml", "-s", "pymodel/5-3",
                                         "-v", "baseline", "-v", "skip", "-v",
                                         "broken/scale-pass-dropped", "-v", "py/ddp", "--nproc", "2"};
  const EnvironmentChanges env = marked_environment();
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitAsExpected) << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "4 rows: 2 pass, 2 fail")) << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "negative controls caught 1/1")) << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "documented findings reproduced 1")) << describe(args, env, r);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
}

// FSDP2: fully_shard turns the user's module's parameters into DTensor shards; gradnorm
// gathers the gradients the optimizer consumes through them and writes the update back.
// Ragged counts in every dtype, an active clip, accumulation with AdamW.
TEST(PythonStepProcesses, FullyShardAroundAPythonModelPassesOnTwoRankProcesses) {
  const std::vector<std::string> args = {"run", "--python-step", kPythonExamples + "fsdp2.py",
                                         "-f", std::string(GRADNORM_SOURCE_DIR) + "/tests/python/models/fsdp.toml",
                                         "-v", "py/fsdp2", "--nproc", "2"};
  const EnvironmentChanges env = marked_environment();
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitAsExpected) << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "5 rows: 5 pass, 0 fail")) << describe(args, env, r);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
}

// Negative controls: without its scale pass the sharded step fails, read through the shards;
// fully_shard of a built-in model (forward in C++) is refused by name.
TEST(PythonStepProcesses, FullyShardWithoutTheScalePassFailsAndOfABuiltInModelIsRefused) {
  const std::vector<std::string> args = {"run", "--python-step", kPythonSteps + "fsdp2_unscaled.py",
                                         "-f", std::string(GRADNORM_SOURCE_DIR) + "/tests/python/models/fsdp.toml",
                                         "-s", "fsdp/5-3/float32", "-s", "fsdp/accum2-ragged/float32",
                                         "--nproc", "2"};
  EnvironmentChanges env = marked_environment();
  env.set["PYTHONPATH"] = kPythonExamples;
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, 1) << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "2 rows: 0 pass, 2 fail")) << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "gradients rel L2 error")) << describe(args, env, r);

  const std::vector<std::string> built_in = {"run", "--python-step", kPythonSteps + "shards_built_in.py",
                                             "-s", "dist/5-3/float32", "--nproc", "2"};
  const ProcessResult refused = run_cli(built_in, env);
  EXPECT_EQ(refused.exit_code, 1) << describe(built_in, env, refused);
  EXPECT_TRUE(contains(refused.out, "fully_shard needs a model whose forward is its own Python"))
      << describe(built_in, env, refused);
}

// Negative control: the same step on ranks as threads is refused by name, not run wrongly.
TEST(PythonStepProcesses, DistributedDataParallelOnThreadRanksIsRefusedByName) {
  const std::vector<std::string> args = {"run", "--python-step", kPythonExamples + "ddp.py",
                                         "-s", "dist/5-3/float32", "-v", "py/ddp"};
  const ProcessResult r = run_cli(args, {});
  EXPECT_EQ(r.exit_code, 1) << describe(args, {}, r);
  EXPECT_TRUE(contains(r.out, "DistributedDataParallel needs a real process group"))
      << describe(args, {}, r);
}

// Every collective and op a recipe may call is torch's own on rank processes.
TEST(PythonStepProcesses, EveryCollectiveAndOpIsTheRealProcessGroups) {
  const std::vector<std::string> args = {"run", "--python-step", kPythonSteps + "real_collectives.py",
                                         "-s", "dist/5-3/float32", "-s", "dist/accum2-ragged/float64",
                                         "-v", "py/real_collectives", "--nproc", "2"};
  EnvironmentChanges env = marked_environment();
  env.set["PYTHONPATH"] = kPythonExamples;
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitAsExpected) << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "2 rows: 2 pass, 0 fail")) << describe(args, env, r);
}

TEST(PythonStepProcesses, AStepThatRaisesIsRecordedWithItsFileAndLine) {
  const std::vector<std::string> args = {"run", "--python-step", kPythonSteps + "raises.py",
                                         "-s", "dist/5-3/float32", "--nproc", "2"};
  EnvironmentChanges env = marked_environment();
  env.set["PYTHONPATH"] = kPythonExamples;
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, 1) << describe(args, env, r);  // an unexpected verdict, not a fault
  EXPECT_TRUE(contains(r.out, "raised ValueError (the step rejects rank 1 (at " + kPythonSteps +
                                  "raises.py:7))"))
      << describe(args, env, r);
  EXPECT_TRUE(contains(r.out, "rank 0: raised peer-failure")) << describe(args, env, r);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
}

TEST(PythonStepProcesses, AHangingStepIsEndedWithItsRankNamed) {
  const std::vector<std::string> args = {"run", "--python-step", kPythonSteps + "hangs.py",
                                         "-s", "dist/5-3/float32", "--nproc", "2",
                                         "--timeout", kHangTimeoutSeconds};
  const std::set<std::string> folders_before = rendezvous_folders();
  EnvironmentChanges env = marked_environment();
  env.set["PYTHONPATH"] = kPythonExamples;
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitRankFailed) << describe(args, env, r);
  EXPECT_TRUE(contains(r.err, "rank 0")) << describe(args, env, r);
  EXPECT_TRUE(contains(r.err, "hang")) << describe(args, env, r);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
  EXPECT_TRUE(no_rendezvous_folder_left(folders_before));
}

TEST(PythonStepProcesses, ASyntaxErrorIsAnInputErrorBeforeAnyRankStarts) {
  expect_usage_error({"run", "--python-step", kPythonSteps + "syntax_error.py", "-s",
                      "dist/5-3/float32", "--nproc", "2"},
                     kPythonSteps + "syntax_error.py:2");
}


// A step that catches the harness's interrupt forever cannot be stopped inside its thread:
// the process ends as a supervisor would, exit 3 with the rank named, threads or processes.
TEST(PythonStepProcesses, AStepThatSwallowsTheInterruptStillEndsTheRun) {
  for (const std::vector<std::string>& launch :
       {std::vector<std::string>{}, std::vector<std::string>{"--nproc", "1"}}) {
    std::vector<std::string> args = {"run", "--python-step", kPythonSteps + "swallows.py", "-s",
                                     "single/n5/float32", "--timeout", "1"};
    args.insert(args.end(), launch.begin(), launch.end());
    const EnvironmentChanges env = marked_environment();
    const ProcessResult r = run_cli(args, env);
    EXPECT_EQ(r.exit_code, kExitRankFailed) << describe(args, env, r);
    EXPECT_TRUE(contains(r.err, "rank 0 hung")) << describe(args, env, r);
    EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
  }
}


// A rank that exits 0 before finishing (C's _exit, past every Python guard) fails the run.
TEST(PythonStepProcesses, ARankThatExitsZeroEarlyFailsTheRun) {
  const std::vector<std::string> args = {"run", "--python-step", kPythonSteps + "c_exit.py", "-s",
                                         "dist/5-3/float32", "--nproc", "2", "--timeout", "30"};
  EnvironmentChanges env = marked_environment();
  env.set["PYTHONPATH"] = kPythonExamples;
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, kExitRankFailed) << describe(args, env, r);
  EXPECT_TRUE(contains(r.err, "rank 1 exited with status 0: exited before finishing its run"))
      << describe(args, env, r);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
}

}  // namespace
}  // namespace gradnorm

namespace gradnorm {
namespace {

// The supervisor ends its ranks and removes the rendezvous folder on SIGHUP (a closed
// terminal) as on SIGINT and SIGTERM, then exits 128 + the signal. SIGHUP used to kill the
// supervisor outright, leaving the folder behind.
TEST(ProcessFaults, ASignalToTheSupervisorEndsEveryRankAndExitsWithIt) {
  for (int signal : {SIGHUP, SIGINT, SIGTERM}) {
    const std::vector<std::string> args = {"run", "-s", "dist/5-3/float32", "-v", "baseline", "--nproc", "2",
                                           "--inject-fault", "1:hang", "--timeout", "120"};
    const std::set<std::string> folders_before = rendezvous_folders();
    const EnvironmentChanges env = marked_environment();
    TemporaryDirectory folder("gradnorm-signal-test");
    Child child(args, env, folder.path(), "gradnorm");
    // Until both ranks run: the supervisor and its two children carry the marker.
    const std::string marker = std::string(kMarkerKey) + "=" + env.set.at(kMarkerKey);
    for (int attempt = 0; attempt < 600 && processes_with_environment_entry(marker).size() < 3; ++attempt) {
      std::this_thread::sleep_for(50ms);
    }
    std::this_thread::sleep_for(500ms);  // past the ranks' start, into the hang
    ASSERT_EQ(kill(child.pid(), signal), 0);
    const ProcessResult r = child.wait();
    EXPECT_EQ(r.exit_code, 128 + signal) << "signal " << signal << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, "interrupted by signal " + std::to_string(signal))) << r.err;
    EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey))) << "signal " << signal;
    EXPECT_TRUE(no_rendezvous_folder_left(folders_before)) << "signal " << signal;
  }
}

// Rank 0 writes the run's reports. When that fails (here the step itself removes the report
// folder on rank 0, after the supervisor checked it), the run is exit 74 (a report not
// written after the run; it was 2, "before anything runs") and rank 0's message reaches the
// user: it used to die with the rank's log, leaving an empty stderr.
TEST(ProcessFaults, RankZeroFailingToWriteItsReportSaysWhy) {
  TemporaryDirectory folder("gradnorm-rank0-report");
  const std::filesystem::path reports = folder.path() / "reports";
  std::filesystem::create_directory(reports);
  const std::string step = (folder.path() / "removes_reports.py").string();
  std::ofstream(step) << "import os, runpy, shutil\n"
                         "_baseline = runpy.run_path(" << std::quoted(kPythonExamples + "full_finetune.py") << ")\n"
                         "def step(ctx):\n"
                         "    _baseline['step'](ctx)\n"
                         "    if os.environ.get('RANK') == '0':\n"
                         "        shutil.rmtree(" << std::quoted(reports.string()) << ", ignore_errors=True)\n";
  const std::vector<std::string> args = {"run", "--python-step", step, "--findings-of", "baseline",
                                         "-s", "dist/5-3/float32", "--nproc", "2",
                                         "--json", (reports / "out.json").string()};
  const std::set<std::string> folders_before = rendezvous_folders();
  const EnvironmentChanges env = marked_environment();
  const ProcessResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, 74) << describe(args, env, r);
  EXPECT_TRUE(contains(r.err, "cannot write '")) << describe(args, env, r);
  EXPECT_TRUE(no_process_carries(env.set.at(kMarkerKey)));
  EXPECT_TRUE(no_rendezvous_folder_left(folders_before));
}

}  // namespace
}  // namespace gradnorm
