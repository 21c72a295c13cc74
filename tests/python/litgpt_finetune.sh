#!/usr/bin/env bash
# ctest: litgpt's finetune_full and finetune_lora (litgpt 0.5.13, requirements-litgpt.txt's folder, first on
# PYTHONPATH beside transformers 4.57.6's), unmodified, run through litgpt's own command line on
# its own GPT (examples/litgpt/tiny_gpt.py), on one device: the scenarios it can train (2 steps
# or more, no clipping) and those it cannot, with the reason; a negative control for each duty of
# the adapter, each a copy of litgpt's package with finetune/full.py patched at test time
# (zero_grad deleted, the input reversed, twice the loss logged); Lightning Fabric refusing its
# FSDP off a GPU on 2 ranks; bad input (exit 2). The figures are the ones measured and explained
# in docs/findings.md ("litgpt"). Skips (77) where litgpt is not installed.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
gradnorm="$1"
source_dir="$2"
work="$3"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
envdir="$(dirname "$(dirname "$python")")"
overlay="$envdir/litgpt-0.5.13:$envdir/transformers-4.57.6"
source "$(dirname "${BASH_SOURCE[0]}")/require_packages.sh"
require_packages "$overlay" litgpt
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
export PYTHONPATH="$overlay"
full=litgpt/finetune_full
scenarios=$source_dir/tests/python/litgpt/scenarios.toml

# One device: one micro-batch a window passes over 2 and 3 steps; ragged accumulation fails
# (each micro-batch's mean divided by the accumulation), an empty micro-batch halves the window.
"$gradnorm" run --recipe litgpt:finetune_full -s single/n5-momentum-3steps/float32 \
  -s single/n5-momentum-3steps/bfloat16 -f "$scenarios" -s 'litgpt/*' -s single/n5/float32 \
  --json full.json > full.txt 2>&1
echo "full: exit $?" >> full.txt
row tiny_gpt/single/n5-momentum-3steps/float32 $full pass full.txt
row tiny_gpt/single/n5-momentum-3steps/bfloat16 $full pass full.txt
row litgpt/n5-2steps $full pass full.txt
row litgpt/accum2-ragged-3steps $full fail full.txt
expect "step 0: gradients rel L2 error 0.175 > 1e-05" full.txt
expect "step 0: logged loss 3.10447407, oracle 3.04878836" full.txt
row litgpt/accum2-empty-first-2steps $full fail full.txt
expect "step 0: logged loss 1.50367141, oracle 3.00734285" full.txt
expect "litgpt's finetune_full cannot train fewer than 2 steps" full.txt
"$gradnorm" run --recipe litgpt:finetune_full -f "$scenarios" -s 'litgpt/n5-2steps' \
  -s litgpt/n5-2steps-clip > clip.txt 2>&1
expect "1 pairs left out" clip.txt
expect "litgpt's finetune_full does not clip" clip.txt
expect "full: exit 1" full.txt
expect "litgpt 0.5.13's finetune_full, unmodified" full.json

# finetune_lora on litgpt's LoRA GPT (tiny_gpt_lora: rank 2 on query and value, no dropout):
# the same arithmetic on the LoRA matrices.
lora=litgpt/finetune_lora
"$gradnorm" run --recipe litgpt:finetune_lora -s single/n5-momentum-3steps/float32 -f "$scenarios" \
  -s 'litgpt-lora/*' > lora.txt 2>&1
row tiny_gpt_lora/single/n5-momentum-3steps/float32 $lora pass lora.txt
row litgpt-lora/accum2-ragged-3steps $lora fail lora.txt
expect "step 0: gradients rel L2 error 0.184 > 1e-05" lora.txt
row litgpt-lora/accum2-empty-first-2steps $lora fail lora.txt
expect "step 0: logged loss 1.3054446, oracle 2.61088924" lora.txt
expect "litgpt 0.5.13's finetune_lora, unmodified" lora.txt
"$gradnorm" run --recipe litgpt:finetune_lora --nproc 2 -s dist/5-3/float32 > lora-dist.txt 2>&1
echo "lora-dist: exit $?" >> lora-dist.txt
expect "ModelParallelStrategy" lora-dist.txt
expect "lora-dist: exit 2" lora-dist.txt

# 2 ranks: litgpt asks Fabric for FSDP, which it refuses off a GPU; left out with that reason.
"$gradnorm" run --recipe litgpt:finetune_full --nproc 2 -s dist/5-3/float32 > dist.txt 2>&1
echo "dist: exit $?" >> dist.txt
expect "FSDP is only available on GPU" dist.txt
expect "dist: exit 2" dist.txt

# Negative controls: litgpt's package copied, finetune/full.py patched, first on PYTHONPATH.
patched() {  # patched NAME OLD NEW: a copy of litgpt with OLD replaced by NEW in full.py
  local name=$1 old=$2 new=$3
  mkdir -p "$name"
  cp -r "$envdir/litgpt-0.5.13/litgpt" "$name/"
  "$python" - "$name/litgpt/finetune/full.py" "$old" "$new" <<'PY' || failed=1
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if text.count(old) != 1:
    sys.exit("FAIL: %r is not in %s exactly once" % (old, path))
open(path, "w").write(text.replace(old, new))
PY
}
patched zero-grad "            optimizer.zero_grad()
" ""
PYTHONPATH="$work/zero-grad:$PYTHONPATH" "$gradnorm" run --recipe litgpt:finetune_full \
  -s single/n5-momentum-3steps/float32 > zero-grad.txt 2>&1
row tiny_gpt/single/n5-momentum-3steps/float32 $full fail zero-grad.txt
expect "step 1: gradients rel L2 error" zero-grad.txt
patched reversed "            logits = model(input_ids)
            # shift" "            logits = model(input_ids.flip(-1))
            # shift"
PYTHONPATH="$work/reversed:$PYTHONPATH" "$gradnorm" run --recipe litgpt:finetune_full \
  -s single/n5-momentum-3steps/float32 > reversed.txt 2>&1
expect "rank 0 step 0: the model was given input_ids that are not this window's micro-batches in order" reversed.txt
patched doubled '"loss": loss,' '"loss": 2 * loss,'
PYTHONPATH="$work/doubled:$PYTHONPATH" "$gradnorm" run --recipe litgpt:finetune_full \
  -s single/n5-momentum-3steps/float32 > doubled.txt 2>&1
row tiny_gpt/single/n5-momentum-3steps/float32 $full fail doubled.txt
expect "step 0: logged loss" doubled.txt

# Bad input: exit 2 before anything runs.
bad() {  # bad NAME TEXT ARGS...
  local name=$1 text=$2
  shift 2
  "$gradnorm" run "$@" -s single/n5-momentum-3steps/float32 > "$name.txt" 2>&1
  echo "$name: exit $?" >> "$name.txt"
  expect "$name: exit 2" "$name.txt"
  expect "$text" "$name.txt"
}
bad refused "litgpt's command line refuses --seed=abc" --recipe litgpt:finetune_full --recipe-arg seed=abc
bad unknown "Unrecognized arguments: --nope=1" --recipe litgpt:finetune_full --recipe-arg nope=1
bad owned "the scenario decides train.max_steps" --recipe litgpt:finetune_full --recipe-arg train.max_steps=9
bad script "gradnorm drives litgpt's finetune_full, finetune_lora" --recipe litgpt:pretrain
bad lora-owned "the scenario decides lora_r" --recipe litgpt:finetune_lora --recipe-arg lora_r=4

exit $failed
