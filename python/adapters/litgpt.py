"""litgpt's fine-tuning script, unmodified, judged as a gradnorm step (docs/frameworks.md): the
adapter for ``--recipe litgpt:finetune_full``. It runs litgpt's own command line
(``litgpt finetune_full CHECKPOINT_DIR ...``, litgpt/__main__.py), which parses the arguments,
builds its own Fabric, model, optimizer, schedule and logger, and trains with its own loop
(litgpt/finetune/full.py's ``fit``). What gradnorm gives it, all through that command line:

* the checkpoint directory: the scenario's model must be litgpt's ``GPT`` (for built-in models,
  examples/litgpt/tiny_gpt.py); its config is written as ``model_config.yaml`` (litgpt's own
  ``save_config``) and the harness's initial parameters as ``lit_model.pth``, beside a
  word-level tokenizer over the scenario's vocabulary (the data is already tokens);
* ``--data gradnorm_litgpt.ScenarioData``: a litgpt ``DataModule`` whose training dataloader
  serves this rank's micro-batches in order, labels aligned with ``input_ids`` and -100 where
  not valid (litgpt's loop shifts them), and whose validation dataloader serves the same
  samples (litgpt checks its settings on two of them before training);
* ``--optimizer gradnorm_frameworks.Optimizer``: litgpt instantiates it by class path
  (litgpt/utils.py ``instantiate_torch_optimizer``), so its ``step()`` hands what litgpt's loop
  produced to the harness;
* ``--train.*``: ``micro_batch_size`` the scenario's, ``global_batch_size`` its window over
  every rank, ``max_steps`` its steps in one epoch, ``log_interval`` 1, no checkpoint saved
  during the run; ``--logger_name csv``: the logged loss is what litgpt writes to its
  ``metrics.csv`` at the window's last micro-batch (what a user reads);
* the model litgpt builds itself from that checkpoint; a forward pre-hook on it (through
  torch's global module hook, removed between steps: litgpt gives no handle on its model)
  records what reaches it in training, for the feeding proof, and gives the hand-over the
  parameters' names.

``--recipe-arg KEY=VALUE`` passes ``--KEY=VALUE`` to litgpt's command line (jsonargparse, its
own parser): ``train.lr_warmup_steps=2``, ``seed=7``. litgpt sets
``torch.set_float32_matmul_precision("high")`` as it starts; gradnorm restores the process's
setting between steps.
"""

import csv
import os
import sys
import tempfile

import torch

import gradnorm_frameworks as _gf
import gradnorm_torch as _gt

# script -> (its file under litgpt/, the model class it builds, LoRA settings it takes)
SCRIPTS = {"finetune_full": ("finetune/full.py", "litgpt.model", False),
           "finetune_lora": ("finetune/lora.py", "litgpt.lora", True)}
# script -> where its schedule is built and stepped (litgpt 0.5.13)
_SCHEDULE_LINES = {"finetune_full": "finetune/full.py:415-419, stepped at full.py:292",
                   "finetune_lora": "finetune/lora.py:494-498, stepped at lora.py:366"}
_LORA = ("lora_r", "lora_alpha", "lora_dropout", "lora_query", "lora_key", "lora_value",
         "lora_projection", "lora_mlp", "lora_head")

# Command-line keys gradnorm decides: the scenario's, or what the harness needs to judge it.
_OWNED = {
    "checkpoint_dir": "(the scenario's model and initial parameters)",
    "out_dir": "(a temporary folder)", "precision": "dtype", "devices": "world_size",
    "num_nodes": "world_size", "resume": "(every run starts from the initial parameters)",
    "data": "valid_tokens", "optimizer": "optimizer", "logger_name": "(gradnorm reads its CSV)",
    "train.global_batch_size": "accumulation_steps", "train.micro_batch_size": "micro_batch_size",
    "train.max_steps": "steps", "train.epochs": "steps", "train.max_tokens": "steps",
    "train.log_interval": "(every step's log is judged)",
    "train.save_interval": "(nothing is saved during the run)",
    "train.max_seq_length": "sequence_length", "access_token": "(nothing is downloaded)",
    "quantize": "(the oracle has no quantisation)",
}
_OWNED.update({key: "(the scenario's LoRA model: examples/litgpt/tiny_gpt.py:tiny_gpt_lora)"
               for key in _LORA})

