"""PyTorch Lightning's ``Trainer.fit``, unmodified, on a user's ``LightningModule``, judged as a
gradnorm step (docs/frameworks.md): the adapter for ``--recipe lightning:PATH.py:CLASS`` over
the shared machinery (python/gradnorm_frameworks.py).

CLASS is the user's ``LightningModule`` subclass (of ``lightning.pytorch`` or of
``pytorch_lightning``: the Trainer is taken from the package the class derives from). It is
built as ``CLASS(model)`` with the scenario's model (``model(input_ids)`` returns logits
[B, T, V]), a fresh instance holding the harness's initial parameters. What gradnorm gives
Lightning, all through its public surface:

* ``train_dataloaders`` (``Trainer.fit``'s argument): a ``DataLoader`` over every rank's
  samples, one per sequence, as dicts ``{"input_ids": [T], "labels": [T]}`` collated by
  torch's ``default_collate`` into ``[B, T]``, labels aligned with ``input_ids`` and -100
  where not valid (the module shifts). Sample g is rank g % W's sample g // W, the order
  torch's ``DistributedSampler`` hands them out without shuffling; the DataLoader holds such
  a sampler, which Lightning keeps (the one it would put in shuffles). A sample asked for by
  another rank is an error, and at every optimizer step
  the feeding proof (``gradnorm_frameworks.FeedingProof``) checks what was collated and what
  reached the model against the step's micro-batches;
* the optimizer: ``configure_optimizers`` is replaced on the module instance (the class is
  untouched) by one returning gradnorm's ``Optimizer`` over the model's parameters, since
  the scenario decides the optimizer. Lightning calls its ``step(closure)`` with the
  window's last forward and backward and its own clipping inside the closure
  (``Precision._wrap_closure``), so the gradients are handed over after the closure returns;
* ``logger``: a ``Logger`` that keeps what Lightning hands its loggers at each step
  (``log_metrics``), from which the verdict reads the value logged under ``loss`` (or
  ``--recipe-arg log_name=NAME``; ``NAME_step`` where the module logs on_epoch too). Loggers
  write rank 0's values (``rank_zero_only``), so on W ranks rank 0's is judged;
* ``callbacks``: one that hands control back to gradnorm at the start of the batch after
  each optimizer step (once Lightning has logged the step);
* ``accumulate_grad_batches`` the scenario's accumulation (or, on a one-step scenario, a
  larger ``--recipe-arg accumulate_grad_batches=K``: its window is then the epoch's last,
  partial one), ``gradient_clip_val`` its clip
  (norm), ``max_steps`` its steps, ``precision`` its dtype; on W ranks ``devices=W``,
  ``strategy="ddp"`` over the harness's Gloo group (torch.distributed's default group, which
  Lightning finds initialised and uses: fabric/utilities/distributed.py's
  ``_init_dist_connection``).

``--recipe-arg KEY=VALUE`` sets any other ``Trainer`` argument, parsed by Lightning's own
``LightningArgumentParser`` (what ``LightningCLI`` parses ``--trainer.KEY=VALUE`` with).
"""

import os
import tempfile

import torch

import gradnorm_frameworks as _gf
import gradnorm_torch as _gt

# Trainer arguments the scenario or the harness decides: a --recipe-arg may not set them.
_OWNED = {
    "gradient_clip_algorithm": "(norm: the oracle clips the total norm)",
    "max_steps": "steps", "min_steps": "steps", "max_epochs": "steps", "min_epochs": "steps",
    "max_time": "steps", "limit_train_batches": "steps", "overfit_batches": "steps",
    "fast_dev_run": "steps", "precision": "dtype (the model's parameters)",
    "accelerator": "(gradnorm runs on the CPU)", "devices": "world_size",
    "num_nodes": "world_size", "strategy": "(DDP over the harness's Gloo group)",
    "plugins": "(the harness's ranks)", "use_distributed_sampler": "(each rank's own order)",
    "logger": "(gradnorm keeps what is logged)", "log_every_n_steps": "(every step's log is judged)",
    "barebones": "(gradnorm judges what is logged)", "callbacks": "(gradnorm's hand-back)",
    "enable_checkpointing": "(nothing is saved)", "default_root_dir": "(a temporary folder)",
    "enable_progress_bar": "(gradnorm prints the table)",
    "reload_dataloaders_every_n_epochs": "(one epoch)",
}

