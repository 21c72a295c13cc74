#!/usr/bin/env python3
"""The framework adapters' mutation audit: each mutant below is a way an adapter could lie (not
pass the clip, clear the framework's gradients, serve the wrong step, lose rank 0's grad_norm),
applied to the source, built, and run on the case a ctest has for it; the mutant is caught when
that case's verdict changes from what the test expects. Restores every file and rebuilds at the
end. Exit 0 when every mutant is caught, 1 otherwise. It takes minutes (a build per mutant), so
it is a command, not a test:

    python3 scripts/adapter-mutants.py          # after scripts/test.sh built ./build

Needs the frameworks' folders scripts/install-deps.sh makes, and the copy of torchtune's recipe
without zero_grad that tests/python/adapter_duties.sh leaves in build/adapter-duties-test.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("GRADNORM_VENV", os.path.join(ROOT, ".venv"))
G = os.path.join(ROOT, "build", "tools", "gradnorm")
TRL = {"PYTHONPATH": os.path.join(VENV, "trl-1.16.0")}
LITGPT = {"PYTHONPATH": os.path.join(VENV, "litgpt-0.5.13") + ":" + os.path.join(VENV, "transformers-4.57.6")}
MOMENTUM = ["-s", "single/n5-momentum-3steps/float32"]
CLIP = ["-s", "single/clip-active/float32"]
DS_TOKENS = "deepspeed:examples/deepspeed/token_loss.py:train"
DS_STEPS = ["-f", "tests/python/lightning/scenarios.toml", "-s", "lightning/dist*"]
NO_ZERO_GRAD = os.path.join(ROOT, "build", "adapter-duties-test", "no_zero_grad.py")


def run(recipe, *args, env=None, expect):
    return ([G, "run", "--recipe", recipe, *args], env or {}, expect)


# (name, file, text, mutated text, [(command, environment, the verdict the test expects)])
MUTANTS = [
    ("Trainer not given the clip", "python/adapters/transformers.py",
     "max_grad_norm=0.0 if clip is None else float(clip))", "max_grad_norm=0.0)",
     [run("transformers:trainer", *CLIP, expect="pass"),
      run("trl:sft", "--recipe-arg", "max_length=None", *CLIP, env=TRL, expect="pass")]),
    ("Lightning not given the clip", "python/adapters/lightning.py",
     "gradient_clip_val=None if clip is None else float(clip),", "gradient_clip_val=None,",
     [run("lightning:examples/lightning/mean_loss.py:MeanLoss", *CLIP, expect="pass")]),
    ("Fabric loop not given the clip", "python/adapters/fabric.py",
     "None if clip is None else float(clip))", "None)",
     [run("fabric:examples/fabric/loops.py:token_loop", *CLIP, expect="pass")]),
    ("the adapter clears the framework's gradients", "python/gradnorm_frameworks.py",
     "                self.write(p, target.detach())\n",
     "                self.write(p, target.detach())\n                p.grad = None\n",
     [run("torchtune:" + NO_ZERO_GRAD, *MOMENTUM, expect="fail"),
      run("transformers:tests/python/duties/trainers.py:TrainerForgetsZeroGrad", *MOMENTUM,
          expect="fail"),
      run("trl:tests/python/duties/trainers.py:SftForgetsZeroGrad", "--recipe-arg",
          "max_length=None", *MOMENTUM, env=TRL, expect="fail"),
      run("lightning:tests/python/lightning/modules.py:ForgetsZeroGrad", *MOMENTUM, expect="fail"),
      run("fabric:tests/python/lightning/loops.py:forgets_zero_grad", "-f",
          "tests/python/lightning/scenarios.toml", "-s", "lightning/accum2*", expect="fail")]),
    ("Accelerate loop not given the clip", "python/adapters/accelerate.py",
     "None if clip is None else float(clip))", "None)",
     [run("accelerate:examples/accelerate/token_loss.py:train", *CLIP, expect="pass")]),
    ("DeepSpeed's engine not given the clip", "python/adapters/deepspeed.py",
     '"gradient_clipping": 0.0 if clip is None else float(clip),', '"gradient_clipping": 0.0,',
     [run(DS_TOKENS, "--nproc", "2", "-s", "dist/5-3-clip-active/float32", expect="pass")]),
    ("ZeRO's update written to the model, not to its fp32 partition",
     "python/adapters/deepspeed.py", "        safe_set_full_fp32_param(param, value)\n",
     "        super().write(param, value)\n",
     [run(DS_TOKENS, "--nproc", "2", "--recipe-arg", "zero_optimization.stage=2", *DS_STEPS,
          expect="pass")]),
    ("ZeRO's gradient read from this rank's partition alone", "python/adapters/deepspeed.py",
     "        dist.all_reduce(buffer, group=param._dp_group)\n", "",
     [run(DS_TOKENS, "--nproc", "2", "--recipe-arg", "zero_optimization.stage=1", "-s",
          "dist/5-3/float32", expect="pass")]),
    ("DeepSpeed's logged loss read from the monitor's first row", "python/adapters/deepspeed.py",
     'self.logged[self.stepped] = {"loss": float(rows[-1][1])}',
     'self.logged[self.stepped] = {"loss": float(rows[0][1])}',
     [run(DS_TOKENS, "--nproc", "2", *DS_STEPS, expect="pass")]),
    ("Trainer's dataset serves the current step", "python/adapters/transformers.py",
     "_gf.aligned_sample(run.batches_of(step)[micro], row)",
     "_gf.aligned_sample(run.ctx.micro_batches[micro], row)",
     [run("transformers:trainer", *MOMENTUM, expect="pass")]),
    ("Lightning's dataset serves the current step", "python/adapters/lightning.py",
     "_gf.aligned_sample(run.ctx.batches_of(step)[micro], row)",
     "_gf.aligned_sample(run.ctx.micro_batches[micro], row)",
     [run("lightning:examples/lightning/mean_loss.py:MeanLoss", *MOMENTUM, expect="pass")]),
    ("rank 0's log loses grad_norm", "python/gradnorm_frameworks.py",
     '    keys = ("loss_to_log", "grad_norm")\n', '    keys = ("loss_to_log",)\n',
     [run("torchtune:full_finetune_distributed", "--nproc", "2", "-s",
          "dist/5-3-clip-active/float32", expect="pass"),
      run("lightning:examples/lightning/token_normalised.py:TokenNormalised", "--nproc", "2",
          "-s", "dist/5-3-clip-active/float32", expect="pass")]),
    ("litgpt's logged loss read a window late", "python/adapters/litgpt.py",
     "iteration = step * self.accumulation_steps",
     "iteration = (step + 1) * self.accumulation_steps",
     [run("litgpt:finetune_full", *MOMENTUM, env=LITGPT, expect="pass")]),
]


def build():
    done = subprocess.run(["cmake", "--build", "build", "--target", "gradnorm"], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit("adapter-mutants: the build failed:\n" + done.stdout[-3000:])


def verdicts(command, env):
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, **env))
    # A table row: scenario, variant, N, verdict (the summary line, "1 rows: ...", is none).
    rows = [line for line in done.stdout.splitlines()
            if re.match(r"^\S+ +\S+ +\d+ (pass|fail|expected-error|error-mismatch) ", line)]
    return [line.split()[3] for line in rows] or ["exit %d" % done.returncode]


def main():
    survivors = 0
    for name, path, old, new, cases in MUTANTS:
        path = os.path.join(ROOT, path)
        with open(path, encoding="utf-8") as source:
            text = source.read()
        if text.count(old) != 1:
            sys.exit("adapter-mutants: %s: the text to mutate is in %s %d times"
                     % (name, path, text.count(old)))
        with open(path, "w", encoding="utf-8") as source:
            source.write(text.replace(old, new))
        try:
            build()
            for command, env, expect in cases:
                got = verdicts(command, env)
                caught = got != [expect]
                survivors += not caught
                print("%-45s %-8s %-60s expected %s, got %s" % (
                    name, "caught" if caught else "SURVIVED", command[3][:60], expect,
                    ", ".join(got)), flush=True)
        finally:
            with open(path, "w", encoding="utf-8") as source:
                source.write(text)
    build()
    print("adapter-mutants: %d of %d cases survived" % (
        survivors, sum(len(cases) for *_, cases in MUTANTS)))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