_PRECISION = {"float32": "32-true", "bfloat16": "bf16-true"}


class LitgptScript:
    """One of litgpt's fine-tuning scripts and the command-line arguments the user set."""

    def __init__(self, target, args, module_name, framework="litgpt"):
        if target not in SCRIPTS:
            raise ValueError("--recipe %s:%s: gradnorm drives litgpt's %s" % (
                framework, target, ", ".join(SCRIPTS)))
        self.target = target
        self.source, self.model_module, self.lora = SCRIPTS[target]
        self.schedule_lines = _SCHEDULE_LINES[target]
        import litgpt
        self.what = "%s's %s%s" % (_gf.release("litgpt"), target, _gf.origin("litgpt"))
        self.file = os.path.join(os.path.dirname(os.path.abspath(litgpt.__file__)), self.source)
        self.args = []
        for arg in args:
            key, sep, text = arg.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError("--recipe-arg %s: expected KEY=VALUE" % arg)
            owner = _OWNED.get(key) or _OWNED.get(key.split(".", 1)[0])
            if owner is not None:
                raise ValueError("--recipe-arg %s: the scenario decides %s %s; choose a scenario "
                                 "that has what you want" % (key, key, owner))
            self.args.append("--%s=%s" % (key, text.strip()))
        self._check_args()

    def _check_args(self):
        """The arguments as litgpt's own command line parses them (jsonargparse over the
        script's setup, as litgpt's parser_config.py captures it): a value it refuses is a
        ValueError naming it, before anything runs."""
        if not self.args:
            return
        import contextlib
        import io
        import importlib
        from jsonargparse import CLI, capture_parser
        script = importlib.import_module("litgpt." + self.source[:-3].replace("/", "."))
        parser = capture_parser(lambda: CLI(script.setup))
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
                parser.parse_args(["checkpoint_dir", *self.args])
        except SystemExit:
            lines = [line.strip() for line in said.getvalue().splitlines() if line.strip()]
            raise ValueError("--recipe-arg: litgpt's command line refuses %s: %s" % (
                " ".join(self.args), lines[-1] if lines else "(no reason given)")) from None

    def cannot_run(self, scenario):
        if scenario["model"] != "python":
            return ("litgpt builds its own GPT: the scenario's model must be one from a Python file "
                    "(--recipe substitutes examples/litgpt/tiny_gpt.py for built-in models)")
        if scenario["dtype"] not in _PRECISION:
            return "litgpt trains in 32-true or bf16-true; the scenario is %s" % scenario["dtype"]
        if scenario["world_size"] > 1 and not self.lora:
            return ("litgpt's finetune_full shards the model with FSDPStrategy on more than one "
                    "device (finetune/full.py:107-118), which Fabric refuses off a GPU: "
                    "'You selected the FSDP strategy but FSDP is only available on GPU' "
                    "(lightning/fabric/connector.py:433-438, measured with devices=2 here)")
        if scenario["world_size"] > 1:
            return ("gradnorm drives litgpt's finetune_lora on one device: on ranks it uses "
                    "ModelParallelStrategy (finetune/lora.py:152-165), whose rank_zero_first makes "
                    "and destroys a process group of its own, which gradnorm's rank processes "
                    "refuse (docs/findings.md, litgpt)")
        if scenario["steps"] < 2:
            return ("litgpt's %s cannot train fewer than 2 steps: its learning-rate schedule "
                    "divides by train.lr_warmup_steps (0 raises ZeroDivisionError as it is built) "
                    "and by max_steps - lr_warmup_steps (CosineAnnealingLR's T_max; 0 raises at "
                    "the first scheduler.step()): %s" % (self.target, self.schedule_lines))
        if scenario["optimizer_in_backward"]:
            return "litgpt steps its optimizer once per window"
        if scenario["clip_max_norm"] is not None:
            return "litgpt's %s does not clip (%s's fit has no clipping)" % (self.target, self.source)
        if scenario["loss"] != "mean_ce":
            return "the loss is litgpt's chunked_cross_entropy, not the scenario's %s" % scenario["loss"]
        return None


