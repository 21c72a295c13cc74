#!/usr/bin/env bash
# ctest: Hugging Face Transformers' Trainer, unmodified, judged on catalogue scenarios with
# transformers' own LlamaForCausalLM (examples/transformers/tiny_llama.py): 5.18.0 (the
# environment's) and 4.57.6 (the folder requirements-transformers4.txt installs, first on
# PYTHONPATH), on one device in-process and on 2 rank processes over Gloo DDP; the model
# without loss kwargs; average_tokens_across_devices off; a user's Trainer subclass and
# compute_loss_func from a file; the proof that each rank trains on its own micro-batches;
# 5.17.0 (requirements-transformers517.txt's folder) on the rows where 4.57.6 and 5.18.0 part;
# bad input (exit 2). The figures are the ones measured and explained in docs/findings.md
# ("Hugging Face Transformers' Trainer"). Skips (77) where transformers is not installed.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
gradnorm="$1"
source_dir="$2"
work="$3"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
v4="$(dirname "$(dirname "$python")")/transformers-4.57.6"
v517="$(dirname "$(dirname "$python")")/transformers-5.17.0"
source "$(dirname "${BASH_SOURCE[0]}")/require_packages.sh"
for env in "" "$v4" "$v517"; do require_packages "$env" transformers accelerate; done
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
unset PYTHONPATH
trainer=transformers/trainer
nk=python:$source_dir/examples/transformers/tiny_llama.py:hf_tiny_llama_no_loss_kwargs

# 5.18.0, one device: the contract on ragged accumulation and with the first label valid
# (it counts labels[..., 1:]); max_grad_norm = 0 does not clip; an all-masked window steps
# on zero gradients.
"$gradnorm" run --recipe transformers:trainer -s single/accum2-ragged/float32 \
  -s first-valid/single/accum2-ragged/float32 -s single/clip-zero/float32 \
  -s single/all-masked-mean_ce/float32 --json v5.json --markdown v5.md > v5.txt 2>&1
echo "v5: exit $?" >> v5.txt
row hf_tiny_llama/single/accum2-ragged/float32 $trainer pass v5.txt
row hf_tiny_llama/first-valid/single/accum2-ragged/float32 $trainer pass v5.txt
row hf_tiny_llama/single/clip-zero/float32 $trainer fail v5.txt
row hf_tiny_llama/single/all-masked-mean_ce/float32 $trainer error-mismatch v5.txt
expect "v5: exit 1" v5.txt
expect "transformers 5.18.0's Trainer, unmodified" v5.json
expect "transformers/trainer is transformers 5.18.0's Trainer, unmodified" v5.txt
expect "- \`transformers/trainer\` is transformers 5.18.0's Trainer, unmodified" v5.md
# The model without loss kwargs: each micro-batch's mean divided by the accumulation steps.
"$gradnorm" run --recipe transformers:trainer --recipe-model "$nk" -s single/accum2-ragged/float32 \
  > v5-nk.txt 2>&1
row hf_tiny_llama_no_loss_kwargs/single/accum2-ragged/float32 $trainer fail v5-nk.txt
expect "step 0: gradients rel L2 error 0.246 > 1e-05" v5-nk.txt

