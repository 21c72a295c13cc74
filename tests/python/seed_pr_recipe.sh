#!/usr/bin/env bash
# ctest: the seed's pull request on the real file. Takes the installed torchtune's own
# recipes/full_finetune_single_device.py, applies at test time (text patches below, no
# torchtune code committed) the pull request's skip and, one by one, its three regressions,
# and judges each copy with `gradnorm run --recipe torchtune:PATH.py`:
#   - the correct skip passes on one device;
#   - optimizer step inside the skip gate, clipping inside it, and the logged loss divided
#     by N are each caught;
#   - `gradnorm diff` of the original against each edit names the regression and its
#     reproduce command.
# Skips (77) where torchtune is not installed, saying why.
# Arguments: GRADNORM_BINARY WORK_DIR
set -uo pipefail
gradnorm="$1"
work="$2"
source "$(dirname "${BASH_SOURCE[0]}")/torchtune_common.sh"

# The patches: each a list of (old, new) replacements, every old text found exactly once.
"$python" - <<'EOF' || exit 1
import os, sys
import torchtune
root = os.path.dirname(os.path.dirname(os.path.abspath(torchtune.__file__)))
original = open(os.path.join(root, "recipes", "full_finetune_single_device.py")).read()

I = " " * 16  # the loop body's indent
loss_old = (I + "current_loss = self._loss_step(batch) * current_num_tokens\n"
            + I + "running_loss += current_loss\n"
            + I + "current_loss.backward()\n")
# The pull request: with no accumulation and no optimizer in backward, backward the mean
# itself and do not scale the gradients afterwards; the logged loss is the mean.
loss_skip = (I + "skip = self._gradient_accumulation_steps == 1 and not self._optimizer_in_bwd\n"
             + I + "if skip:\n"
             + I + "    current_loss = self._loss_step(batch)\n"
             + I + "    running_loss += current_loss.detach()\n"
             + I + "else:\n"
             + I + "    current_loss = self._loss_step(batch) * current_num_tokens\n"
             + I + "    running_loss += current_loss\n"
             + I + "current_loss.backward()\n")
J = " " * 24  # inside `if not self._optimizer_in_bwd:`
scale_old = J + "training.scale_grads(self._model, 1 / num_tokens)\n"
scale_skip = J + "if not skip:\n" + J + "    training.scale_grads(self._model, 1 / num_tokens)\n"
clip_old = (J + "if self._clip_grad_norm is not None:\n"
            + J + "    grad_norm = torch.nn.utils.clip_grad_norm_(\n"
            + J + "        self._model.parameters(),\n"
            + J + "        max_norm=float(self._clip_grad_norm),\n"
            + J + "    )\n")
step_old = (J + "self._optimizer.step()\n"
            + J + "self._optimizer.zero_grad(set_to_none=True)\n")
log_old = " " * 20 + "loss_to_log = running_loss.item() / num_tokens\n"
log_skip = (" " * 20 + "loss_to_log = (running_loss.item() if skip\n"
            + " " * 20 + "               else running_loss.item() / num_tokens)\n")


def indented(text, by=4):
    return "".join(" " * by + line if line.strip() else line for line in text.splitlines(True))


skip = [(loss_old, loss_skip), (scale_old, scale_skip), (log_old, log_skip)]
edits = {
    "skip": skip,
    # The optimizer step moved inside the gate: a skipped scaling also skips the step.
    "step-inside-skip-gate": [(loss_old, loss_skip), (log_old, log_skip),
                              (scale_old + clip_old + step_old,
                               scale_skip + clip_old + J + "if not skip:\n" + indented(step_old))],
    # Clipping moved inside the gate: a skipped scaling also skips the clip.
    "clip-inside-skip-gate": [(loss_old, loss_skip), (log_old, log_skip),
                              (scale_old + clip_old,
                               J + "if not skip:\n" + indented(scale_old + clip_old))],
    # The logged loss divided by N on the skip path too (a mean divided again).
    "logged-loss-divided-by-n": [(loss_old, loss_skip), (scale_old, scale_skip)],
}
open("original.py", "w").write(original)
for name, replacements in edits.items():
    text = original
    for old, new in replacements:
        if text.count(old) != 1:
            sys.exit("patch %s: the text to replace occurs %d times in the installed recipe "
                     "(not torchtune 0.6.1?):\n%s" % (name, text.count(old), old))
        text = text.replace(old, new)
    open(name + ".py", "w").write(text)
EOF

scenarios=(-s single/n3/float32 -s single/clip-active/float32 -s single/accum2-ragged/float32)
run() {  # run NAME: judge NAME.py, write NAME.json and NAME.txt
  "$gradnorm" run --recipe "torchtune:$work/$1.py" --name torchtune/recipe "${scenarios[@]}" \
    --json "$1.json" > "$1.txt" 2>&1
  echo "$1: exit $?" >> "$1.txt"
}
for name in original skip step-inside-skip-gate clip-inside-skip-gate logged-loss-divided-by-n; do
  run "$name"
done

expect "3 rows: 3 pass, 0 fail" original.txt
expect "original: exit 0" original.txt
expect "3 rows: 3 pass, 0 fail" skip.txt
expect "skip: exit 0" skip.txt
# Each regression fails where the C++ negative controls say it is visible.
expect "tiny_llama/single/n3/float32 x torchtune/recipe (expected agree): fail" step-inside-skip-gate.txt
expect "parameter update" step-inside-skip-gate.txt
# On the real file the clip inside the gate leaves grad_norm unbound where the recipe logs it
# (`if self._clip_grad_norm is not None: log_dict.update({"grad_norm": grad_norm})`): the
# recipe raises instead of stepping unclipped. Caught as an error where the oracle steps.
expect "tiny_llama/single/clip-active/float32 x torchtune/recipe (expected agree): error-mismatch" clip-inside-skip-gate.txt
expect "raised UnboundLocalError (cannot access local variable 'grad_norm'" clip-inside-skip-gate.txt
expect "tiny_llama/single/n3/float32 x torchtune/recipe (expected agree): fail" logged-loss-divided-by-n.txt
expect "logged loss" logged-loss-divided-by-n.txt
# Regressions: the gate is open (no accumulation) on n3 and clip-active, closed on accum2.
declare -A regressions=([step-inside-skip-gate]=2 [clip-inside-skip-gate]=1 [logged-loss-divided-by-n]=2)
for name in step-inside-skip-gate clip-inside-skip-gate logged-loss-divided-by-n; do
  expect "$name: exit 1" "$name.txt"
  "$gradnorm" diff original.json "$name.json" --markdown "$name.md" > "$name.diff.txt" 2>&1
  echo "diff: exit $?" >> "$name.diff.txt"
  expect "diff: exit 1" "$name.diff.txt"
  expect "Regressions (${regressions[$name]})" "$name.md"
  expect "reproduce: \`gradnorm run --recipe torchtune:$work/$name.py --name torchtune/recipe -s tiny_llama/single/" "$name.md"
done
expect "step 0: the optimizer consumed no gradient" step-inside-skip-gate.md
expect "logged loss" logged-loss-divided-by-n.md
# The correct skip is no regression.
"$gradnorm" diff original.json skip.json --markdown skip.md > skip.diff.txt 2>&1
echo "diff: exit $?" >> skip.diff.txt
expect "diff: exit 0" skip.diff.txt
exit $failed
