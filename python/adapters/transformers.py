"""Hugging Face Transformers' Trainer, unmodified, judged as a gradnorm step (docs/design.md §15):
the adapter for ``--recipe transformers:...`` over the shared machinery
(python/gradnorm_frameworks.py); TRL's SFTTrainer extends it (python/adapters/trl.py).

``gradnorm run --recipe transformers:trainer`` runs the installed ``transformers.Trainer``
for the scenario's steps; ``--recipe transformers:PATH.py:NAME`` runs NAME from a user's file:
a ``Trainer`` subclass, or a function used as Trainer's ``compute_loss_func``. What Trainer
gets, all through its constructor and its ``TrainingArguments``:

* ``model``: the scenario's Python-file model (a transformers causal LM from a tiny config,
  examples/transformers/tiny_llama.py), a fresh instance holding the harness's initial
  parameters;
* ``train_dataset``: this rank's samples of the scenario, one per sequence, labels aligned
  with ``input_ids`` as Trainer expects them (the model shifts): ``[first label, shifted
  labels[:T-1]]``. Each rank's dataset serves its own samples in the order the rank asks for
  them, whatever index Trainer's sampler and accelerate's sharding ask for. At every
  optimizer step what Trainer's own collator (default_data_collator, recorded) collated and
  what reached the model (a forward pre-hook) are checked against the scenario's
  micro-batches (gradnorm_frameworks.FeedingProof), so a rank fed anything else is an error, not a
  verdict;
* ``optimizers``: gradnorm's Optimizer (gradnorm_frameworks.py), whose ``step()`` hands the
  gradients Trainer produced, after its clipping and DDP's all-reduce, to the harness's
  recording optimizer, which steps with the scenario's optimizer; a constant schedule;
* ``callbacks``: one TrainerCallback that keeps the ``loss`` and ``grad_norm`` Trainer logs
  (``on_log``, what ``state.log_history`` receives) and hands control back to gradnorm
  after each step's log.

Gradient accumulation, batch size, steps and seed follow the scenario (``_OWNED``);
``--recipe-arg KEY=VALUE`` sets any other ``TrainingArguments`` field. Clipping is the
scenario's too: ``--recipe-arg max_grad_norm=V`` on the command line makes every scenario clip
to V (tools/src/command_line.cpp, with_recipe_model), and a max_grad_norm that disagrees with
the scenario (a scenario file's recipe_args) leaves the pair out, saying so. On W
rank processes the harness's Gloo group is torch.distributed's default group; accelerate
finds it initialised and uses it, and Trainer wraps the model in DDP over it. The run is
checked to be distributed (accelerate's world size and distributed type) before it trains.
"""

import dataclasses
import inspect
import os
import tempfile
import typing

import torch

import gradnorm_frameworks as _gf
import gradnorm_torch as _gt

# TrainingArguments fields the scenario decides: a --recipe-arg may not set them, since the
# oracle judges the scenario.
_OWNED = {
    "per_device_train_batch_size": "micro_batch_size",
    "gradient_accumulation_steps": "accumulation_steps",
    "max_steps": "steps", "num_train_epochs": "steps", "seed": "seed", "data_seed": "seed",
    "learning_rate": "learning_rate (the harness's optimizer steps)",
    "optim": "optimizer", "weight_decay": "weight_decay", "lr_scheduler_type": "(a constant rate)",
    "use_cpu": "(gradnorm runs on the CPU)", "ddp_backend": "(the harness's Gloo group)",
    "output_dir": "(a temporary folder)", "logging_steps": "(every step's log is judged)",
    "logging_strategy": "(every step's log is judged)", "report_to": "(nothing is reported)",
    "save_strategy": "(nothing is saved)", "bf16": "dtype (the model's parameters)",
    "fp16": "dtype (the model's parameters)", "dataloader_num_workers": "(the rank's own order)",
    "gradient_checkpointing": "(the model is the scenario's)",
    "resume_from_checkpoint": "(every run starts from the initial parameters)",
}

# Set for every run (the scenario's own values are set beside them in _arguments).
_FIXED = {
    "logging_steps": 1, "logging_strategy": "steps", "report_to": "none", "save_strategy": "no",
    "disable_tqdm": True, "use_cpu": True, "dataloader_num_workers": 0,
    "dataloader_pin_memory": False, "remove_unused_columns": False, "lr_scheduler_type": "constant",
    "num_train_epochs": 1,
    # The scenario's dtype is the parameters' and what they compute in: no mixed precision
    # (TRL's SFTConfig turns bf16 autocast on by default, trl/trainer/base_config.py).
    "bf16": False, "fp16": False,
}


