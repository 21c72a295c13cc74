"""A user's own training loop on DeepSpeed's engine, unmodified, judged as a gradnorm step
(docs/frameworks.md): the adapter for ``--recipe deepspeed:PATH.py:FUNCTION``. FUNCTION is the
whole loop, called once per rank as

    FUNCTION(engine, dataloader)

* ``engine``: what ``deepspeed.initialize`` returned for the scenario's model (``model(input_ids)``
  returns logits [B, T, V]) and the scenario's optimizer (whose ``step()`` hands what it consumes
  to the harness), with the config ``gradient_accumulation_steps`` the scenario's window,
  ``train_micro_batch_size_per_gpu`` its micro-batch size, ``gradient_clipping`` its clip (0:
  none), ``zero_optimization.stage`` 0 unless ``--recipe-arg zero_optimization.stage=N`` (1 or 2)
  says otherwise, and a CSV monitor of gradnorm's: what the loop writes through
  ``engine.monitor.write_events([(NAME, value, step)])`` under ``Train/Samples/train_loss`` (or
  ``--recipe-arg log_name=NAME``) is judged as the logged loss (DeepSpeed's monitors write on
  rank 0, so rank 0's is judged); on the CPU (DS_ACCELERATOR=cpu), over the harness's Gloo group
  on W rank processes;
* ``dataloader``: this rank's micro-batches in order, dicts ``{"input_ids": [B, T], "labels": [B,
  T]}`` with labels aligned and -100 where not valid; what reached the model is checked at every
  optimizer step (the feeding proof).

The loop calls ``engine(input_ids)``, ``engine.backward(loss)`` and ``engine.step()`` per
micro-batch (the engine steps the optimizer on the window's last), and logs the step's loss
before the next micro-batch's forward: gradnorm hands control back at the first forward after
each optimizer step. The clipped norm judged is the one the engine reports
(``engine.get_global_grad_norm()``); at ZeRO 0 the engine reports none (runtime/engine.py,
``_take_model_step``: only a ZeRO optimizer keeps ``_global_grad_norm``), and the norm its
``clip_grad_norm_`` returned is judged instead.

``--recipe-arg`` also sets DeepSpeed config keys that bear on the arithmetic (KEY=VALUE, dotted:
``zero_optimization.reduce_bucket_size=500``); ``gradient_accumulation_steps=K`` larger than the
scenario's window is judged on one-step scenarios, whose window is then partial.
"""

import csv
import os
import tempfile

import torch

import gradnorm_frameworks as _gf
import gradnorm_torch as _gt

# Top-level config keys a --recipe-arg may set beside zero_optimization.*, and the ones gradnorm
# sets itself with the reason.
_SETTABLE = ("gradient_accumulation_steps", "gradient_clipping", "gradient_predivide_factor",
             "prescale_gradients", "communication_data_type", "steps_per_print",
             "wall_clock_breakdown", "zero_allow_untested_optimizer")
_OWNED = {
    "train_batch_size": "the scenario's micro-batches and ranks make it",
    "train_micro_batch_size_per_gpu": "the scenario's micro-batch size",
    "optimizer": "the scenario's optimizer is what steps, in the harness",
    "scheduler": "the scenario's learning rate holds",
    "fp16": "gradnorm drives DeepSpeed in float32 (the scenario's dtype)",
    "bf16": "gradnorm drives DeepSpeed in float32 (the scenario's dtype)",
    "amp": "gradnorm drives DeepSpeed in float32 (the scenario's dtype)",
    "csv_monitor": "gradnorm's monitor reads the logged loss",
    "tensorboard": "gradnorm's monitor reads the logged loss",
    "wandb": "gradnorm's monitor reads the logged loss",
    "comet": "gradnorm's monitor reads the logged loss",
}
_STAGES = (0, 1, 2)


