#include "gradnorm/harness/descendants.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace gradnorm::harness {
namespace {

// What one scan of /proc found. Static: end_descendants runs in signal handlers, where
// nothing may allocate.
constexpr int kMaxProcesses = 1 << 16;
struct Process {
  pid_t pid;
  pid_t parent;
  bool alive;  // not a zombie
  char name[16];
};
Process g_found[kMaxProcesses];
int g_count = 0;
bool g_descendant[kMaxProcesses];

// The names of what was ended (distinct, with counts), for ended_descendants_named.
constexpr int kMaxNames = 8;
struct Named {
  char name[16];
  int count;
};
Named g_names[kMaxNames];
int g_name_count = 0;
int g_other = 0;  // ended processes whose names did not fit
constexpr int kMaxEnded = 4096;
pid_t g_ended[kMaxEnded];  // each process counted once, whatever round ended it
int g_ended_count = 0;

bool parse_pid(const char* text, pid_t* out) {
  if (*text == '\0') return false;
  long value = 0;
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') return false;
    value = value * 10 + (*c - '0');
  }
  *out = static_cast<pid_t>(value);
  return true;
}

// /proc/PID/stat: "PID (NAME) STATE PPID ...": NAME may hold spaces and parentheses, so the
// fields after it start at the last ')'.
bool read_stat(pid_t pid, Process* out) {
  char path[32] = "/proc/";
  char digits[16];
  int n = 0;
  for (long v = pid; v > 0 && n < 15; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  int at = 6;
  while (n > 0) path[at++] = digits[--n];
  std::memcpy(path + at, "/stat", 6);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[512];
  const ssize_t length = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (length <= 0) return false;
  text[length] = '\0';
  const char* open = std::strchr(text, '(');
  const char* close = std::strrchr(text, ')');
  if (open == nullptr || close == nullptr || close < open || close[1] != ' ' || close[2] == '\0') return false;
  const std::size_t name_length = std::min<std::size_t>(static_cast<std::size_t>(close - open - 1), 15);
  std::memcpy(out->name, open + 1, name_length);
  out->name[name_length] = '\0';
  const char state = close[2];
  long parent = 0;
  for (const char* c = close + 4; *c >= '0' && *c <= '9'; ++c) parent = parent * 10 + (*c - '0');
  out->pid = pid;
  out->parent = static_cast<pid_t>(parent);
  out->alive = state != 'Z' && state != 'X';
  return true;
}

void scan() {
  g_count = 0;
  const int fd = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buffer[16384];
  for (;;) {
    const long got = ::syscall(SYS_getdents64, fd, buffer, sizeof buffer);
    if (got <= 0) break;
    for (long offset = 0; offset < got;) {
      // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
      unsigned short record = 0;
      std::memcpy(&record, buffer + offset + 16, sizeof record);
      const char* name = buffer + offset + 19;
      pid_t pid = 0;
      if (g_count < kMaxProcesses && parse_pid(name, &pid) && read_stat(pid, &g_found[g_count])) ++g_count;
      offset += record;
    }
  }
  ::close(fd);
}

// Marks this process's descendants among what scan() found.
int mark_descendants() {
  const pid_t self = ::getpid();
  for (int i = 0; i < g_count; ++i) g_descendant[i] = g_found[i].parent == self && g_found[i].pid != self;
  for (bool grew = true; grew;) {
    grew = false;
    for (int i = 0; i < g_count; ++i) {
      if (g_descendant[i]) continue;
      for (int j = 0; j < g_count; ++j) {
        if (g_descendant[j] && g_found[j].pid == g_found[i].parent) {
          g_descendant[i] = grew = true;
          break;
        }
      }
    }
  }
  int alive = 0;
  for (int i = 0; i < g_count; ++i) alive += g_descendant[i] && g_found[i].alive;
  return alive;
}

void remember(const Process& p) {
  for (int i = 0; i < g_ended_count; ++i) {
    if (g_ended[i] == p.pid) return;
  }
  if (g_ended_count < kMaxEnded) g_ended[g_ended_count++] = p.pid;
  for (int i = 0; i < g_name_count; ++i) {
    if (std::strcmp(g_names[i].name, p.name) == 0) {
      ++g_names[i].count;
      return;
    }
  }
  if (g_name_count == kMaxNames) {
    ++g_other;
    return;
  }
  std::memcpy(g_names[g_name_count].name, p.name, sizeof p.name);
  g_names[g_name_count++].count = 1;
}

}  // namespace

void adopt_orphans() { (void)::prctl(PR_SET_CHILD_SUBREAPER, 1L, 0L, 0L, 0L); }

int end_descendants() {
  // Rounds until a scan finds none alive: a process may fork while its parent is ended, and
  // what it orphans comes to this process. A process in uninterruptible sleep dies when it
  // leaves it: 2 s of rounds at most.
  for (int round = 0; round < 2000; ++round) {
    scan();
    if (mark_descendants() == 0) break;
    for (int i = 0; i < g_count; ++i) {
      if (!g_descendant[i] || !g_found[i].alive) continue;
      remember(g_found[i]);
      ::kill(g_found[i].pid, SIGKILL);
    }
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    const struct timespec pause {0, 1'000'000};
    ::nanosleep(&pause, nullptr);
  }
  // What this process was left as parent of (the ended, and orphans that had exited).
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  return g_ended_count;
}

std::string ended_descendants_named() {
  std::vector<std::pair<int, std::string>> named;
  for (int i = 0; i < g_name_count; ++i) named.emplace_back(g_names[i].count, g_names[i].name);
  std::stable_sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string text;
  for (const auto& [count, name] : named) {
    if (!text.empty()) text += ", ";
    text += name;
    if (count > 1) text += " x" + std::to_string(count);
  }
  if (g_other > 0) text += (text.empty() ? "" : ", ") + std::to_string(g_other) + " more";
  return text;
}

}  // namespace gradnorm::harness
