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

The loop prepares what it wants, steps once per window and logs the step's loss after the
optimizer step, before the next micro-batch's forward: gradnorm hands control back at the first
forward after each optimizer step.
"""

import os
import tempfile

import torch

import gradnorm_frameworks as _gf
import gradnorm_torch as _gt


class AccelerateLoop:
    """The user's loop function and gradnorm's own keys (--recipe-arg)."""

    def __init__(self, target, args, module_name, framework="accelerate"):
        path, _, name = target.rpartition(":")
        if not path.endswith(".py") or not name:
            raise ValueError("--recipe %s:%s: expected %s:PATH.py:FUNCTION (your loop, called as "
                             "FUNCTION(accelerator, model, optimizer, dataloader, max_grad_norm))"
                             % (framework, target, framework))
        self.file = os.path.abspath(path)
        if not os.path.isfile(self.file):
            raise FileNotFoundError("--recipe %s:%s: no such file %s" % (framework, target, path))
        module = _gt.import_file(self.file, module_name)
        found = getattr(module, name, None)
        if not callable(found) or isinstance(found, type):
            raise LookupError("--recipe %s:%s: %s defines no function named '%s'"
                              % (framework, target, path, name))
        self.function = found
        self.log_name = "loss"
        for arg in args:
            key, sep, text = arg.partition("=")
            if key.strip() == "log_name" and sep:
                self.log_name = text.strip()
                continue
            raise ValueError("--recipe-arg %s: an Accelerate loop takes log_name=NAME only "
                             "(the Accelerator's other arguments are not settable yet)" % arg)
        import importlib.metadata
        self.what = "accelerate %s's Accelerator" % importlib.metadata.version("accelerate")

    def cannot_run(self, scenario):
        if scenario["model"] != "python":
            return ("an Accelerate loop trains a torch module: the scenario's model must come from "
                    "a Python file (--recipe substitutes examples/python/tiny_transformer.py for "
                    "built-in models)")
        if scenario["tp"] > 1 or scenario["cp"] > 1 or scenario["dp_replicate"] > 1:
            return "gradnorm gives Accelerate data parallelism (DDP) only"
        if scenario["optimizer_in_backward"]:
            return "an Accelerate loop steps its optimizer once per window"
        if scenario["loss"] != "mean_ce":
            return "the loss is the loop's own, not the scenario's %s" % scenario["loss"]
        if scenario["world_size"] > 1 and not _gt._process_is_initialized():
            return ("Accelerate on W ranks needs a torch.distributed process group, which "
                    "gradnorm's ranks have only as processes: run it with --nproc W (rank "
                    "processes over Gloo), torchrun or Slurm")
        return None


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

    def _environment(self):
        """What accelerate reads to find this rank's place (its state.py, CPU ranks), set
        before the Accelerator builds its state; OMP_NUM_THREADS the harness's thread count
        (accelerate otherwise changes torch's)."""
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        if self.dp_size == 1:
            return
        os.environ.update(RANK=str(self.dp_rank), WORLD_SIZE=str(self.dp_size),
                          LOCAL_RANK=str(self.dp_rank), LOCAL_WORLD_SIZE=str(self.dp_size))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")

    def collate(self, samples):
        batch = torch.utils.data.default_collate(samples)
        self.feeding.collated(batch["input_ids"])
        return batch

    def _forward_begins(self, _module, args, kwargs):
        # The first forward after an optimizer step begins the next step: gradnorm judges the
        # step before it (logged by then, by the contract).
        while self.stepped > self.step:
            self._parent.switch()
        self.feeding.fed(kwargs.get("input_ids", args[0] if args else None))

    def _main(self):
        from accelerate import Accelerator
        self._environment()
        model = self.scenario_model()
        model.register_forward_pre_hook(self._forward_begins, with_kwargs=True)
        self.recipe_model = model
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=self.accumulation_steps,
                                  log_with=[_tracker_class()(self)],
                                  project_dir=self._output.name)
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


def make_step(recipe):
    def step(ctx):
        run = _gf.resumed(ctx, "accelerate run", lambda: _AccelerateRun(recipe, ctx))
        # Trackers log on the main process: rank 0's is judged on every rank.
        return _gf.stepped_values(run, ctx)
    step.__name__ = "accelerate_step"
    return step


def load_accelerate(target, args, module_name, framework="accelerate"):
    """(file, step function, cannot_run, objective, what runs) for --recipe accelerate:TARGET."""
    try:
        import accelerate  # noqa: F401
    except ImportError as error:
        raise ImportError("--recipe %s:%s: accelerate does not import here (%s: %s); "
                          "scripts/install-deps.sh installs requirements.txt's pins"
                          % (framework, target, type(error).__name__, error)) from None
    loop = AccelerateLoop(target, args, module_name, framework)
    return loop.file, make_step(loop), loop.cannot_run, "scenario_loss", "%s (%s)" % (target, loop.what)


_gf.register("accelerate", load_accelerate)