def _parse_args(args, config_class, owned, what):
    """--recipe-arg KEY=VALUE pairs as fields of config_class (TrainingArguments, or TRL's
    SFTConfig), each VALUE parsed by Hugging Face's own HfArgumentParser as its command line
    parses --KEY VALUE: "false", "no" and "0" are False, a number must be one. That command
    line has no spelling for None; here "None" or "null" (YAML's, as a config file says it)
    sets a field that may be None to None. A value the parser refuses is a ValueError naming
    it."""
    from transformers import HfArgumentParser
    fields = {f.name for f in dataclasses.fields(config_class)}
    hints = typing.get_type_hints(config_class)
    parser = HfArgumentParser(config_class)

    def refuse(message):
        raise ValueError(message)
    parser.error = refuse  # argparse would print usage and exit the process
    out = {}
    for arg in args:
        key, sep, text = arg.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key:
            raise ValueError("--recipe-arg %s: expected KEY=VALUE" % arg)
        if key in owned:
            raise ValueError("--recipe-arg %s: the scenario decides %s (%s); choose a scenario "
                             "that has what you want (a catalogue scenario or a scenario file)"
                             % (key, key, owned[key]))
        if key not in fields:
            raise ValueError("--recipe-arg %s: %s's %s has no field '%s'"
                             % (arg, what, config_class.__name__, key))
        if text in ("None", "null") and type(None) in typing.get_args(hints.get(key)):
            out[key] = None
            continue
        try:
            parsed, _ = parser.parse_known_args(["--" + key, text])
        except ValueError as error:
            raise ValueError("--recipe-arg %s: %s's HfArgumentParser refuses it: %s"
                             % (arg, what, error)) from None
        out[key] = getattr(parsed, key)
    return out


class Flavour:
    """Which trainer an adapter drives: Trainer (this file) or TRL's SFTTrainer
    (python/adapters/trl.py), and what differs between them."""

    def __init__(self, framework, base, builtin, config_class, owned, what, run_class):
        self.framework = framework        # "transformers": the --recipe prefix
        self.base = base                  # the trainer class
        self.builtin = builtin            # "trainer": the target naming the class itself
        self.config_class = config_class  # TrainingArguments
        self.owned = owned                # _OWNED: fields the scenario decides
        self.what = what                  # "transformers 5.18.0": names the version parsed
        self.run_class = run_class        # _TrainerRun: one training run on a rank


def trainer_flavour():
    import transformers
    return Flavour("transformers", transformers.Trainer, "trainer", transformers.TrainingArguments,
                   _OWNED, _gf.release("transformers"), _TrainerRun)


class TrainerRecipe:
    """Trainer (or a user's subclass, or Trainer with a user's compute_loss_func) and the
    TrainingArguments fields the user set; for TRL's flavour, TRL's SFTTrainer (or a user's
    subclass of it) and SFTConfig fields."""

    def __init__(self, target, args, module_name, flavour):
        self.framework = flavour.framework
        self.flavour = flavour
        self.target = target
        self.compute_loss_func = None
        framework, base, builtin = flavour.framework, flavour.base, flavour.builtin
        self.config_class = flavour.config_class
        self.overrides = _parse_args(args, self.config_class, flavour.owned, flavour.what)
        if target == builtin:
            self.cls = base
            self.file = inspect.getsourcefile(base)
            return
        path, _, name = target.rpartition(":")
        if not path.endswith(".py") or not name:
            raise ValueError("--recipe %s:%s: expected %s:%s or %s:PATH.py:NAME (a %s subclass "
                             "or a compute_loss_func in your file)"
                             % (framework, target, framework, builtin, framework, base.__name__))
        self.file = os.path.abspath(path)
        if not os.path.isfile(self.file):
            raise FileNotFoundError("--recipe %s:%s: no such file %s" % (framework, target, path))
        module = _gt.import_file(self.file, module_name)
        found = getattr(module, name, None)
        if isinstance(found, type) and issubclass(found, base):
            self.cls = found
        elif callable(found) and not isinstance(found, type):
            if framework == "trl":
                # Every such run failed with a feeding error: SFTTrainer.compute_loss runs the
                # model twice per micro-batch with a compute_loss_func (trl 1.16.0's
                # sft_trainer.py:1593-1600: the logits for the function, then a no_grad forward
                # for its metrics), and TRL deprecates it (sft_trainer.py:1050-1056).
                raise ValueError(
                    "--recipe trl:%s: %s is a function, and SFTTrainer with a compute_loss_func "
                    "is not judged: %s's SFTTrainer.compute_loss runs the model a second time "
                    "(no_grad, for its metrics) after the forward whose logits the function "
                    "gets, which gradnorm cannot tell from feeding the wrong batches; TRL "
                    "deprecates it too. Override compute_loss in an SFTTrainer subclass "
                    "(trl:PATH.py:CLASS), or give the function to Trainer "
                    "(transformers:PATH.py:NAME)" % (target, name, _gf.release("trl")))
            self.cls = base
            self.compute_loss_func = found
        else:
            raise LookupError("--recipe %s:%s: %s defines no %s subclass or function named '%s'"
                              % (framework, target, path, base.__name__, name))

    def cannot_run(self, scenario):
        if scenario["model"] != "python":
            return ("Trainer trains a transformers model: the scenario's model must come from a "
                    "Python file (model = \"python:FILE.py:FUNCTION\"; --recipe substitutes "
                    "examples/transformers/tiny_llama.py for built-in models)")
        if scenario["tp"] > 1 or scenario["cp"] > 1 or scenario["dp_replicate"] > 1:
            return "gradnorm drives Trainer's data parallelism (DDP) only"
        if scenario["optimizer_in_backward"]:
            return "Trainer has no optimizer in backward: it steps once per window"
        if scenario["loss"] != "mean_ce":
            return ("Trainer's loss is the model's own cross-entropy (or a compute_loss_func), "
                    "not the scenario's %s" % scenario["loss"])
        if "max_grad_norm" in self.overrides:
            clip = scenario["clip_max_norm"]
            given = self.overrides["max_grad_norm"]
            if not isinstance(given, (int, float)) or float(given) != (0.0 if clip is None else clip):
                return ("max_grad_norm=%r would clip where the scenario %s: give the scenario "
                        "clip_max_norm = %r, or --recipe-arg max_grad_norm on the command line "
                        "(every scenario then clips to it)"
                        % (given, "does not clip" if clip is None else "clips to %r" % clip, given))
        if scenario["world_size"] > 1 and not _gt._process_is_initialized():
            return ("Trainer on W ranks needs a torch.distributed process group, which "
                    "gradnorm's ranks have only as processes: run it with --nproc W (rank "
                    "processes over Gloo), torchrun or Slurm")
        return None


