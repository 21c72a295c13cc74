// Observations cross process boundaries as one blob: an 8-byte length, a JSON header for
// names, scalars and errors, and a LibTorch pickle of every tensor in header order.
#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <nlohmann/json.hpp>

#include <cstring>

#include "gradnorm/harness/transport.hpp"

namespace gradnorm::harness {
namespace {

using nlohmann::json;

json optional_number(const std::optional<double>& value) {
  if (!value) return nullptr;
  // Bit pattern, so NaN and -0.0 survive the trip exactly.
  std::uint64_t bits = 0;
  std::memcpy(&bits, &*value, sizeof bits);
  return bits;
}

std::optional<double> read_optional_number(const json& value) {
  if (value.is_null()) return std::nullopt;
  const auto bits = value.get<std::uint64_t>();
  double out = 0;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

json named_list(const std::vector<NamedTensor>& list, std::vector<at::Tensor>& tensors) {
  json out = json::array();
  for (const NamedTensor& t : list) {
    out.push_back({{"name", t.name}, {"defined", t.value.defined()}});
    tensors.push_back(t.value.defined() ? t.value.detach().contiguous() : at::empty({0}));
  }
  return out;
}

std::vector<NamedTensor> read_named_list(const json& list, const c10::List<at::Tensor>& tensors,
                                         std::size_t& next) {
  std::vector<NamedTensor> out;
  for (const json& entry : list) {
    at::Tensor value = tensors.get(next++);
    out.push_back({entry.at("name").get<std::string>(),
                   entry.at("defined").get<bool>() ? value : at::Tensor()});
  }
  return out;
}

struct Fnv1a {
  std::uint64_t state = 0xcbf29ce484222325ULL;
  void add(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < size; ++i) {
      state ^= bytes[i];
      state *= 0x100000001b3ULL;
    }
  }
  void add(const std::string& text) { add(text.data(), text.size() + 1); }
  void add(const at::Tensor& tensor) {
    if (!tensor.defined()) return add(std::string("<undefined>"));
    const at::Tensor flat = tensor.detach().contiguous();
    add(flat.data_ptr(), static_cast<std::size_t>(flat.numel()) * flat.element_size());
  }
  void add(const std::optional<double>& value) {
    if (!value) return add(std::string("<none>"));
    add(&*value, sizeof(double));
  }
};

}  // namespace

std::uint64_t digest(const Observation& o) {
  Fnv1a hash;
  for (const StepRecord& step : o.steps) {
    for (const NamedTensor& g : step.gradients) hash.add(g.value);
    for (const NamedTensor& p : step.parameters_after) hash.add(p.value);
    hash.add(step.grad_norm);
    hash.add(step.logged_loss);
  }
  if (o.error) {
    hash.add(o.error->type);
    hash.add(o.error->message);
  }
  return hash.state;
}

std::string serialize(const Observation& o) {
  std::vector<at::Tensor> tensors;
  json header;
  header["scenario"] = o.scenario;
  header["variant"] = o.variant;
  header["rank"] = o.rank;
  header["initial"] = named_list(o.initial_parameters, tensors);
  json steps = json::array();
  for (const StepRecord& step : o.steps) {
    steps.push_back({{"gradients", named_list(step.gradients, tensors)},
                     {"parameters_after", named_list(step.parameters_after, tensors)},
                     {"grad_norm", optional_number(step.grad_norm)},
                     {"logged_loss", optional_number(step.logged_loss)}});
  }
  header["steps"] = steps;
  header["error"] = o.error ? json{{"type", o.error->type}, {"message", o.error->message}} : json(nullptr);
  header["counters"] = {o.counters.backward_calls, o.counters.scale_passes,
                        o.counters.reduce_passes, o.counters.clip_calls,
                        o.counters.optimizer_steps};
  header["output"] = o.output;
  // What user code printed need not be UTF-8: replaced, not thrown on.
  const std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  const std::vector<char> pickled =
      torch::jit::pickle_save(c10::IValue(c10::List<at::Tensor>(tensors)));
  std::string out(8, '\0');
  const std::uint64_t length = text.size();
  std::memcpy(out.data(), &length, sizeof length);
  out += text;
  out.append(pickled.begin(), pickled.end());
  return out;
}

Observation deserialize(const std::string& bytes) {
  TORCH_CHECK(bytes.size() >= 8, "observation blob too short: ", bytes.size(), " bytes");
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), sizeof length);
  TORCH_CHECK(bytes.size() >= 8 + length, "observation blob truncated");
  const json header = json::parse(bytes.substr(8, length));
  const std::vector<char> pickled(bytes.begin() + static_cast<long>(8 + length), bytes.end());
  const c10::List<at::Tensor> tensors = torch::jit::pickle_load(pickled).toTensorList();
  std::size_t next = 0;
  Observation o;
  o.scenario = header.at("scenario").get<std::string>();
  o.variant = header.at("variant").get<std::string>();
  o.rank = header.at("rank").get<int>();
  o.initial_parameters = read_named_list(header.at("initial"), tensors, next);
  for (const json& step : header.at("steps")) {
    StepRecord record;
    record.gradients = read_named_list(step.at("gradients"), tensors, next);
    record.parameters_after = read_named_list(step.at("parameters_after"), tensors, next);
    record.grad_norm = read_optional_number(step.at("grad_norm"));
    record.logged_loss = read_optional_number(step.at("logged_loss"));
    o.steps.push_back(std::move(record));
  }
  if (!header.at("error").is_null()) {
    o.error = ErrorRecord{header["error"].at("type").get<std::string>(),
                          header["error"].at("message").get<std::string>()};
  }
  const auto counters = header.at("counters").get<std::vector<int>>();
  o.counters = Counters{counters.at(0), counters.at(1), counters.at(2), counters.at(3), counters.at(4)};
  o.output = header.at("output").get<std::string>();
  return o;
}

}  // namespace gradnorm::harness
