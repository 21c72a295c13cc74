"""A user's own training loop on Hugging Face Accelerate, unmodified, judged as a gradnorm step
(docs/frameworks.md): the adapter for ``--recipe accelerate:PATH.py:FUNCTION``. FUNCTION is the
whole loop, called once per rank as

    FUNCTION(accelerator, model, optimizer, dataloader, max_grad_norm)

* ``accelerator``: an ``accelerate.Accelerator`` gradnorm made: ``cpu=True``,
  ``gradient_accumulation_steps`` the scenario's, on W rank processes over the harness's Gloo
  group (accelerate finds torch.distributed initialised and uses it; the run stops unless it
  reports W processes of type MULTI_CPU), with one tracker of gradnorm's through accelerate's
  tracker API (``log_with``, ``init_trackers`` already called), so that
  ``accelerator.log({"loss": value})`` is what is judged as the logged loss (``--recipe-arg
  log_name=NAME`` reads another name); loggers write on the main process, so rank 0's is judged;
* ``model``: the scenario's model (``model(input_ids)`` returns logits [B, T, V]), not prepared;
* ``optimizer``: the scenario's optimizer over the model's parameters, not prepared; its
  ``step()`` hands what it consumes to the harness (accelerate's wrapper calls it only when the
  window's gradients are synchronised);
* ``dataloader``: every rank's micro-batches, dicts ``{"input_ids": [B, T], "labels": [B, T]}``
  with labels aligned and -100 where not valid, laid out so that ``accelerator.prepare`` (which
  hands batch g to rank g mod W, in order) gives each rank its own micro-batches in order; what
  reached each rank is checked at every optimizer step (the feeding proof);
* ``max_grad_norm``: the scenario's clip, or None (the norm ``accelerator.clip_grad_norm_``
  computes is recorded as it returns it).

``--recipe-arg`` sets the Accelerator's other arguments: KEY=VALUE for an argument of
``Accelerator`` (``even_batches`` and the like; those gradnorm sets itself are refused with the
reason), ``dataloader_config.FIELD=VALUE`` and ``gradient_accumulation_plugin.FIELD=VALUE`` for a
field of its DataLoaderConfiguration or GradientAccumulationPlugin, and
``gradient_accumulation_steps=K``: a K larger than the scenario's window is judged on one-step
scenarios, whose one window is then the data's last, partial one.

The loop prepares what it wants, steps once per window and logs the step's loss after the
optimizer step, before the next micro-batch's forward: gradnorm hands control back at the first
forward after each optimizer step.
"""

import os
import tempfile

import torch

import gradnorm_frameworks as _gf
import gradnorm_torch as _gt


# Accelerator arguments gradnorm sets itself, and why a --recipe-arg may not.
_OWNED = {
    "cpu": "gradnorm's ranks run on the CPU",
    "log_with": "gradnorm's tracker is what is judged as the logged loss",
    "project_dir": "gradnorm's tracker needs no folder; the run's own is temporary",
    "project_config": "gradnorm's tracker needs no folder; the run's own is temporary",
    "mixed_precision": "the scenario's dtype is what is trained and judged",
    "deepspeed_plugin": "--recipe deepspeed:PATH.py:FUNCTION judges a DeepSpeed loop",
    "deepspeed_plugins": "--recipe deepspeed:PATH.py:FUNCTION judges a DeepSpeed loop",
    "fsdp_plugin": "gradnorm gives Accelerate data parallelism (DDP) only",
    "torch_tp_plugin": "gradnorm gives Accelerate data parallelism (DDP) only",
    "megatron_lm_plugin": "gradnorm gives Accelerate data parallelism (DDP) only",
    "parallelism_config": "gradnorm gives Accelerate data parallelism (DDP) only",
    "kwargs_handlers": "handlers are objects, which a command line cannot give",
    "rng_types": "the dataloader is gradnorm's and does not shuffle",
}


