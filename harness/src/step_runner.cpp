// Runs one registered step on one rank: builds what the step needs from the scenario (the
// model, the loss, the recording optimizer), hands the step one window of micro-batches
// per optimizer step, and records what a user would see (docs/design.md §4).
#include <ATen/ATen.h>

#include <fmt/format.h>

#include <map>

#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/output_capture.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/step.hpp"

namespace gradnorm::harness {
namespace {

// Another rank's step raised: this rank stops at its next collective.
struct PeerFailure {};

// The communicator a step talks through. Before every collective, and once at the end of
// every step, all ranks agree whether any rank's step raised (an all-reduce of a flag); a
// rank whose step raised joins that agreement once with its flag set. So every rank learns
// of the failure at the same collective, and none waits for a peer that has stopped.
class StepCommunicator final : public Communicator {
 public:
  explicit StepCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::string kind() const override { return inner_.kind(); }
  void all_reduce_sum(std::vector<at::Tensor>& tensors) override {
    if (inner_.any_failed_else_all_reduce_sum(tensors)) throw PeerFailure{};
  }
  void barrier() override {
    std::vector<at::Tensor> none;
    if (inner_.any_failed_else_all_reduce_sum(none)) throw PeerFailure{};
  }
  void check_peers() {
    if (inner_.any(false)) throw PeerFailure{};
  }
  void announce_failure() { (void)inner_.any(true); }
  // A mesh subgroup's collectives go through the same agreement, held by the whole world.
  Communicator& group(const std::vector<int>& ranks) override {
    if (static_cast<int>(ranks.size()) == world_size()) return *this;
    auto found = groups_.find(ranks);
    if (found == groups_.end()) {
      found = groups_.emplace(ranks, std::make_unique<Subgroup>(*this, inner_.group(ranks))).first;
    }
    return *found->second;
  }

 private:
  class Subgroup final : public Communicator {
   public:
    Subgroup(StepCommunicator& world, Communicator& inner) : world_(world), inner_(inner) {}
    int rank() const override { return inner_.rank(); }
    int world_size() const override { return inner_.world_size(); }
    std::string kind() const override { return inner_.kind(); }
    void all_reduce_sum(std::vector<at::Tensor>& tensors) override {
      world_.check_peers();
      inner_.all_reduce_sum(tensors);
    }
    void barrier() override {
      world_.check_peers();
      inner_.barrier();
    }

   private:
    StepCommunicator& world_;
    Communicator& inner_;
  };

  Communicator& inner_;
  std::map<std::vector<int>, std::unique_ptr<Subgroup>> groups_;
};

ModelConfig teacher_config(const VariantSpec& variant, const scenarios::Scenario& scenario) {
  return ModelConfig{model_config_for(variant, scenario).base, false, false, true};
}

std::vector<NamedTensor> snapshot_parameters(const Model& model) {
  std::vector<NamedTensor> out;
  for (const Parameter& p : model.parameters()) {
    if (p.trainable) out.push_back({p.name, p.value.detach().clone()});
  }
  return out;
}

class RankRun final : public StepContext {
 public:
  RankRun(const VariantSpec& variant, const scenarios::Scenario& scenario,
          const BatchSource& batches, Communicator& comm, const FaultInjection& fault,
          Observation& out)
      : scenario_(scenario),
        batches_(batches),
        comm_(comm),
        fault_(fault),
        out_(out),
        model_(make_model(scenario, model_config_for(variant, scenario))),
        optimizer_(scenario, *model_, out.counters),
        loss_(make_loss(scenario)),
        teacher_(variant.objective == Objective::knowledge_distillation
                     ? make_model(scenario, teacher_config(variant, scenario))
                     : nullptr),
        kd_loss_(teacher_ ? make_distillation_loss(scenario) : nullptr),
        step_(variant.make()) {
    TORCH_INTERNAL_ASSERT(step_, "harness bug: variant '", variant.name, "' made no step");
  }

  // Returns when every step is done or when some rank's step raised (recorded in the
  // observation: the error itself on that rank, "peer-failure" on the others).
  void train() {
    out_.initial_parameters = snapshot_parameters(*model_);
    if (!guarded([&] { step_->prepare(*this); })) return;
    for (int step = 0; step < scenario_.steps; ++step) {
      inject_fault(step);
      begin_step(step);
      if (!guarded([&] {
            step_->train_step(*this);
            step_comm_.check_peers();
          })) {
        return;
      }
      StepRecord record;
      record.gradients = optimizer_.consumed();
      record.grad_norm = grad_norm_;
      record.logged_loss = logged_loss_;
      record.parameters_after = snapshot_parameters(*model_);
      out_.steps.push_back(std::move(record));
    }
  }