class _Samples(_gf.RankSamples):
    """This rank's samples as litgpt's datasets give them; each carries its step for the
    collate function (training)."""

    def __getitem__(self, index):
        sample = super().__getitem__(index)
        length = int(sample["input_ids"].shape[0])
        sample.update(token_counts={"raw": length, "raw_plus_prompt_template": length},
                      _gradnorm_step=_gf.sample_place(self._run, index)[0])
        return sample


def _data_module_class():
    from litgpt.data import DataModule

    class ScenarioData(DataModule):
        """The scenario's micro-batches as a litgpt DataModule (--data gradnorm_litgpt.ScenarioData)."""

        def __init__(self):
            super().__init__()
            self._run = _gf.current_run()
            # What litgpt saves beside the final checkpoint (prompts.py's save_prompt_style);
            # the samples are tokens already, so no prompt is applied.
            from litgpt.prompts import Default
            self.prompt_style = Default()

        def connect(self, tokenizer=None, batch_size=1, max_seq_length=None, **kwargs):
            if batch_size != self._run.micro_batch_size:
                raise RuntimeError("litgpt asked for micro-batches of %d, the scenario's are %d"
                                   % (batch_size, self._run.micro_batch_size))

        def train_dataloader(self):
            return torch.utils.data.DataLoader(_Samples(self._run), batch_size=self._run.micro_batch_size,
                                               shuffle=False, collate_fn=self._run.collate)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(_Samples(self._run), batch_size=self._run.micro_batch_size,
                                               shuffle=False, collate_fn=_collate_quietly)

    return ScenarioData


def _collate_quietly(samples):
    for sample in samples:
        sample.pop("_gradnorm_step")
    return torch.utils.data.default_collate(samples)