class _Dataset(torch.utils.data.Dataset):
    """This rank's samples: the scenario's micro-batches, sequence by sequence, step by step,
    served in the order the rank asks for them. Its length is every rank's samples together
    (W x steps x accumulation x batch), as one dataset split by Trainer's sampler would be."""

    def __init__(self, run):
        self._run = run
        self._next = 0

    def __len__(self):
        run = self._run
        return run.dp_size * run.steps * run.accumulation_steps * run.micro_batch_size

    def __getitem__(self, index):
        run = self._run
        step, micro, row = _gf.sample_place(run, self._next)
        self._next += 1
        if step >= run.steps:
            raise RuntimeError("Trainer asked rank %d for more samples than the scenario's %d "
                               "steps hold" % (run.dp_rank, run.steps))
        tokens, aligned = _gf.aligned_sample(run.batches_of(step)[micro], row)
        return {"input_ids": tokens.clone(), "labels": aligned}


def _callback_class():
    from transformers import TrainerCallback

    class Capture(TrainerCallback):
        """Keeps what Trainer logs at each step and hands control back to gradnorm."""

        def __init__(self, run):
            self._run = run

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is None or "loss" not in logs:
                return
            self._run.logged[int(state.global_step)] = {
                "loss": logs["loss"], "grad_norm": logs.get("grad_norm")}
            if int(state.global_step) < self._run.steps:
                self._run._parent.switch()

    return Capture


def _checked_loss_func(function, target):
    """The user's compute_loss_func, its return checked where it returns: Trainer backwards
    what it returns and divides it, so a float, a tensor without grad or one of several
    elements failed inside Trainer's code, located there, not at the user's function."""
    import functools
    name = "compute_loss_func %s" % target

    @functools.wraps(function)
    def loss_func(outputs, labels, num_items_in_batch=None):
        loss = function(outputs, labels, num_items_in_batch=num_items_in_batch)
        if not isinstance(loss, torch.Tensor):
            raise TypeError("%s returned %s: Trainer backwards what it returns, so it must be a "
                            "tensor (the loss)" % (name, type(loss).__name__))
        if loss.numel() != 1:
            raise ValueError("%s returned a tensor of shape %s: Trainer backwards it as the "
                             "micro-batch's loss, one number" % (name, list(loss.shape)))
        if not loss.requires_grad:
            raise ValueError("%s returned a loss without grad (computed under no_grad, or from "
                             "detached logits): Trainer's backward would reach no parameter"
                             % name)
        return loss
    return loss_func


