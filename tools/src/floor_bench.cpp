// `gradnorm bench --floor FILE`: the per-case check of the reference stream written straight
// against LibTorch, with no harness around it, on one thread: a float64 oracle per
// micro-batch, then the baseline's and the skip's arithmetic on every rank and micro-batch,
// compared by relative L2 error. It runs the same model forward, loss and backward as
// gradnorm's variants, so its time per case is what those LibTorch operations cost here,
// the floor under any harness that runs them. It judges nothing: the verdict tally is only
// there to show it did the work.
#include "floor_bench.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/scenarios/scenario_file.hpp"

namespace gradnorm::tools {
namespace {

constexpr double kTolerance = 1e-5;  // float32 against float64, as bench/reference.py's

std::atomic<long> operator_calls{0};
double oracle_seconds = 0;  // of check()'s time, the oracle's share

std::vector<at::Tensor> fresh(const harness::Model& model, c10::ScalarType dtype) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : model.trainable_tensors()) {
    at::Tensor copy = t.detach().to(dtype).clone();
    copy.set_requires_grad(true);
    out.push_back(copy);
  }
  return out;
}

// The built-in causal LM's forward (harness/src/model.cpp) on explicit parameters:
// embedding, hidden weight and bias, head weight and bias.
at::Tensor logits_of(const std::vector<at::Tensor>& p, const at::Tensor& tokens) {
  const long sequences = tokens.size(0);
  const long length = tokens.size(1);
  const at::Tensor embedded = p[0].index_select(0, tokens.reshape({-1})).view({sequences, length, -1});
  const at::Tensor counts = at::arange(1, length + 1, embedded.options().requires_grad(false)).view({1, length, 1});
  const at::Tensor hidden = at::tanh(at::linear(embedded.cumsum(1) / counts, p[1], p[2]));
  return at::linear(hidden, p[3], p[4]);
}

at::Tensor mean_ce(const at::Tensor& logits, const at::Tensor& labels, at::Reduction::Reduction reduction) {
  return at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, logits.size(-1)}), labels.reshape({-1}), {},
                                reduction, harness::kIgnoreIndex);
}

double rel_l2(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (got[i].to(at::kDouble) - want[i]).pow(2).sum().item<double>();
    den += want[i].pow(2).sum().item<double>();
  }
  return std::sqrt(num / den);
}

// One case: true where the variant passes, for baseline and skip.
std::array<bool, 2> check(const scenarios::Scenario& s) {
  const std::unique_ptr<harness::Model> model = harness::make_model(s, harness::ModelConfig{});
  std::vector<std::vector<harness::MicroBatch>> windows;
  long total = 0;
  for (int rank = 0; rank < s.world_size; ++rank) {
    windows.push_back(harness::make_rank_window(s, rank, 0));
    for (const harness::MicroBatch& b : windows.back()) total += b.valid_count;
  }
  const double lr = s.learning_rate;
  const auto oracle_start = std::chrono::steady_clock::now();
  const std::vector<at::Tensor> p64 = fresh(*model, at::kDouble);
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (const auto& window : windows) {
    for (const harness::MicroBatch& b : window) {
      const at::Tensor l = logits_of(p64, b.inputs);
      loss = loss + at::cross_entropy_loss(l.reshape({-1, l.size(-1)}), b.labels.reshape({-1}), {},
                                           at::Reduction::Sum, harness::kIgnoreIndex);
    }
  }
  loss = loss / static_cast<double>(total);
  const std::vector<at::Tensor> want = torch::autograd::grad({loss}, p64);
  std::vector<at::Tensor> want_after;
  for (std::size_t i = 0; i < p64.size(); ++i) want_after.push_back(p64[i].detach() - lr * want[i]);
  const double want_loss = loss.item<double>();
  oracle_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - oracle_start).count();

  std::array<bool, 2> passed{};
  for (int variant = 0; variant < 2; ++variant) {
    const bool skip = variant == 1 && s.accumulation_steps == 1;  // the pull request's gate
    std::vector<at::Tensor> sum;
    double running = 0;
    long seen = 0;
    for (const auto& window : windows) {
      const std::vector<at::Tensor> p = fresh(*model, at::kFloat);
      for (const harness::MicroBatch& b : window) {
        const at::Tensor n = b.labels.ne(harness::kIgnoreIndex).sum();
        const at::Tensor mean = mean_ce(logits_of(p, b.inputs), b.labels, at::Reduction::Mean);
        const at::Tensor objective = skip ? mean : mean * n;
        objective.backward();
        running += objective.item<double>();
        seen += n.item<long>();
      }
      for (std::size_t i = 0; i < p.size(); ++i) {
        const at::Tensor g = p[i].grad().defined() ? p[i].grad() : at::zeros_like(p[i]);
        if (sum.size() <= i) {
          sum.push_back(g.clone());
        } else {
          sum[i] += g;
        }
      }
    }
    std::vector<at::Tensor> after;
    const double world = s.world_size;
    for (std::size_t i = 0; i < sum.size(); ++i) {
      sum[i] = sum[i] / world;
      if (!skip) sum[i] = sum[i] * (world / static_cast<double>(seen));
      after.push_back(p64[i].detach().to(at::kFloat) - lr * sum[i]);
    }
    const double logged = skip ? running / world : running / static_cast<double>(seen);
    passed[static_cast<std::size_t>(variant)] =
        rel_l2(sum, want) <= kTolerance && rel_l2(after, want_after) <= kTolerance &&
        std::abs(logged - want_loss) / std::abs(want_loss) <= kTolerance;
  }
  return passed;
}

}  // namespace

