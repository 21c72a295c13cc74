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
class CrossEntropy : public Loss {
 public:
  at::Tensor per_token(const at::Tensor& rows, const at::Tensor& targets) const override {
    const at::Tensor log_probs = at::log_softmax(rows, /*dim=*/1);
    return -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1);
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

}  // namespace

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