class _LitgptRun(_gf.GreenletRun):
    """litgpt's command line on this rank."""

    framework = "litgpt"

    def __init__(self, script, ctx):
        self.script = script
        self.feeding = _gf.FeedingProof("litgpt", "its loop")
        self._output = tempfile.TemporaryDirectory(prefix="gradnorm-litgpt-")
        super().__init__(ctx)

    def quiet_warnings(self):
        return ({"message": "The `srun` command is available"},
                {"message": r"`isinstance\(treespec, LeafSpec\)` is deprecated"},
                {"category": UserWarning, "module": r"lightning\..*"})

    def advance(self, ctx, step):
        precision = torch.get_float32_matmul_precision()
        gpt = _gpt_class()

        def record(module, args, kwargs):
            if isinstance(module, gpt) and module.training:
                self.recipe_model = module
                self.feeding.fed(kwargs.get("idx", args[0] if args else None))
        hook = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda module, args: record(module, args, {}))
        import contextlib
        import io
        try:
            # One device: no process group, as litgpt expects there (Fabric's rank_zero_first
            # makes a group wherever torch.distributed says it is initialized, and the
            # harness's in-process rank is). litgpt prints its arguments, progress and report
            # to stdout, which would interleave with gradnorm's table: kept apart.
            with _gt._DefaultGroup(None), contextlib.redirect_stdout(io.StringIO()):
                super().advance(ctx, step)
        finally:
            hook.remove()
            torch.set_float32_matmul_precision(precision)

    def reached(self, step):
        while step > self.step:
            self._parent.switch()
        if step < self.step:
            raise RuntimeError("litgpt asked for a sample of step %d during step %d" % (step, self.step))

    def collate(self, samples):
        steps = {sample.pop("_gradnorm_step") for sample in samples}
        self.reached(max(steps))
        return super().collate(samples)

    def _checkpoint(self):
        from litgpt.utils import save_config
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        import importlib
        model = self.scenario_model()
        wanted = importlib.import_module(self.script.model_module).GPT
        if type(model) is not wanted:
            raise _gf.Unsupported("the scenario's model is a %s.%s; litgpt's %s builds %s.GPT "
                                  "(examples/litgpt/tiny_gpt.py)" % (
                                      type(model).__module__, type(model).__name__,
                                      self.script.target, self.script.model_module))
        self.lora_args = ["--%s=%s" % (key, getattr(model.config, key)) for key in _LORA] \
            if self.script.lora else []
        folder = os.path.join(self._output.name, "checkpoint")
        os.makedirs(folder)
        from pathlib import Path
        save_config(model.config, Path(folder))
        torch.save({n: t.detach().clone() for n, t in model.state_dict().items()},
                   os.path.join(folder, "lit_model.pth"))
        vocab = {"t%d" % i: i for i in range(int(self.scenario["vocab_size"]))}
        Tokenizer(WordLevel(vocab, unk_token="t0")).save(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as out:
            out.write('{"tokenizer_class": "PreTrainedTokenizerFast"}')
        return folder

    def _main(self):
        checkpoint = self._checkpoint()
        out = os.path.join(self._output.name, "out")
        window = self.accumulation_steps * self.micro_batch_size
        argv = ["litgpt", self.script.target, checkpoint, "--out_dir=" + out,
                "--precision=" + _PRECISION[self.scenario["dtype"]], "--devices=1",
                "--data=gradnorm_litgpt.ScenarioData", "--optimizer=gradnorm_frameworks.Optimizer",
                "--logger_name=csv", "--train.micro_batch_size=%d" % self.micro_batch_size,
                "--train.global_batch_size=%d" % window, "--train.max_steps=%d" % self.steps,
                "--train.epochs=1", "--train.log_interval=1",
                "--train.save_interval=%d" % (self.steps + 1),
                # litgpt divides by lr_warmup_steps (finetune/full.py's get_lr_scheduler): 0 fails.
                # The rate is the scenario's all the same: the harness's optimizer steps.
                "--train.lr_warmup_steps=1",
                "--eval.interval=%d" % (self.steps + 1), "--eval.initial_validation=false",
                "--eval.final_validation=false", "--eval.max_new_tokens=1"] + self.lora_args + self.script.args
        self.metrics = os.path.join(out, "logs", "csv", "version_0", "metrics.csv")
        saved = sys.argv
        sys.argv = argv
        try:
            from litgpt.__main__ import main
            main()
        except SystemExit as error:  # jsonargparse ends the process on a refused argument
            if error.code not in (0, None):
                raise _gf.Unsupported("litgpt's command line refused %s (exit %s)"
                                      % (" ".join(argv[1:]), error.code)) from None
        finally:
            sys.argv = saved
        self.finished = True

    def _finished(self):
        self._written = self._read_metrics()  # the folder goes; what litgpt wrote stays
        self._output.cleanup()

    def _read_metrics(self):
        """{iteration: loss} of what litgpt wrote to metrics.csv so far."""
        written = {}
        try:
            with open(self.metrics, newline="", encoding="utf-8") as rows:
                for row in csv.DictReader(rows):
                    if row.get("iter") and row.get("loss"):
                        written[int(row["iter"])] = float(row["loss"])
        except FileNotFoundError:
            pass
        return written

    def logged_loss(self, step):
        """The loss litgpt wrote to metrics.csv at STEP's last micro-batch (from 1)."""
        written = self._written if self.finished else self._read_metrics()
        iteration = step * self.accumulation_steps
        return {"loss_to_log": written[iteration]} if iteration in written else {}


def _gpt_class():
    from litgpt.model import GPT
    return GPT


def make_step(script):
    def step(ctx):
        run = _gf.resumed(ctx, "litgpt run", lambda: _LitgptRun(script, ctx))
        _gf.stepped_values(run, ctx, rank_zero=False)  # it stepped once; it logs to a file
        return run.logged_loss(ctx.step_index + 1)
    step.__name__ = "litgpt_step"
    return step


def load_litgpt(target, args, module_name, framework="litgpt"):
    """(file, step function, cannot_run, objective, what runs) for --recipe litgpt:TARGET."""
    try:
        import litgpt.finetune.full  # noqa: F401
    except (ImportError, RuntimeError) as error:
        while error.__cause__ is not None:
            error = error.__cause__
        raise ImportError("--recipe %s:%s: litgpt does not import here (%s: %s); "
                          "scripts/install-deps.sh installs it in .venv/litgpt-0.5.13 "
                          "(requirements-litgpt.txt), beside .venv/transformers-4.57.6: put both "
                          "first on PYTHONPATH" % (framework, target, type(error).__name__, error)) from None
    globals()["ScenarioData"] = _data_module_class()
    script = LitgptScript(target, args, module_name, framework)
    return script.file, make_step(script), script.cannot_run, "scenario_loss", script.what


_gf.register("litgpt", load_litgpt)