int floor_bench_command(const std::string& path) {
  const std::vector<scenarios::Scenario> cases = scenarios::load_scenario_file(path);
  for (const scenarios::Scenario& s : cases) {
    if (s.model != scenarios::ModelKind::causal_lm || s.steps != 1 || s.clip_max_norm ||
        s.optimizer != scenarios::OptimizerKind::sgd || s.weight_decay != 0 ||
        s.dtype != scenarios::DType::float32 || s.loss != scenarios::LossKind::mean_ce ||
        s.data_parallel_size() != s.world_size) {
      throw scenarios::InvalidInput(fmt::format(
          "bench --floor: scenario '{}' is not of the reference stream's kind (causal_lm, "
          "float32, mean_ce, SGD without weight decay, one step, no clipping, no mesh); "
          "`gradnorm stream` writes such a file",
          s.name));
    }
  }
  harness::DeterminismGuard determinism;
  at::set_num_threads(1);
  std::array<long, 2> passes{};
  const auto start = std::chrono::steady_clock::now();
  for (const scenarios::Scenario& s : cases) {
    const std::array<bool, 2> passed = check(s);
    passes[0] += passed[0];
    passes[1] += passed[1];
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double oracle_part = oracle_seconds;
  // Then, untimed, every operator call LibTorch dispatches on the first cases, counted
  // through its own observer hook (which slows each call down).
  const std::size_t counted = std::min<std::size_t>(cases.size(), 200);
  at::RecordFunctionCallback counter(
      [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
        operator_calls.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
      });
  const at::CallbackHandle handle = at::addGlobalCallback(counter.needsInputs(false).needsOutputs(false));
  for (std::size_t i = 0; i < counted; ++i) (void)check(cases[i]);
  at::removeCallback(handle);
  const double n = static_cast<double>(cases.size());
  const double calls_per_case = static_cast<double>(operator_calls.load()) / static_cast<double>(counted);
  fmt::print("floor: {} cases of {} on one thread, LibTorch alone: {:.3f} s, {:.3f} ms per case\n",
             cases.size(), path, seconds, 1e3 * seconds / n);
  fmt::print("  of which the float64 oracle {:.3f} ms, batches and the two variants {:.3f} ms\n",
             1e3 * oracle_part / n, 1e3 * (seconds - oracle_part) / n);
  fmt::print("  {:.0f} operator calls per case (the first {} cases), {:.2f} us per call\n",
             calls_per_case, counted, 1e6 * seconds / n / calls_per_case);
  fmt::print("  baseline {} pass / {} fail, skip {} / {}\n", passes[0],
             static_cast<long>(cases.size()) - passes[0], passes[1],
             static_cast<long>(cases.size()) - passes[1]);
  return 0;
}

}  // namespace gradnorm::tools
