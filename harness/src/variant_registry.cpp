#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <deque>
#include <mutex>
#include <optional>

#include "../recipes/builtin.hpp"
#include "gradnorm/harness/step.hpp"
#include "gradnorm/harness/variant.hpp"

namespace gradnorm::harness {
namespace {

struct Registry {
  // Reentrant: registering the built-ins happens inside the first access.
  std::recursive_mutex mutex;
  // A deque, so a reference from find_variant survives later registrations.
  std::deque<VariantSpec> specs;
  bool builtins_loaded = false;
  std::size_t builtins = 0;  // the first `builtins` specs are gradnorm's own
  std::optional<std::size_t> marked;  // mark_registered_variants
};

Registry& registry() {
  static Registry r;
  std::lock_guard lock(r.mutex);
  if (!r.builtins_loaded) {
    r.builtins_loaded = true;
    recipes::register_builtin_variants();
    r.builtins = r.specs.size();
  }
  return r;
}

const VariantSpec* lookup(const Registry& r, std::string_view name) {
  for (const VariantSpec& v : r.specs) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

}  // namespace

void mark_registered_variants() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.marked = r.specs.size();
}

void forget_declared_variants() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.specs.resize(r.marked ? *r.marked : r.builtins);
}

void register_variant(VariantSpec spec) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto refuse = [&](const std::string& why) {
    throw scenarios::InvalidInput(fmt::format("cannot register variant '{}': {}", spec.name, why));
  };
  if (spec.name.empty()) refuse("its name is empty");
  if (const auto control = std::find_if(spec.name.begin(), spec.name.end(),
                                        [](char c) { return std::iscntrl(static_cast<unsigned char>(c)); });
      control != spec.name.end()) {
    // Every report is lines (the table, JUnit names, --digests rows): a newline in a name
    // would split its row. The message shows the name with the character escaped.
    std::string shown;
    for (char c : spec.name) {
      shown += std::iscntrl(static_cast<unsigned char>(c))
                   ? fmt::format("\\x{:02x}", static_cast<unsigned char>(c)) : std::string(1, c);
    }
    throw scenarios::InvalidInput(fmt::format(
        "cannot register variant '{}': its name holds a control character (byte 0x{:02x}); a "
        "name is one printable line",
        shown, static_cast<unsigned char>(*control)));
  }
  if (lookup(r, spec.name)) refuse("a variant of that name is already registered");
  if (!spec.make) refuse("it has no step factory (make)");
  if (spec.reference.empty()) spec.reference = spec.name;
  if (spec.reference != spec.name) {
    const VariantSpec* reference = lookup(r, spec.reference);
    if (reference == nullptr) {
      refuse(fmt::format("its reference '{}' is not registered (register it first)", spec.reference));
    }
    if (reference->role == Role::negative_control) {  // it was accepted, and judged nothing
      refuse(fmt::format("its reference '{}' is a negative control, broken on purpose: a reference's "
                         "error behaviour must be right (baseline, or a variant of role reference)",
                         spec.reference));
    }
  }
  if (spec.role == Role::negative_control && !spec.bug_visible) {
    refuse("a negative control needs bug_visible: where its bug can show");
  }
  r.specs.push_back(std::move(spec));
}

std::vector<VariantSpec> variants() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return {r.specs.begin(), r.specs.end()};
}

const VariantSpec& find_variant(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (const VariantSpec* found = lookup(r, name)) return *found;
  std::vector<std::string_view> names;
  for (const VariantSpec& v : r.specs) names.push_back(v.name);
  throw scenarios::InvalidInput(
      fmt::format("unknown variant '{}': expected one of {}", name, fmt::join(names, ", ")));
}

std::vector<VariantSpec> select_variants(std::string_view pattern) {
  const std::string text(pattern);
  std::vector<VariantSpec> out;
  for (const VariantSpec& v : variants()) {
    if (v.name == text || fnmatch(text.c_str(), v.name.c_str(), 0) == 0) out.push_back(v);
  }
  if (out.empty()) (void)find_variant(pattern);  // throws with the list of names
  return out;
}

std::optional<std::string> not_applicable(const VariantSpec& v, const scenarios::Scenario& s) {
  if (scenarios::model_from_file(s.model) && v.trains != TrainedModel::scenario_model) {
    return std::string("LoRA adapters and fake quantisation need the built-in models' linears; "
                       "a model from a file is trained as it is");
  }
  return v.cannot_run ? v.cannot_run(s) : std::nullopt;
}

ModelConfig model_config_for(const VariantSpec& variant, const scenarios::Scenario& scenario) {
  if (scenario.model == scenarios::ModelKind::token_probe) {
    // The probe has no linears: LoRA adapters and fake quantisation do not apply to it.
    return ModelConfig{scenarios::ModelKind::token_probe, false, false};
  }
  const bool lora_model = scenario.model == scenarios::ModelKind::lora;
  const scenarios::ModelKind base =
      lora_model ? scenarios::ModelKind::causal_lm : scenario.model;
  switch (variant.trains) {
    case TrainedModel::scenario_model: return ModelConfig{base, lora_model, false};
    case TrainedModel::lora_adapters: return ModelConfig{base, true, false};
    case TrainedModel::fake_quantized: return ModelConfig{base, lora_model, true};
    case TrainedModel::lora_adapters_fake_quantized: return ModelConfig{base, true, true};
  }
  TORCH_INTERNAL_ASSERT(false, "harness bug: unhandled trained model");
}

std::string to_string(const Citation& c) {
  const std::string lines = c.first_line == c.last_line
                                ? fmt::format("{}", c.first_line)
                                : fmt::format("{}-{}", c.first_line, c.last_line);
  return fmt::format("torchtune@{} {}:{} ({})", kTorchtuneCommit, c.file, lines, c.what);
}

std::string_view to_string(Role role) {
  switch (role) {
    case Role::reference: return "reference";
    case Role::candidate: return "candidate";
    case Role::negative_control: return "negative-control";
  }
  return "<unknown>";
}

std::optional<Finding> documented_finding(const VariantSpec& variant,
                                          const scenarios::Scenario& scenario,
                                          const ContractFacts& facts) {
  for (const scenarios::ExpectedVerdict& e : scenario.expected_verdicts) {
    if (fnmatch(e.variant_pattern.c_str(), variant.name.c_str(), 0) == 0) {
      return Finding{e.verdict, e.reason, e.checks};
    }
  }
  if (variant.findings) return variant.findings(scenario, facts);
  return std::nullopt;
}

}  // namespace gradnorm::harness
