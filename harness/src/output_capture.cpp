#include "gradnorm/harness/output_capture.hpp"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace gradnorm::harness {

namespace {

std::atomic<OutputMode> g_mode{OutputMode::pass_through};

// Whole lines, as a terminal shows them: a last line without its newline gets one, and a
// line a progress bar redrew with carriage returns keeps what follows the last one.
std::string whole_lines(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 1);
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    while (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (const std::size_t redrawn = line.rfind('\r'); redrawn != std::string_view::npos) {
      line.remove_prefix(redrawn + 1);
    }
    out.append(line);
    out += '\n';
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return out;
}

}  // namespace

// A LibTorch warning raised on a rank's thread (TORCH_WARN with no Python frame converting
// it, as DDP's reducer warns from its C++ hooks): held as the rank's, in the base handler's
// words without its timestamp.
class HeldWarnings : public c10::WarningHandler {
 public:
  explicit HeldWarnings(RankOutput& owner) : owner_(owner) {}
  void process(const c10::Warning& warning) override {
    const c10::SourceLocation& where = warning.source_location();
    // The file as LibTorch's sources name it, not the path of the machine that built it.
    std::string_view file = where.file;
    for (std::string_view root : {"torch/csrc/", "aten/src/", "c10/"}) {
      if (const std::size_t at = file.find(root); at != std::string_view::npos) {
        file.remove_prefix(at);
        break;
      }
    }
    owner_.append(fmt::format("Warning: {} ({}:{})\n", warning.msg(), file, where.line));
  }

 private:
  RankOutput& owner_;
};

struct RankOutput::State {
  std::string key;
  int rank = 0;
  std::mutex mutex;
  std::string text;
  RankOutput::State* outer = nullptr;  // this thread's RankOutput before this one
  std::unique_ptr<HeldWarnings> warnings;
  std::optional<c10::WarningUtils::WarningHandlerGuard> guard;
};

namespace {

thread_local RankOutput::State* t_current = nullptr;
std::mutex g_registry_mutex;
std::vector<RankOutput::State*> g_active;  // every live RankOutput's, in construction order
std::string g_run_text;                    // what no rank owns

}  // namespace

void set_output_mode(OutputMode mode) { g_mode = mode; }
OutputMode output_mode() { return g_mode; }

RankOutput::RankOutput(std::string key, int rank) : state_(new State) {
  state_->key = std::move(key);
  state_->rank = rank;
  state_->outer = t_current;
  if (g_mode == OutputMode::capture) {
    state_->warnings = std::make_unique<HeldWarnings>(*this);
    state_->guard.emplace(state_->warnings.get());
  }
  t_current = state_;
  std::lock_guard lock(g_registry_mutex);
  g_active.push_back(state_);
}

RankOutput::~RankOutput() {
  {
    std::lock_guard lock(g_registry_mutex);
    g_active.erase(std::remove(g_active.begin(), g_active.end(), state_), g_active.end());
  }
  t_current = state_->outer;
  state_->guard.reset();  // the thread's handler before this rank's, restored
  delete state_;
}

void RankOutput::append(std::string_view text) {
  std::lock_guard lock(state_->mutex);
  state_->text.append(text);
}

std::string RankOutput::take() {
  std::lock_guard lock(state_->mutex);
  return whole_lines(std::exchange(state_->text, {}));
}

bool hold_output(std::string_view text) {
  if (g_mode != OutputMode::capture) return false;
  if (RankOutput::State* mine = t_current) {
    std::lock_guard lock(mine->mutex);
    mine->text.append(text);
    return true;
  }
  std::lock_guard lock(g_registry_mutex);
  RankOutput::State* owner = nullptr;
  for (RankOutput::State* s : g_active) {
    if (owner != nullptr && s->key != owner->key) {
      owner = nullptr;  // two runs at once: nobody's in particular
      break;
    }
    if (owner == nullptr || s->rank < owner->rank) owner = s;
  }
  if (owner != nullptr) {
    std::lock_guard text_lock(owner->mutex);
    owner->text.append(text);
  } else {
    g_run_text.append(text);
  }
  return true;
}

std::string take_run_output() {
  std::lock_guard lock(g_registry_mutex);
  return whole_lines(std::exchange(g_run_text, {}));
}

std::string prefix_lines(std::string_view text, std::string_view prefix) {
  std::string out;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    out += fmt::format("{}{}\n", prefix, line);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return out;
}

}  // namespace gradnorm::harness