class _TrainerRun(_gf.GreenletRun):
    """Trainer's one training run (trainer.train()) on this rank."""

    framework = "Trainer"

    def __init__(self, recipe, ctx):
        self.recipe = recipe
        self.feeding = _gf.FeedingProof("Trainer", "its sampler or accelerate's sharding")
        self._output = tempfile.TemporaryDirectory(prefix="gradnorm-trainer-")
        self._batches = {}
        super().__init__(ctx)

    def batches_of(self, step):
        for done in [k for k in self._batches if k < self.step]:
            del self._batches[done]  # the dataset only reads ahead, never back
        if step not in self._batches:
            self._batches[step] = self.ctx.batches_of(step)
        return self._batches[step]

    def _model(self):
        model = self.scenario_model()

        def record(_module, args, kwargs):
            self.feeding.fed(kwargs.get("input_ids", args[0] if args else None))
        model.register_forward_pre_hook(record, with_kwargs=True)
        return model

    def _arguments(self):
        s = self.scenario
        clip = s["clip_max_norm"]
        values = dict(_FIXED)
        values.update(output_dir=self._output.name, seed=int(s["seed"]),
                      per_device_train_batch_size=int(s["micro_batch_size"]),
                      gradient_accumulation_steps=int(s["accumulation_steps"]),
                      max_steps=int(s["steps"]), learning_rate=float(s["learning_rate"]),
                      max_grad_norm=0.0 if clip is None else float(clip))
        if self.dp_size > 1:
            values["ddp_backend"] = "gloo"
        values.update(self._fixed())
        values.update(self.recipe.overrides)
        return self.recipe.config_class(**values)

    def _fixed(self):
        """Arguments a subclass sets beside _FIXED."""
        return {}

    def _trainer_kwargs(self):
        """What Trainer's constructor is given beside the model, arguments, optimizer and
        callbacks: this rank's dataset and a collator (Trainer's own, recording)."""
        return dict(train_dataset=_Dataset(self), data_collator=self.collate)

    def _constructed(self, trainer):
        """Called once the trainer is built, before it trains."""

    def _check_distributed(self, trainer):
        accelerator = trainer.accelerator
        kind = str(accelerator.distributed_type).split(".")[-1]
        if accelerator.num_processes != self.dp_size or (self.dp_size > 1 and kind != "MULTI_CPU"):
            raise RuntimeError(
                "accelerate set up %d process(es) (%s) for a scenario of %d ranks: each rank "
                "would train alone" % (accelerator.num_processes, kind, self.dp_size))

    def _main(self):
        _gf.rank_environment(self)
        args = self._arguments()
        model = self._model()
        self.recipe_model = model
        # The rate is the scenario's (Trainer logs it); the harness's optimizer steps with it.
        optimizer = _gf.Optimizer(model.parameters(), lr=float(self.scenario["learning_rate"]))
        schedule = _gf.constant_lr(optimizer)
        kwargs = dict(model=model, args=args, optimizers=(optimizer, schedule),
                      callbacks=[_callback_class()(self)], **self._trainer_kwargs())
        if self.recipe.compute_loss_func is not None:
            kwargs["compute_loss_func"] = _checked_loss_func(self.recipe.compute_loss_func,
                                                             self.recipe.target)
        trainer = self.recipe.cls(**kwargs)
        # Trainer prints every log to stdout (PrinterCallback, its progress output when tqdm
        # is disabled), which would interleave with gradnorm's table: removed through
        # Trainer's own remove_callback. It only prints.
        from transformers.trainer_callback import PrinterCallback, ProgressCallback
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        self._check_distributed(trainer)
        self._constructed(trainer)
        trainer.train()
        self.finished = True

    def _finished(self):
        self._output.cleanup()

    def collate(self, features, collator=None):
        """Trainer's own default collator (or the one given), recording what it collated."""
        if collator is None:
            from transformers import default_data_collator
            collator = default_data_collator
        batch = collator(features)
        self.feeding.collated(batch["input_ids"])
        return batch


def make_step(recipe):
    # Trainer's global_step counts from 1; every rank logs the loss gathered over ranks.
    return _gf.framework_step("trainer_step", "trainer run",
                              lambda ctx: recipe.flavour.run_class(recipe, ctx), rank_zero=False)


def load_trainer(target, args, module_name, framework="transformers"):
    """(file, step function, cannot_run, objective, what runs) for --recipe transformers:TARGET."""
    try:
        import transformers
        transformers.Trainer  # noqa: B018 (imported lazily: Trainer's own imports run here)
    except (ImportError, RuntimeError) as error:
        raise _gf.import_error(framework, target, error) from None
    return load_flavour(target, args, module_name, trainer_flavour(),
                        "%s's Trainer%s" % (_gf.release("transformers"), _gf.origin("transformers")))


def load_flavour(target, args, module_name, flavour, what):
    recipe = TrainerRecipe(target, args, module_name, flavour)
    if recipe.target != flavour.builtin:
        what = "%s (%s)" % (recipe.target, what)
    return recipe.file, make_step(recipe), recipe.cannot_run, "scenario_loss", what


_gf.register("transformers", load_trainer)
