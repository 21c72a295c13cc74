#!/usr/bin/env bash
# ctest: TRL's SFTTrainer, unmodified (trl 1.16.0 from the folder requirements-trl.txt
# installs, first on PYTHONPATH, beside the environment's transformers 5.18.0; and beside
# transformers 4.57.6 and 5.17.0), judged on
# catalogue scenarios with transformers' own LlamaForCausalLM: one device and 2 rank processes
# over Gloo DDP; its dataset preparation dropping sequences with no valid label (and
# max_length=None keeping them); average_tokens_across_devices off; the model without loss
# kwargs; a user's SFTTrainer subclasses from a file; bad input (exit 2). The figures are the
# ones measured and explained in docs/findings.md ("TRL's SFTTrainer"). Skips (77) where TRL cannot
# be imported.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
gradnorm="$1"
source_dir="$2"
work="$3"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
envdir="$(dirname "$(dirname "$python")")"
overlay="$envdir/trl-1.16.0"
# The same TRL beside transformers 4.57.6 and 5.17.0 (requirements-trl-transformers4.txt's
# folder before 4.57.6's; requirements-trl.txt's before 5.17.0's).
v4="$envdir/trl-1.16.0-transformers-4.57.6:$envdir/transformers-4.57.6"
v517="$overlay:$envdir/transformers-5.17.0"
source "$(dirname "${BASH_SOURCE[0]}")/require_packages.sh"
for env in "$overlay" "$v4" "$v517"; do require_packages "$env" trl transformers; done
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
export PYTHONPATH="$overlay"
sft=trl/sft
nk=python:$source_dir/examples/transformers/tiny_llama.py:hf_tiny_llama_no_loss_kwargs

# One device, SFTConfig's defaults but the scenario's: ragged accumulation and the first label
# valid pass; a scenario with sequences that have no valid label cannot be given as it is
# (max_length's filter drops them), and with max_length=None its window passes.
"$gradnorm" run --recipe trl:sft -s single/accum2-ragged/float32 \
  -s first-valid/single/accum2-ragged/float32 -s single/accum4-ragged/float32 \
  --json one.json > one.txt 2>&1
echo "one: exit $?" >> one.txt
row hf_tiny_llama/single/accum2-ragged/float32 $sft pass one.txt
row hf_tiny_llama/first-valid/single/accum2-ragged/float32 $sft pass one.txt
row hf_tiny_llama/single/accum4-ragged/float32 $sft error-mismatch one.txt
expect "SFTTrainer's dataset preparation kept 7 of the 8 sequences given (1 of them have no valid label" one.txt
expect "one: exit 1" one.txt
expect "trl 1.16.0's SFTTrainer (transformers 5.18.0), unmodified" one.json
# YAML's spelling of None (a TRL config file's max_length: null) means the same: a variant of
# the same run.
variant trl/sft-max_length-null trl:sft max_length=null > nomax-null.toml
"$gradnorm" run --recipe trl:sft --recipe-arg max_length=None -f nomax-null.toml \
  -s single/accum4-ragged/float32 -s single/clip-zero/float32 -s single/all-masked-mean_ce/float32 \
  > nomax.txt 2>&1
row hf_tiny_llama/single/accum4-ragged/float32 $sft pass nomax.txt
row hf_tiny_llama/single/accum4-ragged/float32 trl/sft-max_length-null pass nomax.txt
row hf_tiny_llama/single/clip-zero/float32 $sft fail nomax.txt
row hf_tiny_llama/single/all-masked-mean_ce/float32 $sft error-mismatch nomax.txt
reason hf_tiny_llama/single/all-masked-mean_ce/float32 $sft \
  "N == 0 but the step returned finite gradients, loss and parameters" nomax.txt
# The model without loss kwargs: SFTTrainer's fused head bypasses its forward, but Trainer
# read the forward's signature and passes no token count: each micro-batch's own mean.
"$gradnorm" run --recipe trl:sft --recipe-model "$nk" -s single/accum2-ragged/float32 > nk.txt 2>&1
row hf_tiny_llama_no_loss_kwargs/single/accum2-ragged/float32 $sft fail nk.txt
expect "step 0: gradients rel L2 error 0.246 > 1e-05" nk.txt