# 5.18.0 on 2 rank processes: tokens averaged across devices; then not.
"$gradnorm" run --recipe transformers:trainer --nproc 2 -s dist/5-3/float32 > v5-dist.txt 2>&1
echo "v5-dist: exit $?" >> v5-dist.txt
row hf_tiny_llama/dist/5-3/float32 $trainer pass v5-dist.txt
expect "v5-dist: exit 0" v5-dist.txt
# Framework chatter is held back (docs/reliability.md, "Quiet output"): torchao's import notice
# and DDP's reducer warning (find_unused_parameters) on every rank were printed into the table.
expect_not "Skipping import of cpp extensions" v5-dist.txt
expect_not "find_unused_parameters=True" v5-dist.txt
expect "gradnorm: the code under test printed" v5-dist.txt
# The rank processes below are forked warm from the supervisor (docs/ranks.md, "Warm rank
# processes"), as fuzz --nproc forks them; the run above exec'd its ranks, the default.
export GRADNORM_WARM_RANKS=1
# Off, as False and as the other spellings Hugging Face's own parser (HfArgumentParser) takes
# for False, as its command line and YAML configs spell them: variants of one run, each
# training without averaging. Before the value was parsed by that parser, "false" was the
# string "false", which is true: averaging stayed on and the row passed.
for spelling in False false no 0; do
  variant noavg/$spelling transformers:trainer average_tokens_across_devices=$spelling
done > noavg.toml
"$gradnorm" run --recipe transformers:trainer -f noavg.toml --nproc 2 -s dist/5-3/float32 > v5-noavg.txt 2>&1
row hf_tiny_llama/dist/5-3/float32 $trainer pass v5-noavg.txt
for spelling in False false no 0; do
  row hf_tiny_llama/dist/5-3/float32 noavg/$spelling fail v5-noavg.txt
  reason hf_tiny_llama/dist/5-3/float32 noavg/$spelling "every rank: step 0: gradients rel L2 error 0.223 > 1e-05" v5-noavg.txt
done
# A failing row shows what each rank's code said (LibTorch's warning, held on the rank's thread;
# LibTorch gives it once a process, so under the first failing row).
reason hf_tiny_llama/dist/5-3/float32 noavg/False "| [rank 1] Warning: find_unused_parameters=True was specified in DDP constructor" v5-noavg.txt
expect_not "[rank0]:[W" v5-noavg.txt

# 4.57.6: counts the label the model's shift drops; rounds the logged loss to 4 decimals.
PYTHONPATH="$v4" "$gradnorm" run --recipe transformers:trainer -s single/accum2-ragged/float32 \
  -s first-valid/single/accum2-ragged/float32 -s single/accum4-ragged/float32 --json v4.json \
  > v4.txt 2>&1
row hf_tiny_llama/single/accum2-ragged/float32 $trainer pass v4.txt
row hf_tiny_llama/first-valid/single/accum2-ragged/float32 $trainer fail v4.txt
expect "step 0: gradients rel L2 error 0.333 > 1e-05" v4.txt
row hf_tiny_llama/single/accum4-ragged/float32 $trainer fail v4.txt
expect "step 0: logged loss 2.3841, oracle 2.38405716" v4.txt
expect "transformers 4.57.6's Trainer, unmodified" v4.json
expect "transformers/trainer is transformers 4.57.6's Trainer, unmodified" v4.txt
PYTHONPATH="$v4" "$gradnorm" run --recipe transformers:trainer --nproc 2 -s dist/5-3/float32 \
  -s first-valid/dist/5-3/float32 > v4-dist.txt 2>&1
row hf_tiny_llama/dist/5-3/float32 $trainer pass v4-dist.txt
row hf_tiny_llama/first-valid/dist/5-3/float32 $trainer fail v4-dist.txt
expect "every rank: step 0: gradients rel L2 error 0.333 > 1e-05" v4-dist.txt

# 5.17.0: already counts labels[..., 1:] and logs the unrounded loss, as 5.18.0 does.
PYTHONPATH="$v517" "$gradnorm" run --recipe transformers:trainer -s single/accum4-ragged/float32 \
  -s first-valid/single/accum2-ragged/float32 --json v517.json > v517.txt 2>&1
row hf_tiny_llama/single/accum4-ragged/float32 $trainer pass v517.txt
row hf_tiny_llama/first-valid/single/accum2-ragged/float32 $trainer pass v517.txt
expect "transformers 5.17.0's Trainer, unmodified" v517.json
expect "transformers/trainer is transformers 5.17.0's Trainer, unmodified" v517.txt
PYTHONPATH="$v517" "$gradnorm" run --recipe transformers:trainer --nproc 2 \
  -s first-valid/dist/5-3/float32 > v517-dist.txt 2>&1
