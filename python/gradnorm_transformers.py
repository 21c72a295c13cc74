"""Hugging Face Transformers' Trainer, unmodified, judged as a gradnorm step (docs/design.md §15).

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
  micro-batches (_TrainerRun._check_fed), so a rank fed anything else is an error, not a
  verdict;
* ``optimizers``: gradnorm's Optimizer (gradnorm_recipes.py), whose ``step()`` hands the
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

import ast
import dataclasses
import importlib.metadata
import inspect
import os
import tempfile

import torch

import gradnorm_recipes as _gr
import gradnorm_torch as _gt

IGNORE_INDEX = -100

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


# SFTConfig fields the scenario decides beside Trainer's: each rank's samples are laid out
# in the dataset where a sequential sampler and accelerate's sharding give them to it
# (_SFTRun._dataset).
_OWNED_TRL = {
    "train_sampling_strategy": "(sequential: each rank's own micro-batches, in order)",
    "dataset_kwargs": "(the dataset is pre-tokenized and prepared by SFTTrainer itself)",
    "model_init_kwargs": "(the model is the scenario's)",
}


def transformers_version():
    return importlib.metadata.version("transformers")


def trl_version():
    return importlib.metadata.version("trl")


def _parse_args(args, config_class, owned, what):
    """--recipe-arg KEY=VALUE pairs as fields of config_class (TrainingArguments, or TRL's
    SFTConfig): VALUE a Python literal (True, 1.0, "text") or else the text itself."""
    fields = {f.name for f in dataclasses.fields(config_class)}
    out = {}
    for arg in args:
        key, sep, text = arg.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError("--recipe-arg %s: expected KEY=VALUE" % arg)
        if key in owned:
            raise ValueError("--recipe-arg %s: the scenario decides %s (%s); choose a scenario "
                             "that has what you want (a catalogue scenario or a scenario file)"
                             % (key, key, owned[key]))
        if key not in fields:
            raise ValueError("--recipe-arg %s: %s's %s has no field '%s'"
                             % (arg, what, config_class.__name__, key))
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = text.strip()
        out[key] = value
    return out


class TrainerRecipe:
    """Trainer (or a user's subclass, or Trainer with a user's compute_loss_func) and the
    TrainingArguments fields the user set; for framework "trl", TRL's SFTTrainer (or a
    user's subclass of it) and SFTConfig fields."""

    def __init__(self, target, args, module_name, framework="transformers"):
        import transformers
        self.framework = framework
        self.target = target
        self.compute_loss_func = None
        if framework == "trl":
            import trl
            base, builtin, self.config_class = trl.SFTTrainer, "sft", trl.SFTConfig
            owned, what = dict(_OWNED, **_OWNED_TRL), "trl %s" % trl_version()
        else:
            base, builtin, self.config_class = (transformers.Trainer, "trainer",
                                                transformers.TrainingArguments)
            owned, what = _OWNED, "transformers %s" % transformers_version()
        self.overrides = _parse_args(args, self.config_class, owned, what)
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
        per_step = run.accumulation_steps * run.micro_batch_size
        k = self._next
        self._next += 1
        step, within = k // per_step, k % per_step
        if step >= run.steps:
            raise RuntimeError("Trainer asked rank %d for more samples than the scenario's %d "
                               "steps hold" % (run.dp_rank, run.steps))
        micro, row = within // run.micro_batch_size, within % run.micro_batch_size
        batch = run.batches_of(step)[micro]
        shifted = batch["labels"][row]
        if int(shifted[-1]) != IGNORE_INDEX:
            raise RuntimeError("gradnorm bug: a shifted label at position T-1")
        aligned = torch.cat([batch["first_labels"][row:row + 1], shifted[:-1]])
        return {"input_ids": batch["tokens"][row].clone(), "labels": aligned}


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


