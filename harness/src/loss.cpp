#include "gradnorm/harness/loss.hpp"

#include <ATen/ATen.h>

#include "gradnorm/harness/batch.hpp"

namespace gradnorm::harness {
namespace {

at::Tensor upcast(const at::Tensor& logits) {
  return logits.to(at::promote_types(logits.scalar_type(), at::kFloat));
}

// Cross-entropy per token: -log softmax(row)[target]. The three kinds below differ only in
// how their modules form the mean.
at::Tensor cross_entropy_per_token(const at::Tensor& rows, const at::Tensor& targets) {
  const at::Tensor log_probs = at::log_softmax(rows, /*dim=*/1);
  return -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1);
}

class CrossEntropy : public Loss {
 public:
  at::Tensor per_token(const TokenRows& rows) const override {
    return cross_entropy_per_token(rows.logits, rows.targets);
  }
};

// torch.nn.functional.cross_entropy(reduction="mean", ignore_index=-100): an all-ignored
// batch gives 0/0 = NaN as its value and zero gradients.
class MeanCrossEntropy final : public CrossEntropy {
 public:
  at::Tensor token_mean(const at::Tensor& logits, const at::Tensor& labels) const override {
    const long vocab = logits.size(-1);
    return at::cross_entropy_loss(upcast(logits).reshape({-1, vocab}), labels.reshape({-1}), {},
                                  at::Reduction::Mean, kIgnoreIndex);
  }
};

// torchtune CEWithChunkedOutputLoss: per-chunk CE sums along the sequence, divided by the
// total valid count. All ignored: the value is 0 / 0 = NaN, but the gradients are zero
// (measured): cross-entropy's backward writes zero at ignored positions whatever reaches
// it, even the 1/0 of the division.
class ChunkedCrossEntropy final : public CrossEntropy {
 public:
  explicit ChunkedCrossEntropy(int chunks) : chunks_(chunks) {}
  at::Tensor token_mean(const at::Tensor& logits, const at::Tensor& labels) const override {
    const long vocab = logits.size(-1);
    const at::Tensor valid = labels.ne(kIgnoreIndex).sum();
    const auto logit_chunks = logits.chunk(chunks_, /*dim=*/1);
    const auto label_chunks = labels.chunk(chunks_, /*dim=*/1);
    at::Tensor total;
    for (std::size_t i = 0; i < logit_chunks.size(); ++i) {
      const at::Tensor piece = at::cross_entropy_loss(
          upcast(logit_chunks[i]).reshape({-1, vocab}), label_chunks[i].reshape({-1}), {},
          at::Reduction::Sum, kIgnoreIndex);
      total = total.defined() ? total + piece : piece;
    }
    return total / valid;
  }