# gradnorm's own keys beside Trainer's: what the adapter reads, not Lightning.
_OWN_KEYS = {"log_name": "the name the module logs its loss under (default loss)"}


def _package_of(cls):
    """(the Lightning package CLASS derives from, its name): lightning.pytorch or
    pytorch_lightning, whichever the user imported."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            package = __import__(name, fromlist=["LightningModule"])
        except ImportError:
            continue
        if issubclass(cls, package.LightningModule):
            return package, name
    return None, None


def _submodule(package, name):
    """PACKAGE.NAME (of lightning.pytorch or pytorch_lightning), imported."""
    import importlib
    return importlib.import_module(package.__name__ + "." + name)


def _parse_args(args, package, what):
    """--recipe-arg KEY=VALUE pairs as Trainer arguments, typed by Lightning's own parser;
    gradnorm's own keys (_OWN_KEYS) apart."""
    own, given = {}, []
    for arg in args:
        key, sep, text = arg.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError("--recipe-arg %s: expected KEY=VALUE" % arg)
        if key in _OWN_KEYS:
            own[key] = text.strip()
            continue
        if key in _OWNED:
            raise ValueError("--recipe-arg %s: the scenario decides %s (%s); choose a scenario "
                             "that has what you want (a catalogue scenario or a scenario file)"
                             % (key, key, _OWNED[key]))
        given.append((key, text.strip()))
    if not given:
        return {}, own
    cli = _submodule(package, "cli")
    parser = cli.LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(package.Trainer, "trainer")
    try:
        parsed = parser.parse_args(["--trainer.%s=%s" % (k, v) for k, v in given], defaults=False)
    except Exception as error:  # jsonargparse's ArgumentError, the message names the key
        raise ValueError("--recipe-arg: %s's Trainer argument parser refuses %s: %s"
                         % (what, " ".join("%s=%s" % kv for kv in given),
                            " ".join(str(error).split()))) from None
    return {k: v for k, v in parsed.trainer.items()}, own


class LightningRecipe:
    """The user's LightningModule subclass and the Trainer arguments the user set."""

    def __init__(self, target, args, module_name, framework="lightning"):
        path, _, name = target.rpartition(":")
        if not path.endswith(".py") or not name:
            raise ValueError("--recipe %s:%s: expected %s:PATH.py:CLASS (your LightningModule "
                             "subclass, built as CLASS(model))" % (framework, target, framework))
        self.file = os.path.abspath(path)
        if not os.path.isfile(self.file):
            raise FileNotFoundError("--recipe %s:%s: no such file %s" % (framework, target, path))
        self.target = target
        module = _gt.import_file(self.file, module_name)
        found = getattr(module, name, None)
        package, package_name = _package_of(found) if isinstance(found, type) else (None, None)
        if package is None:
            raise LookupError("--recipe %s:%s: %s defines no LightningModule subclass named "
                              "'%s' (of lightning.pytorch or pytorch_lightning)"
                              % (framework, target, path, name))
        self.cls, self.package = found, package
        distribution = "lightning" if package_name == "lightning.pytorch" else "pytorch_lightning"
        self.what = "%s%s" % (_gf.release(distribution), _gf.origin(distribution))
        self.overrides, own = _parse_args(args, package, self.what)
        self.log_name = own.get("log_name", "loss")
        # gradient_clip_val as given (the harness made the scenario clip to it)
        self.clip = self.overrides.pop("gradient_clip_val", None)
        # accumulate_grad_batches beyond the scenario's window: the window is then the epoch's
        # last, partial one (a one-step scenario's only window)
        self.accumulate = self.overrides.pop("accumulate_grad_batches", None)

    def cannot_run(self, scenario):
        if scenario["model"] != "python":
            return ("Lightning trains a torch module: the scenario's model must come from a "
                    "Python file (model = \"python:FILE.py:FUNCTION\"; --recipe substitutes "
                    "examples/python/tiny_transformer.py for built-in models)")
        if scenario["tp"] > 1 or scenario["cp"] > 1 or scenario["dp_replicate"] > 1:
            return "gradnorm drives Lightning's data parallelism (DDP) only"
        if scenario["optimizer_in_backward"]:
            return "Lightning's automatic optimization steps once per window"
        if scenario["loss"] != "mean_ce":
            return ("the loss is the LightningModule's own training_step, not the scenario's %s"
                    % scenario["loss"])
        if self.accumulate is not None:
            window = scenario["accumulation_steps"]
            if not isinstance(self.accumulate, int) or self.accumulate < window or scenario["steps"] != 1:
                return ("accumulate_grad_batches=%r: the scenario's windows hold %d micro-batches; "
                        "a larger value is judged on one-step scenarios only, whose one window "
                        "is then the epoch's last, partial one (Lightning steps at the end of "
                        "an epoch); a smaller one would step inside the scenario's window"
                        % (self.accumulate, window))
        if self.clip is not None:
            clip = scenario["clip_max_norm"]
            if not isinstance(self.clip, (int, float)) or float(self.clip) != (0.0 if clip is None else clip):
                return ("gradient_clip_val=%r would clip where the scenario %s: give the scenario "
                        "clip_max_norm = %r, or --recipe-arg gradient_clip_val on the command "
                        "line (every scenario then clips to it)"
                        % (self.clip, "does not clip" if clip is None else "clips to %r" % clip,
                           self.clip))
        if scenario["world_size"] > 1 and not _gt._process_is_initialized():
            return ("Lightning on W ranks needs a torch.distributed process group, which "
                    "gradnorm's ranks have only as processes: run it with --nproc W (rank "
                    "processes over Gloo), torchrun or Slurm")
        return None