class _TrainerRun(_gr.GreenletRun):
    """Trainer's one training run (trainer.train()) on this rank."""

    def __init__(self, recipe, ctx):
        self.recipe = recipe
        self.fed = []  # input_ids of every forward since the last optimizer step
        # input_ids of the batches Trainer's dataloader collated and _check_fed has not yet
        # checked, in order (the next step's first may be among them: accelerate reads ahead)
        self.collated = []
        self.checked_steps = 0
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
        s = self.scenario
        model = _gt.build_model(self.model_function, self.model_file, self.model_file,
                                s["vocab_size"], s["hidden_size"], s["sequence_length"], s["seed"])
        with torch.no_grad():
            model.load_state_dict({n: t.detach().clone()
                                   for n, t in self.harness_model.state_dict().items()})

        def record(_module, args, kwargs):
            tokens = kwargs.get("input_ids", args[0] if args else None)
            self.fed.append(tokens.detach().clone())
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

    def _distributed_environment(self):
        """What accelerate reads to find this rank's place (its state.py, CPU ranks), set
        before TrainingArguments builds accelerate's state. accelerate changes torch's thread
        count where OMP_NUM_THREADS is unset; it is set to the harness's."""
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        if self.dp_size == 1:
            return
        os.environ.update(RANK=str(self.dp_rank), WORLD_SIZE=str(self.dp_size),
                          LOCAL_RANK=str(self.dp_rank), LOCAL_WORLD_SIZE=str(self.dp_size))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")

    def _check_distributed(self, trainer):
        accelerator = trainer.accelerator
        kind = str(accelerator.distributed_type).split(".")[-1]
        if accelerator.num_processes != self.dp_size or (self.dp_size > 1 and kind != "MULTI_CPU"):
            raise RuntimeError(
                "accelerate set up %d process(es) (%s) for a scenario of %d ranks: each rank "
                "would train alone" % (accelerator.num_processes, kind, self.dp_size))

    def _main(self):
        self._distributed_environment()
        args = self._arguments()
        model = self._model()
        self.recipe_model = model
        # The rate is the scenario's (Trainer logs it); the harness's optimizer steps with it.
        optimizer = _gr.Optimizer(model.parameters(), lr=float(self.scenario["learning_rate"]))
        schedule = _gr.constant_lr(optimizer)
        kwargs = dict(model=model, args=args, optimizers=(optimizer, schedule),
                      callbacks=[_callback_class()(self)], **self._trainer_kwargs())
        if self.recipe.compute_loss_func is not None:
            kwargs["compute_loss_func"] = self.recipe.compute_loss_func
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
        self.collated.append(batch["input_ids"].detach().clone())
        return batch

    def _check_fed(self):
        """Proof that this rank trained on its own micro-batches in order: the batches its
        dataloader collated since the last step begin with this step's window (one more may
        follow: accelerate fetches a batch ahead), and what reached the model in this window
        is the window's micro-batches in order (a user's Trainer may skip one). Each step
        checks its own window once, so all steps together are checked in order."""
        window = [b["tokens"] for b in self.ctx.micro_batches]
        collated = self.collated[:len(window)]
        if len(collated) < len(window) or any(not torch.equal(c, w)
                                              for c, w in zip(collated, window)):
            raise RuntimeError(
                "rank %d step %d: Trainer's dataloader gave this rank batches other than the "
                "scenario's, in their order (%d collated, %d expected): its sampler or "
                "accelerate's sharding moved them" % (self.dp_rank, self.step,
                                                      len(self.collated), len(window)))
        del self.collated[:len(window)]
        fed, self.fed = self.fed, []
        at = 0
        for tokens in fed:
            while at < len(window) and not torch.equal(tokens, window[at]):
                at += 1
            if at == len(window):
                raise RuntimeError(
                    "rank %d step %d: the model was given input_ids that are not this window's "
                    "micro-batches in order (%d forwards, %d micro-batches)"
                    % (self.dp_rank, self.step, len(fed), len(window)))
            at += 1

    def hand_over(self, optimizer):
        self._check_fed()
        if self.checked_steps != self.step:
            raise RuntimeError("Trainer stepped its optimizer twice in gradnorm step %d"
                               % self.step)
        self.checked_steps += 1
        super().hand_over(optimizer)


class _SFTRun(_TrainerRun):
    """TRL's SFTTrainer (a Trainer subclass) on this rank. SFTTrainer takes a datasets.Dataset
    only (sft_trainer.py's __init__ refuses anything else) and prepares it itself, so the
    rank's samples cannot be served in the order asked: every sample of every step is laid
    out where a sequential sampler and accelerate's sharding (global micro-batch g goes to
    rank g mod W) hand it to this rank, other ranks' places holding a placeholder sequence
    (token 0 throughout, every label valid) this rank never trains on. The collator is
    SFTTrainer's own (DataCollatorForLanguageModeling), recording what it collated; the
    tokenizer (a processing class SFTTrainer requires, to find its pad token) is a word-level
    one over the scenario's vocabulary, built here: the dataset is already tokenized."""

    def _fixed(self):
        # transformers 5.x's TrainingArguments field; 4.57.6 has none and always samples at
        # random (4.57.6 trainer.py:1053-1080): _constructed then serves in order.
        if self._sequential_field():
            return {"train_sampling_strategy": "sequential"}
        return {}

    def _sequential_field(self):
        return "train_sampling_strategy" in {f.name for f in
                                             dataclasses.fields(self.recipe.config_class)}

    def _dataset(self):
        import datasets
        datasets.disable_progress_bars()  # its map/filter progress would interleave
        s = self.scenario
        length, batch = int(s["sequence_length"]), self.micro_batch_size
        per_rank = self.steps * self.accumulation_steps
        placeholder = [0] * length
        input_ids, labels = [], []
        self._own = []  # this rank's places in the dataset, in the order it trains on them
        for g in range(per_rank * self.dp_size):
            k, owner = divmod(g, self.dp_size)
            if owner != self.dp_rank:
                input_ids += [placeholder] * batch
                labels += [placeholder] * batch
                continue
            self._own += range(len(input_ids), len(input_ids) + batch)
            micro = self.ctx.batches_of(k // self.accumulation_steps)[k % self.accumulation_steps]
            for row in range(batch):
                shifted = micro["labels"][row]
                aligned = torch.cat([micro["first_labels"][row:row + 1], shifted[:-1]])
                input_ids.append(micro["tokens"][row].tolist())
                labels.append(aligned.tolist())
        return datasets.Dataset.from_dict({"input_ids": input_ids, "labels": labels})

    def _tokenizer(self):
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from transformers import PreTrainedTokenizerFast
        vocab = {"t%d" % i: i for i in range(int(self.scenario["vocab_size"]))}
        return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")),
                                       pad_token="t0", eos_token="t0", unk_token="t0")

    def _trainer_kwargs(self):
        self._given = self._dataset()
        return dict(train_dataset=self._given, processing_class=self._tokenizer())

    def _constructed(self, trainer):
        given, kept = len(self._given), len(trainer.train_dataset)
        lost = torch.tensor([int(kept != given)])
        if self.dp_size > 1:  # every rank stops, or the others would wait in DDP's all-reduce
            torch.distributed.all_reduce(lost, op=torch.distributed.ReduceOp.MAX)
        if kept == given and int(lost):
            raise RuntimeError("rank %d: another rank's SFTTrainer dataset preparation dropped "
                               "sequences (that rank says which)" % self.dp_rank)
        if kept != given:
            dropped = [i for i, labels in enumerate(self._given["labels"])
                       if all(label == IGNORE_INDEX for label in labels)]
            raise RuntimeError(
                "rank %d: SFTTrainer's dataset preparation kept %d of the %d sequences given "
                "(%d of them have no valid label; with max_length set it drops such sequences, "
                "so the micro-batches regroup and the scenario's cannot be trained as given; "
                "--recipe-arg max_length=None keeps them)" % (self.dp_rank, kept, given,
                                                              len(dropped)))
        own = trainer.data_collator
        trainer.data_collator = lambda features: self.collate(features, own)
        if not self._sequential_field():
            # No sequential sampler to ask for: the dataset SFTTrainer prepared is served to
            # its sampler in this rank's order, whatever index it asks for, as _Dataset does
            # for Trainer. SFTTrainer's preparation has run; the feeding proof still checks
            # every step.
            trainer.train_dataset = _InOrder(trainer.train_dataset, self._own, self.dp_rank)