  const scenarios::Scenario& scenario() const override { return scenario_; }
  int step_index() const override { return step_index_; }
  const std::vector<MicroBatch>& micro_batches() const override { return window_; }
  std::vector<MicroBatch> micro_batches_of_step(int step) const override {
    if (step < 0 || step >= scenario_.steps) {
      throw scenarios::InvalidInput(fmt::format("scenario '{}' has {} steps; step {} was asked for",
                                                scenario_.name, scenario_.steps, step));
    }
    if (step == step_index_ && !window_.empty()) return window_;
    std::vector<MicroBatch> out;
    for (int micro = 0; micro < scenario_.accumulation_steps; ++micro) {
      out.push_back(batches_(comm_.rank(), step, micro));
    }
    return out;
  }
  Model& model() const override { return *model_; }
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const override {
    return loss_->token_mean(logits, labels);
  }
  const Model* teacher() const override { return teacher_.get(); }
  at::Tensor kd_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                     const at::Tensor& labels) const override {
    TORCH_CHECK(kd_loss_, "kd_loss() is for steps registered with the knowledge_distillation "
                          "objective");
    return (*kd_loss_)(student_logits, teacher_logits, labels);
  }
  Optimizer& optimizer() const override { return optimizer_; }
  Communicator& comm() const override { return step_comm_; }
  Counters& counters() const override { return out_.counters; }
  void log_loss(double value) override { logged_loss_ = value; }
  void report_grad_norm(double value) override { grad_norm_ = value; }

 private:
  // Runs part of the step; false when it raised (here or on another rank), recorded.
  template <typename Body>
  bool guarded(Body&& body) {
    try {
      body();
      return true;
    } catch (const PeerFailure&) {
      out_.error = ErrorRecord{"peer-failure", "another rank's step raised"};
    } catch (const RecipeRefusal& refusal) {
      out_.error = ErrorRecord{"refusal", refusal.what()};
      step_comm_.announce_failure();
    } catch (const c10::Error& error) {
      out_.error = ErrorRecord{"c10::Error", first_line(error.what_without_backtrace())};
      step_comm_.announce_failure();
    } catch (const StepError& error) {
      out_.error = ErrorRecord{error.type(), first_line(error.what())};
      step_comm_.announce_failure();
    }
    return false;
  }

  void inject_fault(int step) const {
    if (fault_.rank != comm_.rank() || fault_.step != step) return;
    switch (fault_.kind) {
      case FaultKind::none: return;
      case FaultKind::throw_error:
        throw std::runtime_error(fmt::format("injected fault: rank {} throws", comm_.rank()));
      case FaultKind::exit_early: throw RankExit{};
      case FaultKind::hang: fault_.hang(); return;
    }
  }

  void begin_step(int step) {
    step_index_ = step;
    window_.clear();
    const int rank = comm_.rank();
    const int data_parallel_rank = scenario_.mesh_coordinates(rank).data_parallel_rank;
    for (int micro = 0; micro < scenario_.accumulation_steps; ++micro) {
      window_.push_back(batches_(rank, step, micro));
      // Under context parallelism a rank holds a shard: its count is not the scenario's.
      if (scenario_.cp > 1) continue;
      const long valid = window_.back().labels.ne(kIgnoreIndex).sum().item<long>();
      const int wanted = scenario_.valid_tokens[static_cast<std::size_t>(data_parallel_rank)]
                                               [static_cast<std::size_t>(micro)];
      if (valid != wanted) {
        throw scenarios::InvalidInput(fmt::format(
            "scenario '{}': the batch source gave rank {} step {} micro-batch {} with {} valid "
            "labels, but the scenario asks for {}",
            scenario_.name, rank, step, micro, valid, wanted));
      }
    }
    optimizer_.begin_recording();
    logged_loss_.reset();
    grad_norm_.reset();
  }

  const scenarios::Scenario& scenario_;
  const BatchSource& batches_;
  Communicator& comm_;
  const FaultInjection& fault_;
  Observation& out_;
  std::unique_ptr<Model> model_;
  mutable Optimizer optimizer_;
  mutable StepCommunicator step_comm_{comm_};
  std::unique_ptr<Loss> loss_;
  std::unique_ptr<Model> teacher_;
  std::unique_ptr<DistillationLoss> kd_loss_;
  std::unique_ptr<Step> step_;
  int step_index_ = 0;
  std::vector<MicroBatch> window_;
  std::optional<double> logged_loss_;
  std::optional<double> grad_norm_;
};

}  // namespace

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  const auto trailer = line.find("Exception raised from");
  if (trailer != std::string::npos) line = line.substr(0, trailer);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

Observation run_rank(const VariantSpec& variant, const scenarios::Scenario& scenario,
                     const BatchSource& batches, Communicator& comm,
                     const FaultInjection& fault) {
  Observation out;
  out.scenario = scenario.name;
  out.variant = variant.name;
  out.rank = comm.rank();
  RankOutput printed(scenario.name + " x " + variant.name, out.rank);
  RankRun run(variant, scenario, batches, comm, fault, out);
  run.train();
  out.output = printed.take();
  return out;
}

Observation run_single_device(const VariantSpec& variant, const scenarios::Scenario& scenario) {
  return run_single_device(variant, scenario, scenario_batches(scenario));
}

Observation run_single_device(const VariantSpec& variant, const scenarios::Scenario& scenario,
                              const BatchSource& batches) {
  scenarios::validate(scenario);
  if (scenario.world_size != 1) {
    throw scenarios::InvalidInput(fmt::format(
        "scenario '{}': world_size is {} but the single-device runner needs 1", scenario.name,
        scenario.world_size));
  }
  SoloCommunicator solo;
  return run_rank(variant, scenario, batches, solo, FaultInjection{});
}

}  // namespace gradnorm::harness
