#!/usr/bin/env bash
# ctest: the duties every framework adapter has (python/gradnorm_frameworks.py and
# python/adapters/), each with a case that fails if the adapter gets it wrong, for torchtune,
# Transformers' Trainer and TRL's SFTTrainer (Lightning's are in lightning_trainer.sh):
# - it passes the scenario's clip to the framework: single/clip-active passes;
# - it serves the step asked for, not the current one, and resumes the run once per step:
#   single/n5-momentum-3steps (3 steps, momentum) passes;
# - it resets nothing of the framework's: a framework copy that forgets zero_grad, patched at
#   test time (a recipe file with the line deleted, Trainer subclasses whose model's zero_grad
#   does nothing), fails that scenario at step 1;
# - what rank 0 logged reaches every rank whole: full_finetune_distributed on
#   dist/5-3-clip-active (its grad_norm) passes on 2 rank processes.
# Skips (77) where torchtune, transformers or TRL is not installed.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
gradnorm="$1"
source_dir="$2"
work="$3"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
trl="$(dirname "$(dirname "$python")")/trl-1.16.0"
source "$(dirname "${BASH_SOURCE[0]}")/require_packages.sh"
require_packages "$trl" torchtune transformers trl
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
unset PYTHONPATH
trainers=$source_dir/tests/python/duties/trainers.py
momentum=single/n5-momentum-3steps/float32

# torchtune: the installed recipe, and a copy without its zero_grad.
recipe=$("$python" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(os.path.dirname(importlib.util.find_spec("torchtune").origin)), "recipes", "full_finetune_single_device.py"))')
grep -v '^ *self._optimizer.zero_grad(set_to_none=True)$' "$recipe" > no_zero_grad.py
if [ "$(diff "$recipe" no_zero_grad.py | grep -c '^<')" != 1 ]; then
  echo "FAIL: $recipe does not hold exactly one zero_grad line to delete"; failed=1
fi
# Each framework's recipe and its copy that does one duty wrong: one run, the copy a variant of
# a scenario file.
variant torchtune/no_zero_grad "torchtune:$work/no_zero_grad.py" > torchtune.toml
"$gradnorm" run --recipe torchtune:full_finetune_single_device -f torchtune.toml \
  -s single/clip-active/float32 -s $momentum > torchtune.txt 2>&1
row tiny_llama/single/clip-active/float32 torchtune/full_finetune_single_device pass torchtune.txt
row tiny_llama/$momentum torchtune/full_finetune_single_device pass torchtune.txt
row tiny_llama/$momentum torchtune/no_zero_grad fail torchtune.txt
reason tiny_llama/$momentum torchtune/no_zero_grad "step 1: gradients rel L2 error 0.206 > 1e-05" torchtune.txt
"$gradnorm" run --recipe torchtune:full_finetune_distributed --nproc 2 -s dist/5-3-clip-active/float32 \
  > torchtune-dist.txt 2>&1
row tiny_llama/dist/5-3-clip-active/float32 torchtune/full_finetune_distributed pass torchtune-dist.txt

# Transformers' Trainer.
variant transformers/trainers.TrainerForgetsZeroGrad "transformers:$trainers:TrainerForgetsZeroGrad" \
  > trainer.toml
"$gradnorm" run --recipe transformers:trainer -f trainer.toml -s single/clip-active/float32 -s $momentum \
  > trainer.txt 2>&1
row hf_tiny_llama/single/clip-active/float32 transformers/trainer pass trainer.txt
row hf_tiny_llama/$momentum transformers/trainer pass trainer.txt
row hf_tiny_llama/$momentum transformers/trainers.TrainerForgetsZeroGrad fail trainer.txt
reason hf_tiny_llama/$momentum transformers/trainers.TrainerForgetsZeroGrad \
  "step 1: gradients rel L2 error 0.392 > 1e-05" trainer.txt

# TRL's SFTTrainer (max_length=None: its preparation keeps sequences without a valid label).
export PYTHONPATH="$trl"
variant trl/trainers.SftForgetsZeroGrad "trl:$trainers:SftForgetsZeroGrad" max_length=None > sft.toml
"$gradnorm" run --recipe trl:sft --recipe-arg max_length=None -f sft.toml -s single/clip-active/float32 \
  -s $momentum > sft.txt 2>&1
row hf_tiny_llama/single/clip-active/float32 trl/sft pass sft.txt
row hf_tiny_llama/$momentum trl/sft pass sft.txt
row hf_tiny_llama/$momentum trl/trainers.SftForgetsZeroGrad fail sft.txt
reason hf_tiny_llama/$momentum trl/trainers.SftForgetsZeroGrad "step 1: gradients rel L2 error 0.392 > 1e-05" sft.txt

exit $failed