class AccelerateLoop(_gf.UserLoop):
    """The user's loop function, gradnorm's own keys and the Accelerator's arguments given by
    --recipe-arg: KEY=VALUE for an argument of Accelerator, dataloader_config.FIELD=VALUE and
    gradient_accumulation_plugin.FIELD=VALUE for a field of its DataLoaderConfiguration or
    GradientAccumulationPlugin (VALUE read by gradnorm_frameworks.literal).
    gradient_accumulation_steps=K is the scenario's window unless given: a larger K is judged
    on one-step scenarios, whose one window is then the data's last, partial one."""

    CALL = "FUNCTION(accelerator, model, optimizer, dataloader, max_grad_norm)"
    WHO = "an Accelerate loop"
    FRAMEWORK = "Accelerate"
    TAKES = ("log_name=NAME or an argument of accelerate's Accelerator (KEY=VALUE, "
             "dataloader_config.FIELD=VALUE, gradient_accumulation_plugin.FIELD=VALUE)")

    def __init__(self, target, args, module_name, framework="accelerate"):
        self.accelerator_args = {}
        self.plugins = {"dataloader_config": {}, "gradient_accumulation_plugin": {}}
        self.accumulate = None
        super().__init__(target, args, module_name, framework)
        given = ["%s=%r" % item for item in self.accelerator_args.items()]
        for head, fields in self.plugins.items():
            given += ["%s.%s=%r" % (head, k, v) for k, v in fields.items()]
        if self.accumulate is not None:
            given.append("gradient_accumulation_steps=%r" % self.accumulate)
        self.what = "%s's Accelerator%s%s" % (
            _gf.release("accelerate"), "(%s)" % ", ".join(given) if given else "",
            _gf.origin("accelerate"))

    def take(self, key, text, arg):
        import dataclasses
        import inspect

        import accelerate
        from accelerate.utils import DataLoaderConfiguration, GradientAccumulationPlugin
        head, dot, field = key.partition(".")
        if head not in inspect.signature(accelerate.Accelerator.__init__).parameters or head == "self":
            return False
        if head in _OWNED:
            raise ValueError("--recipe-arg %s: %s is gradnorm's to set: %s" % (arg, head, _OWNED[head]))
        value = _gf.literal(text)
        if head in self.plugins:
            cls = DataLoaderConfiguration if head == "dataloader_config" else GradientAccumulationPlugin
            fields = [f.name for f in dataclasses.fields(cls) if f.name != "num_steps"]
            if field not in fields:
                raise ValueError("--recipe-arg %s: %s's fields are %s (%s.FIELD=VALUE; its "
                                 "num_steps is gradient_accumulation_steps)"
                                 % (arg, head, ", ".join(fields), head))
            self.plugins[head][field] = value
        elif dot:
            raise ValueError("--recipe-arg %s: %s is no dataclass of fields" % (arg, head))
        elif head == "gradient_accumulation_steps":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError("--recipe-arg %s: a whole number of micro-batches >= 1" % arg)
            self.accumulate = value
        else:
            self.accelerator_args[head] = value
        return True

    def cannot_run(self, scenario):
        reason = super().cannot_run(scenario)
        if reason is None and self.accumulate is not None:
            window = scenario["accumulation_steps"]
            if self.accumulate < window or (self.accumulate > window and scenario["steps"] != 1):
                return ("gradient_accumulation_steps=%d: the scenario's windows hold %d "
                        "micro-batches; a larger value is judged on one-step scenarios only, "
                        "whose one window is then the data's last, partial one; a smaller one "
                        "would step inside the scenario's window" % (self.accumulate, window))
        return reason


class _Samples(torch.utils.data.Dataset):
    """Every rank's micro-batches, laid out as accelerate's sharding reads them: global batch
    g (of B sequences) is rank g % W's micro-batch g // W, a rank's micro-batches running step
    by step."""

    def __init__(self, run):
        self._run = run

    def __len__(self):
        run = self._run
        return run.dp_size * run.steps * run.accumulation_steps * run.micro_batch_size

    def __getitem__(self, index):
        run = self._run
        batch, row = divmod(int(index), run.micro_batch_size)
        rank, k = batch % run.dp_size, batch // run.dp_size
        if rank != run.dp_rank:
            raise _gf.Unsupported(
                "accelerate's sharding handed rank %d a sequence of rank %d's micro-batch %d: "
                "gradnorm lays batch g out for rank g mod W" % (run.dp_rank, rank, batch))
        step, micro = divmod(k, run.accumulation_steps)
        tokens, aligned = _gf.aligned_sample(run.ctx.batches_of(step)[micro], row)
        return {"input_ids": tokens.clone(), "labels": aligned}


