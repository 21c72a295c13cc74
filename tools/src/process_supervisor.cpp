#include "process_supervisor.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

extern char** environ;

namespace gradnorm::tools {
namespace {

std::atomic<int> g_signal{0};  // the signal that asked the run to stop; 0 for none
void on_signal(int signal) { g_signal = signal; }

std::string read_first_line(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// A warning LibTorch's C++ logging wrote straight to the rank's standard error ("[W1207
// 12:54:16.89 socket.cpp:...]"), with the "[rank0]:" c10d puts before it once a process group
// exists: a thread of LibTorch's own, which harness/output_capture.hpp does not see.
bool libtorch_warning(const std::string& line) {
  std::size_t at = 0;
  if (line.rfind("[rank", 0) == 0) {
    at = line.find("]:");
    if (at == std::string::npos) return false;
    at += 2;
  }
  return line.compare(at, 2, "[W") == 0 && line.size() > at + 2 &&
         (line[at + 2] == ' ' || std::isdigit(static_cast<unsigned char>(line[at + 2])) != 0);
}

// The lines of a rank's log past LibTorch's warnings.
std::string log_text(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::string out;
  for (std::string line; std::getline(file, line);) {
    if (libtorch_warning(line)) continue;
    out += out.empty() ? line : "\n" + line;
  }
  return out;
}

// The last `count` lines of a rank's log; where Python's faulthandler reported a fatal signal
// (user code that crashed the process: it ends with the list of extension modules), its
// first line and the `count` innermost frames of the crashed thread instead.
std::string last_lines(const std::filesystem::path& path, std::size_t count) {
  std::ifstream file(path);
  std::vector<std::string> lines, fatal;
  bool in_fatal_stack = false;
  for (std::string line; std::getline(file, line);) {
    if (libtorch_warning(line)) continue;
    if (line.rfind("Fatal Python error: ", 0) == 0 && fatal.empty()) {
      fatal.push_back(line);
    } else if (!fatal.empty() && line.find("(most recent call first):") != std::string::npos) {
      in_fatal_stack = fatal.size() == 1;
    } else if (in_fatal_stack && line.rfind("  File ", 0) == 0 && fatal.size() <= count) {
      fatal.push_back(line.substr(2));
    } else {
      in_fatal_stack = in_fatal_stack && line.rfind("  ", 0) == 0;
    }
    lines.push_back(line);
  }
  if (!fatal.empty()) return fmt::format("{}", fmt::join(fatal, "\n    "));
  if (lines.size() > count) lines.erase(lines.begin(), lines.end() - static_cast<long>(count));
  return fmt::format("{}", fmt::join(lines, "\n    "));
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "stopped";
}

}  // namespace

void write_rank_status(int rank, const std::string& cause) {
  const char* dir = std::getenv("GRADNORM_STATUS_DIR");
  if (dir == nullptr || *dir == '\0') return;
  std::ofstream(std::filesystem::path(dir) / fmt::format("status.{}", rank)) << cause << "\n";
}

void write_rank_done(int rank) {
  const char* dir = std::getenv("GRADNORM_STATUS_DIR");
  if (dir == nullptr || *dir == '\0') return;
  std::ofstream(std::filesystem::path(dir) / fmt::format("done.{}", rank)) << "done\n";
}

std::vector<std::string> other_threads() {
  std::vector<std::string> names;
  const std::string self = std::to_string(gettid());
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
    const std::string id = task.path().filename().string();
    if (id == self) continue;
    std::string name = read_first_line(task.path() / "comm");
    names.push_back(fmt::format("{} ({})", name.empty() ? "?" : name, id));
  }
  return names;
}

long monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1'000'000'000L + now.tv_nsec;
}

void note_rank_ready(int rank) {
  const char* path = std::getenv("GRADNORM_BENCH_READY");
  const char* started = std::getenv("GRADNORM_RANK_STARTED_NS");
  if (path == nullptr || started == nullptr) return;
  const double ms = static_cast<double>(monotonic_ns() - std::atol(started)) / 1e6;
  // Pages this process holds alone: those it wrote since the fork (copied from its parent)
  // and those it made; an exec'd rank holds everything alone.
  long private_kib = 0;
  std::ifstream smaps("/proc/self/smaps_rollup");
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind("Private_Clean:", 0) == 0 || line.rfind("Private_Dirty:", 0) == 0) {
      private_kib += std::atol(line.c_str() + line.find(':') + 1);
    }
  }
  if (FILE* out = std::fopen(path, "a")) {
    std::fprintf(out, "%d %.3f %ld\n", rank, ms, private_kib);
    std::fclose(out);
  }
}

namespace {
std::vector<std::string>& self_command_words() {
  static std::vector<std::string> words;
  return words;
}
}  // namespace

const std::vector<std::string>& self_command() {
  std::vector<std::string>& words = self_command_words();
  if (words.empty()) words.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
  return words;
}

void set_self_command(std::vector<std::string> words) { self_command_words() = std::move(words); }