class _InOrder(torch.utils.data.Dataset):
    """A prepared dataset served in a fixed order of its rows, whatever index is asked for;
    as long as the whole dataset, so that a sampler and accelerate's sharding give each rank
    as many samples as they would."""

    def __init__(self, prepared, order, rank):
        self._prepared, self._order, self._rank, self._next = prepared, order, rank, 0

    def __len__(self):
        return len(self._prepared)

    def __getitem__(self, index):
        if self._next >= len(self._order):
            raise RuntimeError("SFTTrainer asked rank %d for more samples than the scenario's "
                               "steps hold" % self._rank)
        row = self._prepared[self._order[self._next]]
        self._next += 1
        return row


def make_step(recipe):
    def step(ctx):
        run = ctx.state.get("trainer run")
        if run is None:
            kind = _SFTRun if recipe.framework == "trl" else _TrainerRun
            run = ctx.state["trainer run"] = kind(recipe, ctx)
        run.advance(ctx, ctx.step_index)
        if run.checked_steps != ctx.step_index + 1:
            raise RuntimeError("Trainer did not step its optimizer in gradnorm step %d"
                               % ctx.step_index)
        # Trainer's global_step counts from 1; every rank logs the loss gathered over ranks.
        return _gr._loss_of(run.logged, ctx.step_index + 1)
    step.__name__ = "trainer_step"
    return step


def load_trainer(target, args, module_name, framework="transformers"):
    """(file, step function, cannot_run, objective, what runs) for --recipe transformers:TARGET
    or --recipe trl:TARGET."""
    try:
        import transformers
        transformers.Trainer  # noqa: B018 (imported lazily: Trainer's own imports run here)
        if framework == "trl":
            import trl
            trl.SFTTrainer  # noqa: B018 (the same)
    except (ImportError, RuntimeError) as error:
        # A lazy import wraps what failed in a RuntimeError: name the first cause.
        while error.__cause__ is not None:
            error = error.__cause__
        error = "%s: %s" % (type(error).__name__, error)
        where = ("scripts/install-deps.sh installs TRL in .venv/trl-1.16.0 "
                 "(requirements-trl.txt; beside transformers 4.57.6, "
                 ".venv/trl-1.16.0-transformers-4.57.6 before .venv/transformers-4.57.6): "
                 "put it first on PYTHONPATH"
                 if framework == "trl" else
                 "scripts/install-deps.sh installs requirements.txt's pins")
        raise ImportError("--recipe %s:%s: %s does not import here (%s); %s"
                          % (framework, target, framework, error, where)) from None
    recipe = TrainerRecipe(target, args, module_name, framework)
    if framework == "trl":
        what = "trl %s's SFTTrainer (transformers %s)" % (trl_version(), transformers_version())
        builtin = "sft"
    else:
        what = "transformers %s's Trainer" % transformers_version()
        builtin = "trainer"
    if recipe.target != builtin:
        what = "%s (%s)" % (recipe.target, what)
    return recipe.file, make_step(recipe), recipe.cannot_run, "scenario_loss", what