row hf_tiny_llama/first-valid/dist/5-3/float32 $trainer pass v517-dist.txt

# A user's Trainer code from a file, as the variants of a scenario file: a compute_loss_func
# that sums over num_items_in_batch passes; one that takes each micro-batch's mean fails on
# ragged accumulation; a subclass skipping empty micro-batches passes.
mine="$source_dir/examples/transformers/my_trainer.py"
"$gradnorm" run -f "$source_dir/examples/transformers/my_trainer.toml" > mine.txt 2>&1
row mine/accum2-ragged/float32 mine/summed-token-loss pass mine.txt
row mine/accum2-ragged/float32 mine/mean-token-loss fail mine.txt
expect "step 0: gradients rel L2 error 1.16 > 1e-05" mine.txt
row mine/accum2-ragged/float32 mine/skip-empty pass mine.txt
row mine/accum2-empty-first/float32 mine/skip-empty pass mine.txt

# A compute_loss_func whose return Trainer cannot backward failed inside Trainer's code and was
# located there; its return is checked where it returns, naming it. Control: summed_token_loss
# above passes.
cat > bad_losses.py <<'PY'
def as_float(outputs, labels, num_items_in_batch=None):
    return 1.0


def detached(outputs, labels, num_items_in_batch=None):
    return outputs.logits.detach().sum()


def per_token(outputs, labels, num_items_in_batch=None):
    return outputs.logits.sum(-1)
PY
# Negative control of the feeding proof, in the same run: a Trainer that swaps the sequences
# of each micro-batch it is given trains on what the scenario never gave: an error naming the rank.
cat > swapped.py <<'PY'
from transformers import Trainer


