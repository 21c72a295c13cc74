"""A user's training loop on Lightning Fabric, unmodified, judged as a gradnorm step
(docs/frameworks.md): the adapter for ``--recipe fabric:PATH.py:FUNCTION``. Fabric is
Lightning's, so this adapter extends Lightning's (python/adapters/lightning.py): the same
samples, feeding proof, clipped norm and hand-over; what differs is who writes the loop.

FUNCTION is the whole loop, called once per rank as

    FUNCTION(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm)

* ``fabric``: a ``lightning.fabric.Fabric`` already launched: ``accelerator="cpu"``,
  ``devices=W``, ``strategy="ddp"`` on W ranks over the harness's Gloo group, ``precision``
  the scenario's dtype, ``loggers`` one of gradnorm's (what ``fabric.log("loss", value)``
  writes is the logged loss; ``--recipe-arg log_name=NAME`` names another);
* ``model``: the scenario's model (``model(input_ids)`` returns logits [B, T, V]), not set up;
* ``optimizer``: the scenario's optimizer over the model's parameters, not set up; its
  ``step()`` hands what it consumes to the harness;
* ``dataloader``: this rank's micro-batches in order, as dicts ``{"input_ids": [B, T],
  "labels": [B, T]}`` with labels aligned and -100 where not valid, behind a
  ``DistributedSampler`` without shuffling (``fabric.setup_dataloaders`` keeps it);
* ``accumulation_steps``: the micro-batches of one optimizer step;
* ``max_grad_norm``: the scenario's clip, or None.

The loop sets up what it wants (``fabric.setup``, ``fabric.setup_dataloaders``), and steps
the optimizer once per window of ``accumulation_steps`` micro-batches; it logs the step's loss
after the step and before it takes the next micro-batch. gradnorm resumes the loop once per
step: the dataloader's first sample of the next step hands control back.
"""

import gradnorm_frameworks as _gf
import gradnorm_lightning as _gl

_PRECISION = {"float32": "32-true", "bfloat16": "bf16-true", "float64": "64-true"}


class FabricLoop(_gf.UserLoop):
    """The user's loop function and gradnorm's own keys (--recipe-arg)."""

    CALL = "FUNCTION(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm)"
    WHO = "a Fabric loop"
    FRAMEWORK = "Fabric"
    TAKES = ("log_name=NAME only; Fabric's constructor arguments are the scenario's (devices, "
             "strategy, precision) and the loop is yours")

    def __init__(self, target, args, module_name, framework="fabric"):
        super().__init__(target, args, module_name, framework)
        import lightning.fabric as package
        self.package = package
        self.what = "%s's Fabric%s" % (_gf.release("lightning"), _gf.origin("lightning"))


class _FabricRun(_gl.LightningFamilyRun):
    """The user's loop on this rank."""

    framework = "Fabric"
    takes_closure = False

    def reached(self, step):
        """The loop asked for a sample of a later step: its step is done (and logged, by the
        contract), so gradnorm judges it before the loop goes on."""
        while step > self.step:
            self._parent.switch()
        if step < self.step:
            raise RuntimeError("the loop asked for a sample of step %d during step %d"
                               % (step, self.step))

    def _main(self):
        package = self.recipe.package
        self._environment()
        clip = self.scenario["clip_max_norm"]
        fabric = package.Fabric(
            accelerator="cpu", devices=self.dp_size, num_nodes=1,
            strategy="ddp" if self.dp_size > 1 else "auto",
            plugins=[self.environment_plugin(package)],
            precision=_PRECISION[self.scenario["dtype"]],
            loggers=[_gl.logger_class(_gl._submodule(package, "loggers").Logger)(self)])
        fabric.launch()
        if fabric.world_size != self.dp_size or fabric.global_rank != self.dp_rank:
            raise RuntimeError("Fabric set up rank %d of %d for rank %d of a scenario of %d ranks"
                               % (fabric.global_rank, fabric.world_size, self.dp_rank,
                                  self.dp_size))
        model = self.fed_model()
        optimizer = _gf.Optimizer(model.parameters(), lr=float(self.scenario["learning_rate"]))
        self.recipe.function(fabric, model, optimizer, self.dataloader(), self.accumulation_steps,
                             None if clip is None else float(clip))
        self.finished = True


def load_fabric(target, args, module_name, framework="fabric"):
    """(file, step function, cannot_run, objective, what runs) for --recipe fabric:TARGET."""
    try:
        import lightning.fabric  # noqa: F401
    except ImportError as error:
        raise _gf.import_error(framework, target, error, name="lightning") from None
    loop = FabricLoop(target, args, module_name, framework)
    return (loop.file, _gl.make_step(loop, _FabricRun), loop.cannot_run, "scenario_loss",
            "%s (%s)" % (target, loop.what))


_gf.register("fabric", load_fabric)
