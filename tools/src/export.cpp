// `gradnorm export`: oracle vectors for Python test suites (docs/design.md §10). Per
// scenario, one file that torch.load reads: the scenario, every rank's batches, the initial
// parameters, the logits and loss of the initial model on every micro-batch (so a Python
// transcription of the model can check itself first), the harness's tolerance, and the
// float64 oracle's gradients, logged loss, norm and parameters after every step.
#include "export.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fmt/format.h>

#include <sys/stat.h>

#include <filesystem>
#include <map>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/oracles/tolerance.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/files.hpp"

namespace gradnorm::tools {
namespace {

using Dict = c10::impl::GenericDict;
using List = c10::List<c10::IValue>;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

c10::IValue named(const std::vector<harness::NamedTensor>& tensors) {
  Dict out = new_dict();
  for (const harness::NamedTensor& t : tensors) out.insert(t.name, t.value.detach().contiguous());
  return out;
}

c10::IValue optional_number(const std::optional<double>& value) {
  return value ? c10::IValue(*value) : c10::IValue();
}

Dict scenario_fields(const scenarios::Scenario& s) {
  Dict d = new_dict();
  d.insert("name", s.name);
  d.insert("describe", scenarios::describe(s));
  d.insert("world_size", s.world_size);
  d.insert("dp_replicate", s.dp_replicate);
  d.insert("tp", s.tp);
  d.insert("cp", s.cp);
  d.insert("accumulation_steps", s.accumulation_steps);
  d.insert("steps", s.steps);
  d.insert("micro_batch_size", s.micro_batch_size);
  d.insert("sequence_length", s.sequence_length);
  d.insert("vocab_size", s.vocab_size);
  d.insert("hidden_size", s.hidden_size);
  d.insert("loss_chunks", s.loss_chunks);
  d.insert("dtype", std::string(to_string(s.dtype)));
  d.insert("model", std::string(to_string(s.model)));
  d.insert("model_file", s.model_file);
  d.insert("model_function", s.model_function);
  d.insert("loss", std::string(to_string(s.loss)));
  d.insert("optimizer", std::string(to_string(s.optimizer)));
  d.insert("learning_rate", s.learning_rate);
  d.insert("momentum", s.momentum);
  d.insert("weight_decay", s.weight_decay);
  d.insert("clip_max_norm", optional_number(s.clip_max_norm));
  d.insert("rank_average", std::string(to_string(s.rank_average)));
  d.insert("optimizer_in_backward", s.optimizer_in_backward);
  d.insert("seed", static_cast<std::int64_t>(s.seed));
  return d;
}

// batches[step][rank][micro] = {tokens, labels, logits, loss}: what the initial model makes
// of each micro-batch (logits and the scenario loss's token mean).
List batches_of(const scenarios::Scenario& s, const harness::Model& model, const harness::Loss& loss) {
  const harness::BatchSource source = harness::scenario_batches(s);
  at::NoGradGuard no_grad;
  List steps(c10::AnyType::get());
  for (int step = 0; step < s.steps; ++step) {
    List ranks(c10::AnyType::get());
    for (int rank = 0; rank < s.world_size; ++rank) {
      List micros(c10::AnyType::get());
      for (int micro = 0; micro < s.accumulation_steps; ++micro) {
        const harness::MicroBatch batch = source(rank, step, micro);
        const at::Tensor logits = model.logits(batch);
        Dict d = new_dict();
        d.insert("tokens", batch.inputs);
        d.insert("labels", batch.labels);
        d.insert("logits", logits.contiguous());
        d.insert("loss", loss.token_mean(logits, batch.labels));
        micros.push_back(d);
      }
      ranks.push_back(micros);
    }
    steps.push_back(ranks);
  }
  return steps;
}

Dict oracle_fields(const oracles::OracleResult& oracle) {
  Dict d = new_dict();
  d.insert("global_token_count", static_cast<std::int64_t>(oracle.global_token_count));
  d.insert("no_gradient", oracle.no_gradient);
  d.insert("contract", oracle.contract);
  List steps(c10::AnyType::get());
  for (const oracles::OracleStep& step : oracle.steps) {
    Dict one = new_dict();
    one.insert("gradients", named(step.gradients));
    one.insert("grad_norm", step.total_norm);
    one.insert("clip_coef", step.clip_coef);
    one.insert("loss", step.loss);
    one.insert("parameters_after", named(step.parameters_after));
    steps.push_back(one);
  }
  d.insert("steps", steps);
  return d;
}

// "dist/5-3/float32" -> OUT/dist/5-3/float32.pt. A name that would leave OUT (an absolute
// path, a ".." part), with an empty part ("q/", "a//b": a hidden ".pt", or two names for one
// file) or a part longer than a file name may be, is refused: a scenario file must not write
// where it likes, and one file is one scenario.
std::filesystem::path file_for(const std::string& out, const std::string& scenario) {
  const auto refuse = [&scenario](const std::string& why) {
    return scenarios::InvalidInput(
        fmt::format("export: scenario name '{}' cannot be a file name under --out: {}", scenario, why));
  };
  if (scenario.empty()) throw refuse("it is empty");
  if (scenario.front() == '/') throw refuse("it is absolute");
  std::size_t start = 0;
  for (;;) {
    const std::size_t slash = scenario.find('/', start);
    const std::string part = scenario.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty()) throw refuse("it has an empty part (a '/' at its end, or '//')");
    if (part == "." || part == "..") throw refuse("it has a '.' or '..' part");
    // NAME_MAX of the common Linux file systems, the last part with ".pt".
    const std::size_t length = part.size() + (slash == std::string::npos ? 3 : 0);
    if (length > 255) throw refuse(fmt::format("a part of {} bytes is longer than a file name may be", length));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return std::filesystem::path(out) / (scenario + ".pt");
}

// Every target checked before the first scenario is computed: two scenarios are never one
// file, a target is never also another's folder, and nothing on the way is a file where a
// folder is needed; --out is a folder, or can become one.
void check_targets(const std::string& out, const std::vector<scenarios::Scenario>& scenario_list,
                   std::vector<std::filesystem::path>& targets) {
  namespace fs = std::filesystem;
  struct stat st {};
  if (::stat(out.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    throw scenarios::InvalidInput(fmt::format("export: --out {} exists and is not a folder", out));
  }
  std::map<std::string, std::string> owner;  // target -> scenario
  for (const scenarios::Scenario& s : scenario_list) {
    const fs::path target = file_for(out, s.name);
    const auto [at, fresh] = owner.emplace(target.string(), s.name);
    if (!fresh) {
      throw scenarios::InvalidInput(fmt::format("export: scenarios '{}' and '{}' would both be {}",
                                                at->second, s.name, target.string()));
    }
    targets.push_back(target);
  }
  for (const fs::path& target : targets) {
    // A target that is a folder of another target ("n/a" beside "n/a.pt/x").
    for (fs::path folder = target.parent_path(); folder != fs::path(out) && !folder.empty();
         folder = folder.parent_path()) {
      if (auto clash = owner.find(folder.string()); clash != owner.end()) {
        throw scenarios::InvalidInput(fmt::format(
            "export: scenario '{}' would be the file {}, which scenario '{}' needs as a folder",
            clash->second, folder.string(), owner.at(target.string())));
      }
    }
    // The nearest folder on the way that exists takes the rest; what exists is a folder.
    fs::path existing = target.parent_path();
    while (!existing.empty() && ::stat(existing.c_str(), &st) != 0) existing = existing.parent_path();
    if (existing.empty()) existing = ".";
    if (!S_ISDIR(st.st_mode)) {
      throw scenarios::InvalidInput(fmt::format("export: {} needs {} as a folder, but it is not one",
                                                target.string(), existing.string()));
    }
    const fs::path probe = ::stat(target.c_str(), &st) == 0 ? target : existing / "x.pt";
    if (auto why = scenarios::why_unwritable(probe.string())) {
      throw scenarios::InvalidInput(fmt::format("export: {}: {}", target.string(), *why));
    }
  }
}

}  // namespace

int export_command(const std::vector<scenarios::Scenario>& scenario_list, const std::string& out) {
  if (out.empty()) throw scenarios::InvalidInput("export: --out DIR is required");
  std::vector<std::filesystem::path> targets;
  check_targets(out, scenario_list, targets);
  harness::DeterminismGuard guard;
  // Everything is computed before anything is written: a bad scenario leaves no file.
  std::vector<std::pair<std::filesystem::path, std::vector<char>>> files;
  for (const scenarios::Scenario& s : scenario_list) {
    // The scenario's own model, as the full fine-tuning recipes train it.
    const harness::ModelConfig config = harness::model_config_for(harness::find_variant("baseline"), s);
    const std::unique_ptr<harness::Model> model = harness::make_model(s, config);
    const std::unique_ptr<harness::Loss> loss = harness::make_loss(s);
    const oracles::OracleResult oracle = oracles::run_oracle(s, config);
    const oracles::Tolerance& tolerance = oracles::tolerance_for(s.dtype);
    Dict root = new_dict();
    root.insert("format", std::string("gradnorm oracle vectors"));
    root.insert("version", 1);
    root.insert("scenario", scenario_fields(s));
    std::vector<harness::NamedTensor> initial;
    c10::List<std::string> trainable;
    for (const harness::Parameter& p : model->parameters()) {
      initial.push_back({p.name, p.value});
      if (p.trainable) trainable.push_back(p.name);
    }
    root.insert("initial_parameters", named(initial));
    root.insert("trainable", trainable);
    root.insert("batches", batches_of(s, *model, *loss));
    Dict tol = new_dict();
    tol.insert("tensor_rel_l2", tolerance.tensor_rel_l2);
    tol.insert("scalar_rel", tolerance.scalar_rel);
    tol.insert("reason", std::string(tolerance.reason));
    root.insert("tolerance", tol);
    root.insert("oracle", oracle_fields(oracle));
    files.emplace_back(targets[files.size()], torch::jit::pickle_save(c10::IValue(root)));
  }
  for (const auto& [path, bytes] : files) {
    std::filesystem::create_directories(path.parent_path());
    reports::write_file_atomically(path.string(), std::string(bytes.begin(), bytes.end()));
    fmt::print("{}\n", path.string());
  }
  fmt::print("{} scenario(s) exported to {}\n", files.size(), out);
  return 0;
}

}  // namespace gradnorm::tools