# 2 rank processes: tokens averaged across devices; a rank whose sequences are dropped stops
# every rank (no hang); without averaging, each rank normalises by its own tokens.
"$gradnorm" run --recipe trl:sft --nproc 2 -s dist/5-3/float32 -s dist/0-8/float32 \
  > dist.txt 2>&1
row hf_tiny_llama/dist/5-3/float32 $sft pass dist.txt
row hf_tiny_llama/dist/0-8/float32 $sft error-mismatch dist.txt
expect "rank 1: another rank's SFTTrainer dataset preparation dropped sequences" dist.txt
# The rank processes below are forked warm from the supervisor (docs/ranks.md, "Warm rank
# processes"), as fuzz --nproc forks them; the run above exec'd its ranks, the default.
export GRADNORM_WARM_RANKS=1
# Without averaging, a variant of the same run.
variant trl/sft-noavg trl:sft average_tokens_across_devices=False > noavg.toml
"$gradnorm" run --recipe trl:sft --nproc 2 --recipe-arg max_length=None -f noavg.toml \
  -s dist/0-8/float32 -s first-valid/dist/accum2-ragged/float32 -s dist/5-3/float32 > dist-nomax.txt 2>&1
row hf_tiny_llama/dist/0-8/float32 $sft pass dist-nomax.txt
row hf_tiny_llama/first-valid/dist/accum2-ragged/float32 $sft pass dist-nomax.txt
row hf_tiny_llama/dist/5-3/float32 trl/sft-noavg fail dist-nomax.txt
reason hf_tiny_llama/dist/5-3/float32 trl/sft-noavg \
  "every rank: step 0: gradients rel L2 error 0.223 > 1e-05" dist-nomax.txt

# A user's SFTTrainer subclasses from a file, as the variants of a scenario file.
"$gradnorm" run -f "$source_dir/examples/transformers/my_sft_trainer.toml" > mine.txt 2>&1
row mine/accum2-ragged/float32 mine/counts-valid-tokens pass mine.txt
row mine/accum2-ragged/float32 mine/mean-per-micro-batch fail mine.txt
expect "step 0: gradients rel L2 error 1.16 > 1e-05" mine.txt
row mine/accum2-empty-first/float32 mine/counts-valid-tokens pass mine.txt
row mine/accum2-empty-first/float32 mine/mean-per-micro-batch pass mine.txt

# TRL 1.16.0 beside transformers 4.57.6: 4.57.6 has no sequential sampler, so the rank's
# samples are served in its order (_InOrder); SFTTrainer divides by 4.57.6's count, which
# includes the label the shift drops (first label valid: rel. 0.333, one device and 2 ranks);
# 4.57.6 rounds the logged loss to 4 decimals.
# In the same run, max_length=None (a variant), and the negative control of the feeding proof
# on that path: an SFTTrainer that swaps the sequences of each micro-batch it is given is an
# error, not a verdict.
cat > swapped.py <<'PY'
import torch
from trl import SFTTrainer


