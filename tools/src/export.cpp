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

#include <filesystem>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/oracles/tolerance.hpp"
#include "gradnorm/reports/report.hpp"

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
// path, a ".." part) is refused: a scenario file must not write where it likes.
std::filesystem::path file_for(const std::string& out, const std::string& scenario) {
  const std::filesystem::path name(scenario + ".pt");
  bool escapes = name.is_absolute() || name.has_root_name();
  for (const auto& part : name) escapes = escapes || part == ".." || part == ".";
  if (escapes || scenario.empty()) {
    throw scenarios::InvalidInput(fmt::format(
        "export: scenario name '{}' cannot be a file name under --out (absolute, or with a "
        "'.' or '..' part)",
        scenario));
  }
  return std::filesystem::path(out) / name;
}

}  // namespace

int export_command(const std::vector<scenarios::Scenario>& scenario_list, const std::string& out) {
  if (out.empty()) throw scenarios::InvalidInput("export: --out DIR is required");
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
    files.emplace_back(file_for(out, s.name), torch::jit::pickle_save(c10::IValue(root)));
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