class DeepSpeedLoop(_gf.UserLoop):
    """The user's loop function, gradnorm's own keys and DeepSpeed config keys (--recipe-arg)."""

    CALL = "FUNCTION(engine, dataloader)"
    WHO = "a DeepSpeed loop"
    FRAMEWORK = "DeepSpeed"
    LOG_NAME = "Train/Samples/train_loss"
    TAKES = ("log_name=NAME or a DeepSpeed config key: zero_optimization.FIELD=VALUE or one of "
             + ", ".join(_SETTABLE))

    def __init__(self, target, args, module_name, framework="deepspeed"):
        self.config = {}  # dotted key -> value, from --recipe-arg
        super().__init__(target, args, module_name, framework)
        import deepspeed
        self._check_zero()
        given = ", ".join("%s=%r" % item for item in sorted(self.config.items())
                          if item[0] != "zero_optimization.stage")
        self.what = "deepspeed %s's engine, ZeRO %d%s" % (
            deepspeed.__version__, self.stage, ", " + given if given else "")

    def _check_zero(self):
        """The zero_optimization fields given, checked by DeepSpeed's own model of them (which
        refuses unknown fields) before anything runs."""
        import pydantic
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
        zero = _nested(self.config).get("zero_optimization", {})
        try:
            DeepSpeedZeroConfig(**zero)
        except pydantic.ValidationError as error:
            raise ValueError("--recipe-arg: DeepSpeed's zero_optimization refuses %s: %s"
                             % (zero, "; ".join("%s: %s" % (".".join(map(str, e["loc"])), e["msg"])
                                                for e in error.errors()))) from None

    @property
    def stage(self):
        return self.config.get("zero_optimization.stage", 0)

    def take(self, key, text, arg):
        top, dot, field = key.partition(".")
        if top in _OWNED:
            raise ValueError("--recipe-arg %s: %s is gradnorm's to set: %s" % (arg, top, _OWNED[top]))
        if top != "zero_optimization" and (key not in _SETTABLE):
            return False
        value = _gf.literal(text)
        if key == "zero_optimization.stage" and value not in _STAGES:
            raise ValueError("--recipe-arg %s: gradnorm judges ZeRO stages 0, 1 and 2 (stage 3 "
                             "partitions the parameters themselves, which the harness's hand-over "
                             "does not gather)" % arg)
        if field.startswith("offload_"):
            raise ValueError("--recipe-arg %s: offloading steps DeepSpeed's own compiled CPU "
                             "optimizer, not the scenario's" % arg)
        if key == "gradient_accumulation_steps" and (isinstance(value, bool)
                                                     or not isinstance(value, int) or value < 1):
            raise ValueError("--recipe-arg %s: a whole number of micro-batches >= 1" % arg)
        if key == "zero_optimization" or (top == "zero_optimization" and not dot):
            raise ValueError("--recipe-arg %s: set its fields: zero_optimization.FIELD=VALUE" % arg)
        self.config[key] = value
        return True

    def cannot_run(self, scenario):
        if not _gt._process_is_initialized():
            return ("DeepSpeed makes process groups of its own (torch.distributed.new_group), "
                    "which gradnorm's ranks offer only as processes: run it with --nproc W (1 "
                    "on one device), torchrun or Slurm")
        reason = super().cannot_run(scenario)
        if reason is not None:
            return reason
        if scenario["dtype"] != "float32":
            return ("gradnorm drives DeepSpeed in float32: its bf16 and fp16 modes train an fp32 "
                    "master copy in its own optimizer wrapper")
        accumulate = self.config.get("gradient_accumulation_steps")
        window = scenario["accumulation_steps"]
        if accumulate is not None and (accumulate < window or (accumulate > window and
                                                               scenario["steps"] != 1)):
            return ("gradient_accumulation_steps=%d: the scenario's windows hold %d micro-batches; "
                    "a larger value is judged on one-step scenarios only, whose one window is "
                    "then partial; a smaller one would step inside the scenario's window"
                    % (accumulate, window))
        clip = self.config.get("gradient_clipping")
        if clip is not None and float(clip) != (scenario["clip_max_norm"] or 0.0):
            return ("gradient_clipping=%r would clip where the scenario %s"
                    % (clip, "does not clip" if scenario["clip_max_norm"] is None
                       else "clips to %r" % scenario["clip_max_norm"]))
        return None

    def engine_config(self, run, monitor_path):
        clip = run.scenario["clip_max_norm"]
        config = {
            "train_micro_batch_size_per_gpu": run.micro_batch_size,
            "gradient_accumulation_steps": run.accumulation_steps,
            "gradient_clipping": 0.0 if clip is None else float(clip),
            "zero_optimization": {"stage": 0},
            # The scenario's optimizer is a torch optimizer of gradnorm's, which ZeRO wraps.
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2 ** 31 - 1,
            "csv_monitor": {"enabled": True, "output_path": monitor_path, "job_name": "gradnorm"},
        }
        config["train_batch_size"] = (run.micro_batch_size * run.dp_size
                                      * self.config.get("gradient_accumulation_steps",
                                                        run.accumulation_steps))
        for key, value in _nested(self.config).items():
            if isinstance(value, dict):
                config.setdefault(key, {}).update(value)
            else:
                config[key] = value
        return config