def _tracker_class():
    from accelerate.tracking import GeneralTracker

    class Capture(GeneralTracker):
        """Keeps what the loop logs under the run's log name, by the optimizer steps taken."""

        name = "gradnorm"
        requires_logging_directory = False
        main_process_only = True

        def __init__(self, run):
            super().__init__()
            self._run = run

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            pass

        def log(self, values, step=None, **kwargs):
            if self._run.recipe.log_name in values:
                self._run.logged[self._run.stepped] = {"loss": values[self._run.recipe.log_name]}

    return Capture


class _AccelerateRun(_gf.GreenletRun):
    """The user's loop on this rank."""

    framework = "Accelerate"

    def __init__(self, recipe, ctx):
        self.recipe = recipe
        self.feeding = _gf.FeedingProof("Accelerate", "its sharding")
        self._output = tempfile.TemporaryDirectory(prefix="gradnorm-accelerate-")
        super().__init__(ctx)

    def advance(self, ctx, step):
        with _gf.recording_clip_norms(self):
            super().advance(ctx, step)

    def _main(self):
        from accelerate import Accelerator
        _gf.rank_environment(self)
        model = self.scenario_model()
        self.hand_back_at_forward(model)
        self.recipe_model = model
        from accelerate.utils import DataLoaderConfiguration, GradientAccumulationPlugin
        recipe = self.recipe
        kwargs = dict(recipe.accelerator_args, cpu=True, log_with=[_tracker_class()(self)],
                      project_dir=self._output.name)
        kwargs["gradient_accumulation_plugin"] = GradientAccumulationPlugin(
            num_steps=recipe.accumulate or self.accumulation_steps,
            **recipe.plugins["gradient_accumulation_plugin"])
        if recipe.plugins["dataloader_config"]:
            kwargs["dataloader_config"] = DataLoaderConfiguration(**recipe.plugins["dataloader_config"])
        accelerator = Accelerator(**kwargs)
        kind = str(accelerator.distributed_type).split(".")[-1]
        if accelerator.num_processes != self.dp_size or (self.dp_size > 1 and kind != "MULTI_CPU"):
            raise RuntimeError("accelerate set up %d process(es) (%s) for a scenario of %d ranks: "
                               "each rank would train alone"
                               % (accelerator.num_processes, kind, self.dp_size))
        accelerator.init_trackers("gradnorm")
        optimizer = _gf.Optimizer(model.parameters(), lr=float(self.scenario["learning_rate"]))
        loader = torch.utils.data.DataLoader(_Samples(self), batch_size=self.micro_batch_size,
                                             shuffle=False, collate_fn=self.collate)
        clip = self.scenario["clip_max_norm"]
        self.recipe.function(accelerator, model, optimizer, loader,
                             None if clip is None else float(clip))
        self.finished = True

    def _finished(self):
        self._output.cleanup()


def make_step(loop):
    # Trackers log on the main process: rank 0's is judged on every rank.
    return _gf.framework_step("accelerate_step", "accelerate run", lambda ctx: _AccelerateRun(loop, ctx))


def load_accelerate(target, args, module_name, framework="accelerate"):
    """(file, step function, cannot_run, objective, what runs) for --recipe accelerate:TARGET."""
    try:
        import accelerate  # noqa: F401
    except ImportError as error:
        raise _gf.import_error(framework, target, error, name="accelerate") from None
    loop = AccelerateLoop(target, args, module_name, framework)
    return loop.file, make_step(loop), loop.cannot_run, "scenario_loss", "%s (%s)" % (target, loop.what)


_gf.register("accelerate", load_accelerate)