int supervise(const SupervisorOptions& options) {
  char pattern[] = "/tmp/gradnorm-ranks-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    fmt::print(stderr, "gradnorm: cannot create a rendezvous folder under /tmp: {}\n", std::strerror(errno));
    return kExitRankFailed;
  }
  const std::filesystem::path folder = pattern;
  // Everything a child needs is built before fork: after it, only exec-safe calls.
  std::vector<std::string> base_env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string key = text.substr(0, text.find('='));
    // What another launcher (torchrun, Slurm) told this process is not the ranks' to read.
    if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" || key == "MASTER_ADDR" ||
        key == "MASTER_PORT" || key == "GRADNORM_STORE" || key == "GRADNORM_STATUS_DIR" ||
        key == "LOCAL_WORLD_SIZE" || key == "GROUP_RANK" || key.rfind("TORCHELASTIC_", 0) == 0) {
      continue;
    }
    base_env.push_back(text);
  }
  std::vector<std::string> args = self_command();
  args.insert(args.end(), options.rank_arguments.begin(), options.rank_arguments.end());
  // A warm rank runs the command line from the program's own name on ("gradnorm" after
  // "python -m", or the executable itself).
  const std::size_t program_words = self_command().size() - 1;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  struct sigaction action {};
  action.sa_handler = on_signal;
  // A closed terminal (SIGHUP) ends the run as INT and TERM do: ranks stopped, folder gone.
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);

  // Warm ranks fork this process as it is: only where no other thread runs (a thread's locks
  // and pools would be copied held and dead into every rank).
  bool warm = static_cast<bool>(options.warm);
  if (warm) {
    if (const std::vector<std::string> others = other_threads(); !others.empty()) {
      const std::vector<std::string> named = options.named_threads();
      fmt::print(stderr,
                 "gradnorm: rank processes start by exec, not warm: this process runs {} "
                 "thread{} beside its own: {}{}\n",
                 others.size(), others.size() == 1 ? "" : "s", fmt::join(others, ", "),
                 named.empty() ? "" : fmt::format(" (Python threads: {})", fmt::join(named, ", ")));
      warm = false;
    }
  }
  std::fflush(nullptr);  // nothing buffered is copied into a warm rank to be written twice

  const pid_t supervisor = getpid();
  const bool rank0_prints = options.rank0_prints;
  std::vector<pid_t> children;
  std::vector<std::vector<std::string>> envs(static_cast<std::size_t>(options.processes));
  pid_t group = 0;
  for (int rank = 0; rank < options.processes; ++rank) {
    std::vector<std::string>& env = envs[static_cast<std::size_t>(rank)];
    env = base_env;
    env.push_back(fmt::format("RANK={}", rank));
    env.push_back(fmt::format("LOCAL_RANK={}", rank));
    env.push_back(fmt::format("WORLD_SIZE={}", options.processes));
    env.push_back(fmt::format("GRADNORM_STORE=file:{}", (folder / "store").string()));
    env.push_back(fmt::format("GRADNORM_STATUS_DIR={}", folder.string()));
    const std::string log = (folder / fmt::format("rank{}.log", rank)).string();

    if (warm) options.before_fork();
    if (std::getenv("GRADNORM_BENCH_READY") != nullptr) {
      // gradnorm bench --ranks: when this rank was forked (CLOCK_MONOTONIC), to time its start.
      env.push_back(fmt::format("GRADNORM_RANK_STARTED_NS={}", monotonic_ns()));
    }
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t child = fork();
    if (child == 0) {
      setpgid(0, group);  // the first child founds the group, the others join it
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != supervisor) _exit(127);
      const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (err >= 0) dup2(err, STDERR_FILENO);
      if (rank != 0 || !rank0_prints) {
        const int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, STDOUT_FILENO);
      }
      if (warm) {
        // The only thread of a copy of this process: it takes its rank's variables and
        // runs the rank's command line, as the exec'd program would.
        for (int signal : {SIGINT, SIGTERM, SIGHUP}) std::signal(signal, SIG_DFL);
        clearenv();
        for (char* entry : envp) {
          if (entry != nullptr) putenv(entry);
        }
        options.after_fork_child(env);  // the interpreter's os.environ too
        int code = 70;
        try {
          code = options.warm(static_cast<int>(argv.size() - 1 - program_words), argv.data() + program_words);
        } catch (...) {
        }
        std::fflush(nullptr);
        _exit(code);
      }
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    if (warm) options.after_fork_parent();
    if (child < 0) {
      fmt::print(stderr, "gradnorm: fork failed for rank {}: {}\n", rank, std::strerror(errno));
      break;
    }
    setpgid(child, group);
    if (group == 0) group = child;
    children.push_back(child);
  }

  // Watch: the first rank to fail fails the run; a safety deadline catches a run where every
  // rank hangs outside a collective.
  const auto deadline = std::chrono::steady_clock::now() + options.timeout * 10 + std::chrono::seconds(30);
  std::vector<std::optional<int>> status(children.size());
  std::optional<std::string> fault;
  if (children.size() != static_cast<std::size_t>(options.processes)) fault = "could not start every rank";
  std::size_t finished = 0;
  auto reap = [&](std::size_t rank, bool block) {
    if (status[rank]) return false;
    int raw = 0;
    if (waitpid(children[rank], &raw, block ? 0 : WNOHANG) != children[rank]) return false;
    status[rank] = raw;
    ++finished;
    return true;
  };
  // A rank that exits 0 (or rank 0 with 1, unexpected verdicts) must have said it finished:
  // code that ends a rank early with exit(0) must not read as a complete run.
  auto finished_its_run = [&](std::size_t rank) {
    return std::filesystem::exists(folder / fmt::format("done.{}", rank));
  };
  auto clean = [&](std::size_t rank) {
    const int raw = *status[rank];
    if (!WIFEXITED(raw)) return false;
    const int code = WEXITSTATUS(raw);
    if (code == 0 || (rank == 0 && code == 1)) return finished_its_run(rank);
    return rank == 0 && (code == 2 || code == 74);  // an input error, a report not written
  };
  auto cause_of = [&](std::size_t rank) {
    std::string cause = read_first_line(folder / fmt::format("status.{}", rank));
    if (cause.empty() && WIFEXITED(*status[rank]) && WEXITSTATUS(*status[rank]) <= 1 &&
        !finished_its_run(rank)) {
      return std::string("exited before finishing its run, with no message");
    }
    return cause.empty() ? std::string("no message (the process vanished)") : cause;
  };
  // A rank that failed inside a collective is usually a victim; the culprit threw, vanished
  // or never arrived.
  auto victim = [](const std::string& cause) { return cause.find(" failed: ") != std::string::npos; };
  std::optional<std::size_t> failed_rank;
  const auto watch_start = std::chrono::steady_clock::now();
  while (!failed_rank && !fault && finished < children.size()) {
    for (std::size_t rank = 0; rank < children.size(); ++rank) {
      if (reap(rank, false) && !clean(rank)) {
        failed_rank = rank;
        break;
      }
    }
    if (!failed_rank && std::chrono::steady_clock::now() > deadline) {
      fault = fmt::format("the run did not finish within {} s",
                          std::chrono::duration_cast<std::chrono::seconds>(
                              options.timeout * 10 + std::chrono::seconds(30)).count());
    }
    if (!failed_rank && !fault && g_signal != 0) {
      fault = fmt::format("interrupted by signal {} ({})", g_signal.load(), strsignal(g_signal));
    }
    // Every millisecond for the first second (a fuzz case's ranks live about 100 ms, and a
    // 5 ms poll cost it 5%), every 5 ms after.
    if (!failed_rank && !fault) {
      const bool young = std::chrono::steady_clock::now() - watch_start < std::chrono::seconds(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(young ? 1 : 5));
    }
  }
  if (failed_rank) {
    // Let the others report for a moment, then name the culprit rather than a victim.
    const auto grace = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (finished < children.size() && std::chrono::steady_clock::now() < grace) {
      for (std::size_t rank = 0; rank < children.size(); ++rank) reap(rank, false);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::size_t culprit = *failed_rank;
    for (std::size_t rank = 0; rank < children.size(); ++rank) {
      if (status[rank] && !clean(rank) && !victim(cause_of(rank))) {
        culprit = rank;
        break;
      }
    }
    fault = fmt::format("rank {} {}: {}", culprit, describe_status(*status[culprit]), cause_of(culprit));
    std::vector<std::string> running;
    for (std::size_t other = 0; other < children.size(); ++other) {
      if (!status[other]) running.push_back(std::to_string(other));
    }
    if (victim(cause_of(culprit)) && !running.empty()) {
      *fault += fmt::format("; rank {} never reached the collective (hang)", fmt::join(running, ", "));
    }
    const std::string tail = last_lines(folder / fmt::format("rank{}.log", culprit), 3);
    if (!tail.empty()) *fault += fmt::format("\n  rank {} said:\n    {}", culprit, tail);
  }
  if (fault && group > 0) kill(-group, SIGKILL);
  for (std::size_t rank = 0; rank < children.size(); ++rank) reap(rank, true);
  // Rank 0 reports for the run; what it said on stderr (an input error found only there, a
  // report it could not write) is the run's to say, before its log goes with the folder.
  const std::string rank0_said =
      fault ? std::string() : log_text(folder / "rank0.log");
  std::error_code ignored;
  std::filesystem::remove_all(folder, ignored);
  auto say = [&options](const std::string& text) {
    if (options.said != nullptr) {
      *options.said = text;
    } else {
      fmt::print(stderr, "{}\n", text);
    }
  };
  if (fault) {
    say(fmt::format("gradnorm: run aborted: {}", *fault));
    // As a shell reports a command a signal ended: 128 + the signal.
    return g_signal != 0 ? 128 + g_signal : kExitRankFailed;
  }
  if (!rank0_said.empty()) say(rank0_said);
  return WEXITSTATUS(*status[0]);
}

}  // namespace gradnorm::tools