class SwapsSequences(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = {key: value.flip(0) for key, value in inputs.items()}
        return super().training_step(model, inputs, num_items_in_batch)
PY
{
  for bad in as_float detached per_token; do
    variant bad/$bad "transformers:$work/bad_losses.py:$bad"
  done
  variant transformers/swapped.SwapsSequences "transformers:$work/swapped.py:SwapsSequences"
} > bad_losses.toml
# Without --recipe, a scenario file's Trainer variants train the catalogue's scenarios on
# transformers' Llama, as --recipe does (they took torchtune's decoder: every row raised
# "TransformerDecoder.forward() got an unexpected keyword argument 'input_ids'").
"$gradnorm" run -f bad_losses.toml -s single/n3/float32 > bad.txt 2>&1
n3=hf_tiny_llama/single/n3/float32
reason $n3 bad/as_float "compute_loss_func $work/bad_losses.py:as_float returned float: Trainer backwards what it returns" bad.txt
reason $n3 bad/detached "compute_loss_func $work/bad_losses.py:detached returned a loss without grad" bad.txt
reason $n3 bad/per_token "compute_loss_func $work/bad_losses.py:per_token returned a tensor of shape [2, 8]" bad.txt
row $n3 transformers/swapped.SwapsSequences error-mismatch bad.txt
reason $n3 transformers/swapped.SwapsSequences "the model was given input_ids that are not this window's micro-batches in order" bad.txt
expect_not "TransformerDecoder" bad.txt
# Its control: variants of frameworks that train different models cannot share a catalogue
# scenario, an input error before anything runs.
{
  variant mixed/trainer transformers:trainer
  variant mixed/lightning "lightning:$source_dir/examples/lightning/mean_loss.py:MeanLoss"
} > mixed.toml
"$gradnorm" run -f mixed.toml -s single/n3/float32 > mixed.txt 2>&1
echo "mixed: exit $?" >> mixed.txt
expect "(transformers:trainer) trains tiny_llama.py:hf_tiny_llama and mixed.toml: variant #2" mixed.txt
expect "trains tiny_transformer.py:tiny_transformer: the catalogue's scenarios take one model" mixed.txt
expect "mixed: exit 2" mixed.txt

# A pull request that swaps Trainer's loss for a per-micro-batch mean, under one name: gradnorm
# diff names the regression and a command that reproduces it, which runs as printed (the row's
# scenario as the run reports it, hf_tiny_llama/...) and fails the same row.
"$gradnorm" run -q --recipe transformers:trainer --name hf/step -s single/accum2-ragged/float32 \
  -s single/n3/float32 --json base.json > base.txt 2>&1
"$gradnorm" run -q --recipe "transformers:$mine:mean_token_loss" --name hf/step \
  -s single/accum2-ragged/float32 -s single/n3/float32 --json head.json > head.txt 2>&1
"$gradnorm" diff base.json head.json --markdown comment.md > diff.txt 2>&1
echo "diff: exit $?" >> diff.txt
expect "diff: exit 1" diff.txt
expect "gradnorm: 1 regression" comment.md
reproduce=$(sed -n 's/.*reproduce: `\(gradnorm run [^`]*\)`.*/\1/p' comment.md)
expect "-s hf_tiny_llama/single/accum2-ragged/float32 -v hf/step" <(echo "$reproduce")
eval "\"\$gradnorm\" ${reproduce#gradnorm }" > reproduce.txt 2>&1
echo "reproduce: exit $?" >> reproduce.txt
row hf_tiny_llama/single/accum2-ragged/float32 hf/step fail reproduce.txt
expect "reproduce: exit 1" reproduce.txt

# The same on 2 rank processes: each rank's proof names that rank.
"$gradnorm" run --recipe "transformers:$work/swapped.py:SwapsSequences" --nproc 2 \
  -s dist/5-3/float32 > swapped-dist.txt 2>&1
row hf_tiny_llama/dist/5-3/float32 transformers/swapped.SwapsSequences error-mismatch swapped-dist.txt
expect "rank 0: raised RuntimeError (rank 0 step 0: the model was given input_ids" swapped-dist.txt
expect "rank 1: raised RuntimeError (rank 1 step 0: the model was given input_ids" swapped-dist.txt

# --recipe-arg max_grad_norm=V: Trainer clips to V and so does every scenario judged, named
# for it; one device and 2 ranks pass with the clip active (the unclipped gradients are about
# 176 times the clipped ones on single/n3). Negative control: a Trainer subclass that turns
# clipping off fails (rel. 176). The reproduce form of the name selects the same scenario.
cat > noclip.py <<'PY'
from transformers import Trainer


class NeverClips(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.args.max_grad_norm = 0.0
PY
variant noclip "transformers:$work/noclip.py:NeverClips" max_grad_norm=0.01 > noclip.toml
"$gradnorm" run --recipe transformers:trainer --recipe-arg max_grad_norm=0.01 -f noclip.toml \
  -s single/n3/float32 -s single/accum2-ragged/float32 > clip.txt 2>&1
row "hf_tiny_llama/single/n3/float32@max_grad_norm=0.01" $trainer pass clip.txt
row "hf_tiny_llama/single/accum2-ragged/float32@max_grad_norm=0.01" $trainer pass clip.txt
row "hf_tiny_llama/single/n3/float32@max_grad_norm=0.01" noclip fail clip.txt
reason "hf_tiny_llama/single/n3/float32@max_grad_norm=0.01" noclip "step 0: gradients rel L2 error 176 > 1e-05" clip.txt
"$gradnorm" run --recipe transformers:trainer --recipe-arg max_grad_norm=0.01 --nproc 2 \
  -s "hf_tiny_llama/dist/5-3/float32@max_grad_norm=0.01" > clip-dist.txt 2>&1
row "hf_tiny_llama/dist/5-3/float32@max_grad_norm=0.01" $trainer pass clip-dist.txt
# That name without the --recipe-arg (or with another V) is no scenario of the run: exit 2.
"$gradnorm" run --recipe transformers:trainer -s "hf_tiny_llama/single/n3/float32@max_grad_norm=0.01" \
  > clip-unasked.txt 2>&1
echo "clip-unasked: exit $?" >> clip-unasked.txt
expect "unknown scenario 'single/n3/float32@max_grad_norm=0.01'" clip-unasked.txt
expect "clip-unasked: exit 2" clip-unasked.txt
# A scenario file's recipe_args that clip otherwise than its scenario: the pair is left out.
cat > clipfile.toml <<TOML
[[variant]]
name = "mine/clips"
recipe = "transformers:trainer"
recipe_args = ["max_grad_norm=0.5"]

[[scenario]]
name = "mine/n3/float32"
valid_tokens = [[3]]
model = "python:$source_dir/examples/transformers/tiny_llama.py:hf_tiny_llama"
TOML
"$gradnorm" run -f clipfile.toml --json clipfile.json > clipfile.txt 2>&1
echo "clipfile: exit $?" >> clipfile.txt
expect "max_grad_norm=0.5 would clip where the scenario does not clip" clipfile.txt
# ... and, that being every pair, nothing is judged: exit 2, no report.
expect "nothing to judge: every selected pair is left out (1)" clipfile.txt
expect "clipfile: exit 2" clipfile.txt
[ ! -e clipfile.json ] || { echo "FAIL: a report of no row was written"; failed=1; }

# Bad input: exit 2 before anything runs.
"$gradnorm" run --recipe transformers:trainer --recipe-arg max_grad_norm=-1 -s single/n3/float32 \
  > negative-clip.txt 2>&1
echo "negative-clip: exit $?" >> negative-clip.txt
expect "--recipe-arg max_grad_norm=-1: max_grad_norm is a number >= 0" negative-clip.txt
expect "negative-clip: exit 2" negative-clip.txt
"$gradnorm" run --recipe transformers:trainer --recipe-arg gradient_accumulation_steps=4 \
  -s single/n3/float32 > owned.txt 2>&1
echo "owned: exit $?" >> owned.txt
expect "--recipe-arg gradient_accumulation_steps: the scenario decides gradient_accumulation_steps" owned.txt
expect "owned: exit 2" owned.txt
"$gradnorm" run --recipe transformers:trainer --recipe-arg no_such_field=1 -s single/n3/float32 \
  > unknown.txt 2>&1
echo "unknown: exit $?" >> unknown.txt
expect "TrainingArguments has no field 'no_such_field'" unknown.txt
expect "unknown: exit 2" unknown.txt
"$gradnorm" run --recipe transformers:trainer --recipe-arg average_tokens_across_devices=maybe \
  -s single/n3/float32 > refused.txt 2>&1
echo "refused: exit $?" >> refused.txt
expect "--recipe-arg average_tokens_across_devices=maybe: transformers 5.18.0's HfArgumentParser refuses it" refused.txt
expect "refused: exit 2" refused.txt
"$gradnorm" run --recipe transformers:trainer --recipe-arg warmup_steps=abc -s single/n3/float32 \
  > refused-number.txt 2>&1
echo "refused-number: exit $?" >> refused-number.txt
expect "HfArgumentParser refuses it" refused-number.txt
expect "refused-number: exit 2" refused-number.txt
"$gradnorm" run --recipe "transformers:$mine:NoSuchTrainer" -s single/n3/float32 > missing.txt 2>&1
echo "missing: exit $?" >> missing.txt
expect "defines no Trainer subclass or function named 'NoSuchTrainer'" missing.txt
expect "missing: exit 2" missing.txt
"$gradnorm" run --recipe transformers:trainer -s dist/5-3/float32 > threads.txt 2>&1
expect "Trainer on W ranks needs a torch.distributed process group" threads.txt
exit $failed