def _nested(dotted):
    """{"a.b": 1, "c": 2} as {"a": {"b": 1}, "c": 2}."""
    nested = {}
    for key, value in dotted.items():
        parts = key.split(".")
        place = nested
        for part in parts[:-1]:
            place = place.setdefault(part, {})
        place[parts[-1]] = value
    return nested


def _import_deepspeed():
    """deepspeed, imported on the CPU accelerator, with its shared-memory communication op
    declared unavailable: DeepSpeed's CPU backend compiles it at run time (a C++ build into
    $HOME's torch_extensions cache) and maps shared memory between the ranks, and uses it only
    for inference_all_reduce (deepspeed/comm/torch.py: build_shm_op, inference_all_reduce),
    never in training, so the training path is unchanged and every collective is the Gloo
    group's. The set of compatible ops is DeepSpeed's own dictionary, which it keeps for such
    edits (deepspeed/ops/__init__.py)."""
    wanted = os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if wanted != "cpu":
        raise ValueError("DS_ACCELERATOR=%s: gradnorm drives DeepSpeed on the CPU (unset it, "
                         "or set it to cpu)" % wanted)
    import deepspeed
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    if get_accelerator().device_name() != "cpu":
        raise _gf.Unsupported("deepspeed chose the %s accelerator, not the CPU"
                              % get_accelerator().device_name())
    compatible = deepspeed.ops.__compatible_ops__
    compatible["deepspeed_shm_comm"] = False
    return deepspeed