 private:
  int chunks_;
};

// torchtune LinearCrossEntropyLoss: sum over valid tokens / valid count, but a batch with no
// valid token returns a fresh zero with no graph, so backward() raises.
class LinearCrossEntropy final : public CrossEntropy {
 public:
  at::Tensor token_mean(const at::Tensor& logits, const at::Tensor& labels) const override {
    const long vocab = logits.size(-1);
    const at::Tensor valid_mask = labels.reshape({-1}).ne(kIgnoreIndex);
    const long valid = valid_mask.sum().item<long>();
    if (valid == 0) return at::zeros({}, upcast(logits).options().requires_grad(false));
    const at::Tensor rows = upcast(logits).reshape({-1, vocab}).index({valid_mask});
    const at::Tensor targets = labels.reshape({-1}).index({valid_mask});
    return at::cross_entropy_loss(rows, targets, {}, at::Reduction::Sum, kIgnoreIndex) /
           static_cast<double>(valid);
  }
};

// torchtune ForwardKLLoss.forward(student, teacher, labels, normalize), on rows [M, V]:
// softmax and log-softmax in float32, positions where the student logit is infinite
// zeroed, the per-row sums masked by the labels; normalised by the valid count, or a
// graph-less zero when there is none.
at::Tensor forward_kl(const at::Tensor& student, const at::Tensor& teacher,
                      const at::Tensor& labels, bool normalize) {
  const at::Tensor teacher_prob = at::softmax(teacher, -1, at::kFloat);
  const at::Tensor inf_mask = at::isinf(student);
  const at::Tensor student_logprob = at::log_softmax(student, -1, at::kFloat);
  const at::Tensor prod_probs = at::masked_fill(teacher_prob * student_logprob, inf_mask, 0);
  const at::Tensor x = at::sum(prod_probs, -1).view({-1});
  const at::Tensor mask = labels.ne(kIgnoreIndex).to(at::kInt);
  if (!normalize) return -at::sum(x * mask.view({-1}), 0);
  const at::Tensor sum_masks = at::sum(mask.view({-1}), 0);
  if (sum_masks.item<long>() == 0) return at::scalar_tensor(0.0, at::kFloat);
  return -at::sum(x * mask.view({-1}), 0) / at::sum(mask.view({-1}), 0);
}

class ForwardKl final : public DistillationLoss {
 public:
  at::Tensor operator()(const at::Tensor& student, const at::Tensor& teacher,
                        const at::Tensor& labels) const override {
    // The recipes' _loss_step flattens unchunked logits to [B*T, V] and labels to [B*T].
    const long vocab = student.size(-1);
    return forward_kl(student.reshape({-1, vocab}), teacher.reshape({-1, vocab}),
                      labels.reshape({-1}), /*normalize=*/true);
  }
};

// torchtune ForwardKLWithChunkedOutputLoss: the chunks' unnormalised sums, divided by the
// whole batch's valid count (a graph-less zero when there is none).
class ChunkedForwardKl final : public DistillationLoss {
 public:
  explicit ChunkedForwardKl(int chunks) : chunks_(chunks) {}
  at::Tensor operator()(const at::Tensor& student, const at::Tensor& teacher,
                        const at::Tensor& labels) const override {
    const long vocab = student.size(-1);
    const auto student_chunks = student.tensor_split(chunks_, /*dim=*/1);
    const auto teacher_chunks = teacher.tensor_split(chunks_, /*dim=*/1);
    const auto label_chunks = labels.tensor_split(chunks_, /*dim=*/1);
    const at::Tensor mask = labels.ne(kIgnoreIndex).to(at::kInt);
    at::Tensor total;  // Python's 0.0 + the first chunk's tensor
    for (std::size_t i = 0; i < student_chunks.size(); ++i) {
      const at::Tensor piece =
          forward_kl(student_chunks[i].reshape({-1, vocab}), teacher_chunks[i].reshape({-1, vocab}),
                     label_chunks[i].reshape({-1}), /*normalize=*/false);
      total = total.defined() ? total + piece : piece + 0.0;
    }
    const at::Tensor sum_masks = at::sum(mask.view({-1}), 0);
    if (sum_masks.item<long>() == 0) return at::scalar_tensor(0.0, at::kFloat);
    return total / at::sum(mask.view({-1}), 0);
  }

 private:
  int chunks_;
};

// The oracle's distillation objective per token, written out in the rows' dtype (float64):
// (1 - r) * (-log p_s(y)) + r * (-sum_v p_t(v) log p_s(v)).
class DistillationObjective final : public PerTokenLoss {
 public:
  explicit DistillationObjective(double kd_ratio) : kd_ratio_(kd_ratio) {}
  at::Tensor per_token(const TokenRows& rows) const override {
    TORCH_INTERNAL_ASSERT(rows.teacher_logits.defined(),
                          "harness bug: a distillation objective without teacher logits");
    const at::Tensor log_probs = at::log_softmax(rows.logits, /*dim=*/1);
    const at::Tensor class_loss = -log_probs.gather(1, rows.targets.unsqueeze(1)).squeeze(1);
    const at::Tensor teacher_probs = at::softmax(rows.teacher_logits, /*dim=*/1);
    const at::Tensor kd_loss = -(teacher_probs * log_probs).sum(/*dim=*/1);
    return (1 - kd_ratio_) * class_loss + kd_ratio_ * kd_loss;
  }

 private:
  double kd_ratio_;
};

}  // namespace

std::unique_ptr<DistillationLoss> make_distillation_loss(const scenarios::Scenario& scenario) {
  if (scenario.loss == scenarios::LossKind::chunked_ce) {
    return std::make_unique<ChunkedForwardKl>(scenario.loss_chunks);
  }
  return std::make_unique<ForwardKl>();
}

std::unique_ptr<PerTokenLoss> make_objective(const scenarios::Scenario& scenario,
                                             Objective objective) {
  switch (objective) {
    case Objective::scenario_loss: return make_loss(scenario);
    case Objective::knowledge_distillation:
      return std::make_unique<DistillationObjective>(scenario.kd_ratio);
  }
  TORCH_INTERNAL_ASSERT(false, "harness bug: unhandled objective");
}

std::unique_ptr<Loss> make_loss(const scenarios::Scenario& scenario) {
  switch (scenario.loss) {
    case scenarios::LossKind::mean_ce: return std::make_unique<MeanCrossEntropy>();
    case scenarios::LossKind::chunked_ce:
      return std::make_unique<ChunkedCrossEntropy>(scenario.loss_chunks);
    case scenarios::LossKind::linear_ce: return std::make_unique<LinearCrossEntropy>();
  }
  TORCH_INTERNAL_ASSERT(false, "harness bug: unhandled loss kind");
}

}  // namespace gradnorm::harness