class _Samples(torch.utils.data.Dataset):
    """Every rank's samples: sample g is rank g % W's sample g // W (DistributedSampler's order
    without shuffling); a rank's samples run step by step, micro-batch by micro-batch,
    sequence by sequence."""

    def __init__(self, run):
        self._run = run

    def __len__(self):
        run = self._run
        return run.dp_size * run.steps * run.accumulation_steps * run.micro_batch_size

    def __getitem__(self, index):
        run = self._run
        k = _gf.own_sample(run, index, "%s's sampler handed rank" % run.framework)
        step, micro, row = _gf.sample_place(run, k)
        run.reached(step)
        tokens, aligned = _gf.aligned_sample(run.ctx.batches_of(step)[micro], row)
        return {"input_ids": tokens.clone(), "labels": aligned}


def logger_class(Logger):
    """A subclass of Logger (Lightning's or Fabric's) keeping what is logged under the run's
    log name, by the optimizer steps taken so far."""

    class Capture(Logger):
        """Keeps what the framework hands its loggers, by the optimizer steps taken so far."""

        def __init__(self, run):
            super().__init__()
            self._run = run

        @property
        def name(self):
            return "gradnorm"

        @property
        def version(self):
            return 0

        def log_hyperparams(self, params, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            name = self._run.recipe.log_name
            for key in (name, name + "_step"):  # NAME_step where it is logged on_epoch too
                if key in metrics:
                    self._run.logged[self._run.stepped] = {"loss": metrics[key]}

    return Capture


def _callback_class(package):
    class HandBack(package.Callback):
        """Hands control back to gradnorm at the first batch after an optimizer step, once
        Lightning has logged that step."""

        def __init__(self, run):
            self._run = run

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self._run.stepped > self._run.step:
                self._run._parent.switch()

    return HandBack


_PRECISION = {"float32": "32-true", "bfloat16": "bf16-true", "float64": "64-true"}


class LightningFamilyRun(_gf.GreenletRun):
    """What Lightning's Trainer and Fabric share on this rank: the environment Lightning reads
    its rank from, the samples and their feeding proof, the clipped norm, the hand-over."""

    takes_closure = True
    framework = "Lightning"

    def __init__(self, recipe, ctx):
        self.recipe = recipe
        self.feeding = _gf.FeedingProof(self.framework, "its sampler")
        self._output = tempfile.TemporaryDirectory(prefix="gradnorm-lightning-")
        super().__init__(ctx)

    def reached(self, step):
        """Called by the samples before one of STEP's is served."""

    def dataloader(self):
        """Every rank's samples behind a DistributedSampler without shuffling (a framework
        keeps a DistributedSampler it is given; the one Lightning's Trainer would put in for
        training shuffles, data_connector.py's _process_dataloader sets is_shuffled = True)."""
        samples = _Samples(self)
        sampler = torch.utils.data.DistributedSampler(
            samples, num_replicas=self.dp_size, rank=self.dp_rank, shuffle=False)
        return torch.utils.data.DataLoader(samples, batch_size=self.micro_batch_size,
                                           sampler=sampler, collate_fn=self.collate)

    def fed_model(self):
        """The scenario's model, recording what reaches it."""
        model = self.scenario_model()
        model.register_forward_pre_hook(
            lambda _m, args, kwargs: self.feeding.fed(kwargs.get("input_ids", args[0] if args else None)),
            with_kwargs=True)
        self.recipe_model = model
        return model

    def environment_plugin(self, package):
        return _submodule(package, "plugins.environments").LightningEnvironment()

    def quiet_warnings(self):
        PossibleUserWarning = _submodule(self.recipe.package, "utilities.warnings").PossibleUserWarning
        # Lightning's advice (a DataLoader without workers, srun present but unused) and a
        # deprecation inside its own _pytree.py.
        return ({"category": PossibleUserWarning}, {"message": "The `srun` command is available"},
                {"message": r"`isinstance\(treespec, LeafSpec\)` is deprecated"})

    def advance(self, ctx, step):
        # The norm Lightning's clipping computed: Lightning discards it
        # (Precision.clip_grad_by_norm), and what clipping returned is what is judged.
        with _gf.recording_clip_norms(self):
            super().advance(ctx, step)

    def _environment(self):
        """Where Lightning's default cluster environment (LightningEnvironment) reads this
        rank's place: LOCAL_RANK present means the processes were made outside Lightning, so
        it launches none. Lightning sets torch's thread count where OMP_NUM_THREADS is unset
        (strategies/launchers/subprocess_script.py); it is set to the harness's."""
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        if self.dp_size == 1:
            return
        os.environ.update(LOCAL_RANK=str(self.dp_rank), NODE_RANK="0",
                          WORLD_SIZE=str(self.dp_size), RANK=str(self.dp_rank))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")

    def _finished(self):
        self._output.cleanup()


class _LightningRun(LightningFamilyRun):
    """Trainer.fit on this rank."""

    def _main(self):
        package = self.recipe.package
        self._environment()
        model = self.fed_model()
        module = self.recipe.cls(model)
        lr = float(self.scenario["learning_rate"])
        # The scenario decides the optimizer: set on this instance, the user's class untouched.
        module.configure_optimizers = lambda: _gf.Optimizer(model.parameters(), lr=lr)
        clip = self.scenario["clip_max_norm"]
        arguments = dict(
            accelerator="cpu", devices=self.dp_size, num_nodes=1,
            strategy="ddp" if self.dp_size > 1 else "auto",
            plugins=[self.environment_plugin(package)],
            precision=_PRECISION[self.scenario["dtype"]],
            max_steps=self.steps, max_epochs=1,
            accumulate_grad_batches=self.recipe.accumulate or self.accumulation_steps,
            gradient_clip_val=None if clip is None else float(clip),
            gradient_clip_algorithm="norm",
            logger=logger_class(_submodule(package, "loggers").Logger)(self), log_every_n_steps=1,
            callbacks=[_callback_class(package)(self)],
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=self._output.name, num_sanity_val_steps=0,
            use_distributed_sampler=True)
        arguments.update(self.recipe.overrides)
        trainer = package.Trainer(**arguments)
        self._check_distributed(trainer)
        trainer.fit(module, train_dataloaders=self.dataloader())
        self.finished = True

    def _check_distributed(self, trainer):
        if trainer.world_size != self.dp_size or trainer.global_rank != self.dp_rank:
            raise RuntimeError(
                "Lightning set up rank %d of %d for rank %d of a scenario of %d ranks"
                % (trainer.global_rank, trainer.world_size, self.dp_rank, self.dp_size))


def make_step(recipe, run_class=None):
    """The step of a Lightning-family run: _LightningRun's, or a subclass's (Fabric's)."""
    run_class = run_class or _LightningRun
    # Loggers write rank 0's values (rank_zero_only): rank 0's is judged on every rank.
    return _gf.framework_step("lightning_step", "lightning run", lambda ctx: run_class(recipe, ctx))


def load_lightning(target, args, module_name, framework="lightning"):
    """(file, step function, cannot_run, objective, what runs) for --recipe lightning:TARGET."""
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError as error:
        raise _gf.import_error(framework, target, error, name="lightning") from None
    recipe = LightningRecipe(target, args, module_name, framework)
    what = "%s (%s's Trainer)" % (target, recipe.what)
    return recipe.file, make_step(recipe), recipe.cannot_run, "scenario_loss", what


_gf.register("lightning", load_lightning)