class _DeepSpeedRun(_gf.GreenletRun):
    """The user's loop on this rank."""

    framework = "DeepSpeed"

    def __init__(self, recipe, ctx):
        self.recipe = recipe
        self.feeding = _gf.FeedingProof("DeepSpeed", "the loop")
        self._output = tempfile.TemporaryDirectory(prefix="gradnorm-deepspeed-")
        self._monitor_rows = 0
        self.engine = None
        super().__init__(ctx)

    def quiet_warnings(self):
        # DeepSpeed's ZeRO calls torch.distributed.all_gather_into_tensor, which torch 2.13
        # marks deprecated.
        return ({"message": ".*all_gather_into_tensor.* is deprecated"},)

    def advance(self, ctx, step):
        deepspeed = self._deepspeed
        real = deepspeed.runtime.engine.clip_grad_norm_

        def clip(*args, **kwargs):  # ZeRO 0: the norm the engine computes and discards
            norm = real(*args, **kwargs)
            self.clip_norms[self.stepped + 1] = float(norm)
            return norm
        deepspeed.runtime.engine.clip_grad_norm_ = clip
        try:
            super().advance(ctx, step)
        finally:
            deepspeed.runtime.engine.clip_grad_norm_ = real
        self.before_hand_back()

    @property
    def _deepspeed(self):
        import deepspeed
        import deepspeed.runtime.engine  # noqa: F401
        return deepspeed

    def before_hand_back(self):
        """What the engine reported for the steps taken: its norm, and the rows the loop wrote
        to the monitor since the last read (the last of them is the step's logged loss)."""
        if self.engine is None or self.stepped == 0:
            return
        norm = self.engine.get_global_grad_norm()
        if norm is not None:
            self.clip_norms[self.stepped] = float(norm)
        name = self.recipe.log_name.replace("/", "_").replace(" ", "_")
        path = os.path.join(self._output.name, "gradnorm", name + ".csv")
        if not os.path.exists(path):
            return
        with open(path, newline="") as file:
            rows = list(csv.reader(file))[1:]  # a header row, then (step, value) rows
        if len(rows) > self._monitor_rows:
            self.logged[self.stepped] = {"loss": float(rows[-1][1])}
            self._monitor_rows = len(rows)

    def _main(self):
        deepspeed = _import_deepspeed()
        _gf.rank_environment(self)
        if self.dp_size == 1:
            # deepspeed.initialize asserts LOCAL_RANK is set (runtime/engine.py,
            # _set_distributed_vars) even on one rank.
            os.environ.setdefault("LOCAL_RANK", "0")
        model = self.scenario_model()
        self.hand_back_at_forward(model)
        self.recipe_model = model
        optimizer = _gf.Optimizer(model.parameters(), lr=float(self.scenario["learning_rate"]))
        config = self.recipe.engine_config(self, self._output.name)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        if engine.world_size != self.dp_size or engine.global_rank != self.dp_rank:
            raise RuntimeError("DeepSpeed set up rank %d of %d for rank %d of a scenario of %d "
                               "ranks" % (engine.global_rank, engine.world_size, self.dp_rank,
                                          self.dp_size))
        if engine.zero_optimization_stage() != self.recipe.stage:
            raise RuntimeError("DeepSpeed set up ZeRO %d, not %d"
                               % (engine.zero_optimization_stage(), self.recipe.stage))
        self.engine = engine
        loader = torch.utils.data.DataLoader(_gf.RankSamples(self), batch_size=self.micro_batch_size,
                                             shuffle=False, collate_fn=self.collate)
        self.recipe.function(engine, loader)
        self.before_hand_back()
        self.finished = True

    def _finished(self):
        self._output.cleanup()

    # ZeRO 1 and 2: the optimizer holds this rank's partition of a flat fp32 copy.
    def hand_over(self, optimizer):
        if self.recipe.stage == 0:
            return super().hand_over(optimizer)
        self.count_step()
        grads = {id(p): self._full_partitioned_grad(p, optimizer)
                 for p in self.recipe_model.parameters() if p.requires_grad}
        self._step_harness([p for p in self.recipe_model.parameters() if p.requires_grad], grads)

    def _full_partitioned_grad(self, param, optimizer):
        """The gradient the optimizer consumes for PARAM, gathered from every rank's partition:
        each rank's fragment of PARAM lies in its flat fp32 partition (the optimizer's
        parameter of the fragment's group), whose .grad ZeRO has averaged and clipped; the
        fragments are summed into a zero buffer over the data-parallel group. This is the
        reconstruction DeepSpeed's own get_full_hp_grad does (deepspeed/utils/tensor_fragment.py)
        from the gradients before clipping; here it reads what the optimizer steps with."""
        import deepspeed.comm as dist
        buffer = torch.zeros(param.numel(), dtype=torch.float32)
        mapping = getattr(param, "_hp_mapping", None)
        if mapping is not None:
            flat = optimizer.param_groups[mapping.param_group_index]["params"][0]
            if (flat.grad is None or mapping.hp_fragment.untyped_storage().data_ptr()
                    != flat.untyped_storage().data_ptr()):
                raise _gf.Unsupported("DeepSpeed's ZeRO partition of %s is not where gradnorm "
                                      "reads it (its optimizer's flat fp32 group)" % tuple(
                                          n for n, p in self.recipe_model.named_parameters()
                                          if p is param))
            hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
            buffer.narrow(0, lp.start, lp.numel).copy_(flat.grad.narrow(0, hp.start, hp.numel))
        dist.all_reduce(buffer, group=param._dp_group)
        return buffer.view_as(param)

    def write(self, param, value):
        if self.recipe.stage == 0:
            return super().write(param, value)
        from deepspeed.utils import safe_set_full_fp32_param
        # ZeRO copies its fp32 partition into the model's parameters after the step.
        safe_set_full_fp32_param(param, value)


def make_step(recipe):
    def step(ctx):
        run = _gf.resumed(ctx, "deepspeed run", lambda: _DeepSpeedRun(recipe, ctx))
        engine = run.engine
        if run.stepped != ctx.step_index + 1 and engine is not None:
            raise RuntimeError(
                "DeepSpeed did not step its optimizer in gradnorm step %d: its engine counted %d "
                "micro-steps in all and steps where (micro_steps + 1) %% "
                "gradient_accumulation_steps == 0, with gradient_accumulation_steps=%d; the loop "
                "ran out of data before that" % (ctx.step_index, engine.micro_steps,
                                                 engine.gradient_accumulation_steps()))
        # DeepSpeed's monitors write on rank 0: rank 0's is judged on every rank.
        return _gf.stepped_values(run, ctx)
    step.__name__ = "deepspeed_step"
    return step


def load_deepspeed(target, args, module_name, framework="deepspeed"):
    """(file, step function, cannot_run, objective, what runs) for --recipe deepspeed:TARGET."""
    try:
        _import_deepspeed()
    except ImportError as error:
        raise _gf.import_error(framework, target, error,
                               "scripts/install-deps.sh installs requirements-deepspeed.txt's pins",
                               "deepspeed") from None
    loop = DeepSpeedLoop(target, args, module_name, framework)
    return loop.file, make_step(loop), loop.cannot_run, "scenario_loss", "%s (%s)" % (target, loop.what)


_gf.register("deepspeed", load_deepspeed)