class SwapsSequences(SFTTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = {k: v.flip(0) if torch.is_tensor(v) else v for k, v in inputs.items()}
        return super().training_step(model, inputs, num_items_in_batch)
PY
{
  variant trl/sft-max_length-None trl:sft max_length=None
  variant trl/swapped.SwapsSequences "trl:$work/swapped.py:SwapsSequences"
} > v4.toml
PYTHONPATH="$v4" "$gradnorm" run --recipe trl:sft -f v4.toml -s single/accum2-ragged/float32 \
  -s first-valid/single/accum2-ragged/float32 -s single/accum4-ragged/float32 --json v4.json > v4.txt 2>&1
row hf_tiny_llama/single/accum2-ragged/float32 $sft pass v4.txt
row hf_tiny_llama/first-valid/single/accum2-ragged/float32 $sft fail v4.txt
reason hf_tiny_llama/first-valid/single/accum2-ragged/float32 $sft \
  "step 0: gradients rel L2 error 0.333 > 1e-05" v4.txt
expect "trl 1.16.0's SFTTrainer (transformers 4.57.6), unmodified" v4.json
expect "trl/sft is trl 1.16.0's SFTTrainer (transformers 4.57.6), unmodified" v4.txt
row hf_tiny_llama/single/accum4-ragged/float32 trl/sft-max_length-None fail v4.txt
reason hf_tiny_llama/single/accum4-ragged/float32 trl/sft-max_length-None \
  "step 0: logged loss 2.3841, oracle 2.38405716" v4.txt
row hf_tiny_llama/single/accum2-ragged/float32 trl/swapped.SwapsSequences error-mismatch v4.txt
reason hf_tiny_llama/single/accum2-ragged/float32 trl/swapped.SwapsSequences \
  "the model was given input_ids that are not this window's micro-batches in order" v4.txt
PYTHONPATH="$v4" "$gradnorm" run --recipe trl:sft --nproc 2 -s dist/5-3/float32 \
  -s first-valid/dist/5-3/float32 > v4-dist.txt 2>&1
row hf_tiny_llama/dist/5-3/float32 $sft pass v4-dist.txt
row hf_tiny_llama/first-valid/dist/5-3/float32 $sft fail v4-dist.txt
expect "every rank: step 0: gradients rel L2 error 0.333 > 1e-05" v4-dist.txt

# A compute_loss_func with SFTTrainer: refused by name (SFTTrainer runs a second, no_grad
# forward for its metrics; every such run failed with a feeding error).
cat > loss_func.py <<'PY'
import torch


def token_mean(outputs, labels, num_items_in_batch=None):
    return torch.nn.functional.cross_entropy(outputs.logits[:, :-1].flatten(0, 1),
                                             labels[:, 1:].flatten(), ignore_index=-100)
PY
"$gradnorm" run --recipe "trl:$work/loss_func.py:token_mean" -s single/accum2-ragged/float32 \
  > loss-func.txt 2>&1
echo "loss func: exit $?" >> loss-func.txt
expect "token_mean is a function, and SFTTrainer with a compute_loss_func is not judged" loss-func.txt
expect "loss func: exit 2" loss-func.txt

# TRL 1.16.0 beside transformers 5.17.0: 5.18.0's verdicts.
PYTHONPATH="$v517" "$gradnorm" run --recipe trl:sft -s first-valid/single/accum2-ragged/float32 \
  --json v517.json > v517.txt 2>&1
row hf_tiny_llama/first-valid/single/accum2-ragged/float32 $sft pass v517.txt
expect "trl 1.16.0's SFTTrainer (transformers 5.17.0), unmodified" v517.json
PYTHONPATH="$v517" "$gradnorm" run --recipe trl:sft --nproc 2 -s first-valid/dist/5-3/float32 \
  > v517-dist.txt 2>&1
row hf_tiny_llama/first-valid/dist/5-3/float32 $sft pass v517-dist.txt

# Bad input: exit 2 before anything runs.
"$gradnorm" run --recipe trl:sft --recipe-arg train_sampling_strategy=random -s single/n3/float32 \
  > owned.txt 2>&1
echo "owned: exit $?" >> owned.txt
expect "--recipe-arg train_sampling_strategy: the scenario decides train_sampling_strategy" owned.txt
expect "owned: exit 2" owned.txt
"$gradnorm" run --recipe trl:sft --recipe-arg no_such_field=1 -s single/n3/float32 > unknown.txt 2>&1
echo "unknown: exit $?" >> unknown.txt
expect "trl 1.16.0's SFTConfig has no field 'no_such_field'" unknown.txt
expect "unknown: exit 2" unknown.txt
"$gradnorm" run --recipe trl:my_sft_trainer.py -s single/n3/float32 > shape.txt 2>&1
echo "shape: exit $?" >> shape.txt
expect "expected trl:sft or trl:PATH.py:NAME" shape.txt
expect "shape: exit 2" shape.txt
PYTHONPATH= "$gradnorm" run --recipe trl:sft -s single/n3/float32 > absent.txt 2>&1
echo "absent: exit $?" >> absent.txt
expect "trl does not import here" absent.txt
expect "absent: exit 2" absent.txt
# The TRL folder made for 5.x beside 4.57.6: trl imports lazily, and its trainer's import fails
# (datasets 5.2.0 needs huggingface_hub 1.x): exit 2 naming the cause and the folder to use.
PYTHONPATH="$overlay:$envdir/transformers-4.57.6" "$gradnorm" run --recipe trl:sft \
  -s single/n3/float32 > mixed.txt 2>&1
echo "mixed: exit $?" >> mixed.txt
expect "trl does not import here (ImportError: cannot import name" mixed.txt
expect ".venv/trl-1.16.0-transformers-4.57.6 before .venv/transformers-4.57.6" mixed.txt
expect "mixed: exit 2" mixed.txt
exit $failed
