"""Real framework code judged as gradnorm steps (docs/design.md §11).

``gradnorm run --recipe torchtune:NAME`` (or ``torchtune:PATH.py``) runs the installed
torchtune's recipe class, unmodified, for the scenario's steps. The recipe gets an OmegaConf
config whose ``_component_`` entries point here:

* ``model``: the scenario's model from its Python file (model = "python:FILE.py:FUNCTION"),
  built by the recipe as it builds any torchtune builder;
* ``checkpointer``: loads gradnorm's initial parameters (the harness's, so the oracle starts
  where the recipe starts) and keeps nothing it is asked to save;
* ``tokenizer``: a stand-in with a ``pad_id`` (the batches are already tokens);
* ``dataset``: the scenario's micro-batches, one sample per sequence, in the order the
  recipe's sampler asks for them (its index names the step, micro-batch, sequence and rank,
  and a sample asked for by the wrong rank is an error);
* ``optimizer``: a torch optimizer whose ``step()`` hands the gradients the recipe produced
  to the harness's recording optimizer, which steps the harness's parameters; the updated
  values are copied back into the recipe's model;
* ``metric_logger``: keeps the ``loss`` and ``grad_norm`` the recipe logs;
* for a distilling recipe, ``teacher_model`` (the scenario's model function again) and
  ``teacher_checkpointer`` (the harness's frozen teacher, ``ctx.teacher``), with torchtune's
  forward-KL loss and the scenario's ``kd_ratio``;
* for a QAT recipe, torchtune's own QAT quantizer, its fake quantisation held off past the
  last step by the recipe's ``fake_quant_after_n_steps`` (the oracle has none).

The loss is torchtune's own (the scenario's loss kind names which). Everything that counts,
scales, reduces, clips, steps or logs is the recipe's code. The recipe runs as one training
run over every step of the scenario, inside a greenlet of the rank's own thread: each
gradnorm step resumes it until it asks its dataset for the next step's first sample (or
finishes), so running sums the recipe carries between steps are its own.

What is replaced from outside the recipe (module attributes, the recipe file untouched) is
listed in ``REPLACED`` and in docs/frameworks.md.
"""

import functools
import os
import sys
import tempfile
import threading

import torch

import gradnorm_torch as _gt

IGNORE_INDEX = -100

# What gradnorm replaces from outside a torchtune recipe, and why: none of it counts, scales,
# reduces, clips, steps or logs.
REPLACED = (
    ("init_process_group, in the recipe module",
     "the harness made torch.distributed's default Gloo group over its own store before the "
     "recipe starts; torch refuses a second one. The replacement checks that the group "
     "exists and is Gloo, and the recipe's collectives then run on it"),
    ("destroy_process_group, in the recipe module",
     "the harness owns the group and still needs it after the recipe's cleanup"),
    ("tqdm, in the recipe module",
     "the progress bar, disabled: it would interleave with gradnorm's table on stderr"),
    ("torchtune.training.cleanup_before_training",
     "it empties the device's cache and resets its peak-memory statistics, which torch.cpu "
     "does not have (AttributeError: module 'torch.cpu' has no attribute 'empty_cache', "
     "torchtune/training/memory.py:51, called from the distributed recipes' train()). "
     "Replaced by its first line, gc.collect()"),
    ("torchtune.training.get_memory_stats and log_memory_stats",
     "they raise on CPU ('Logging memory stats is not supported on CPU devices'); the "
     "distributed recipes call them unconditionally on rank 0. Replaced by functions that "
     "return and log nothing"),
)

_local = threading.local()  # .run: the recipe run executing on this thread


def _current_run():
    run = getattr(_local, "run", None)
    if run is None:
        raise RuntimeError("gradnorm_recipes components are built by a gradnorm recipe run "
                           "only (gradnorm run --recipe)")
    return run


class Unsupported(_gt.GradnormUnsupported):
    """The recipe cannot be driven on this scenario or launcher, for a stated reason."""


# --- torchtune components ------------------------------------------------------------------


def model(**_ignored):
    """The scenario's Python-file model, built as the recipe builds any builder (under its
    default dtype and device: torch.device("meta") in the distributed recipes)."""
    run = _current_run()
    run.recipe_model = _build_scenario_model(run)
    return run.recipe_model


def teacher_model(**_ignored):
    """A distilling recipe's teacher: the scenario's Python-file model again (its weights come
    from the teacher checkpointer)."""
    return _build_scenario_model(_current_run())


def _build_scenario_model(run):
    s = run.scenario
    return _gt.build_model(run.model_function, run.model_file, run.model_file, s["vocab_size"],
                           s["hidden_size"], s["sequence_length"], s["seed"])


def _checkpoint_of(module):
    """A checkpointer's load_checkpoint() result: a copy of MODULE's state as the model."""
    with torch.no_grad():
        return {"model": {name: tensor.detach().clone()
                          for name, tensor in module.state_dict().items()}}


class TeacherCheckpointer:
    """Loads the harness's frozen teacher (the scenario's model built from the teacher's own
    seed stream, the one the oracle distils from)."""

    def __init__(self, **_ignored):
        self._run = _current_run()

    def load_checkpoint(self):
        teacher = self._run.ctx.teacher
        if teacher is None:
            raise RuntimeError("a distilling recipe ran without the harness's teacher")
        return _checkpoint_of(teacher)


class Checkpointer:
    """Loads gradnorm's initial parameters (the harness's, as they are when the recipe
    starts); saves nothing (what the recipe saves is not judged)."""

    def __init__(self, should_load_recipe_state=False, **_ignored):
        if should_load_recipe_state:
            raise Unsupported("resume_from_checkpoint: gradnorm starts every recipe run from "
                              "the scenario's initial parameters")
        self._run = _current_run()

    def load_checkpoint(self):
        return _checkpoint_of(self._run.harness_model)

    def save_checkpoint(self, state_dict, epoch, intermediate_checkpoint=False, **_ignored):
        self._run.saved_epochs.append(int(epoch))


class Tokenizer:
    """A stand-in: the dataset yields token ids already; the collate function reads pad_id."""

    pad_id = 0
    eos_id = 1
    bos_id = 2

    def __init__(self, **_ignored):
        pass


class Dataset(torch.utils.data.Dataset):
    """The scenario's micro-batches, one sample per sequence, for every data-parallel rank:
    sample g is rank g % W's sample g // W (the order torch's DistributedSampler hands them
    out without shuffling), and a rank's samples run step by step, micro-batch by
    micro-batch, sequence by sequence. Labels are aligned with tokens, as a torchtune
    dataset returns them: [first label, shifted labels[:T-1]]."""

    def __init__(self, tokenizer=None, **_ignored):
        self._run = _current_run()

    def __len__(self):
        run = self._run
        return run.steps * run.accumulation_steps * run.micro_batch_size * run.dp_size

    def __getitem__(self, index):
        run = self._run
        index = int(index)
        rank, k = index % run.dp_size, index // run.dp_size
        if rank != run.dp_rank:
            raise Unsupported(
                "the recipe's sampler handed data-parallel rank %d the sample %d, which is rank "
                "%d's: gradnorm's dataset follows torch's DistributedSampler order (rank r gets "
                "r, r+W, ...) without shuffling" % (run.dp_rank, index, rank))
        per_step = run.accumulation_steps * run.micro_batch_size
        step, within = k // per_step, k % per_step
        micro, row = within // run.micro_batch_size, within % run.micro_batch_size
        run.wait_for_step(step)
        batch = run.ctx.micro_batches[micro]
        tokens = batch["tokens"][row]
        shifted = batch["labels"][row]
        if int(shifted[-1]) != IGNORE_INDEX:
            raise RuntimeError("gradnorm bug: a shifted label at position T-1")
        aligned = torch.cat([batch["first_labels"][row:row + 1], shifted[:-1]])
        run.samples_served += 1
        return {"tokens": tokens.tolist(), "labels": aligned.tolist()}


class MetricLogger:
    """Keeps what the recipe logs: {global step: {"loss": ..., "grad_norm": ...}}."""

    def __init__(self, **_ignored):
        self._run = _current_run()

    def log_config(self, config):
        pass

    def log(self, name, data, step):
        self._run.logged.setdefault(int(step), {})[name] = data

    def log_dict(self, payload, step):
        for name, data in payload.items():
            self.log(name, data, step)

    def close(self):
        pass


class Optimizer(torch.optim.Optimizer):
    """A torch optimizer whose step() gives the recipe's gradients to the harness's
    recording optimizer: the full gradient of each parameter (gathered where fully_shard
    made it a DTensor) becomes the harness parameter's .grad, the harness steps with the
    scenario's optimizer, and the updated values are copied back into the recipe's model.
    Per-parameter optimizers (optimizer_in_bwd) each hand over their parameter's gradient;
    the harness steps once all of them have."""

    def __init__(self, params, lr=1e-3, **extra):
        params = list(params)
        super().__init__(params, dict(lr=lr, **extra))
        self._run = _current_run()
        self._run.optimizers.append(self)

    def step(self, closure=None):
        if closure is not None:
            raise TypeError("gradnorm's optimizer takes no closure")
        self._run.hand_over(self)

    @property
    def params(self):
        return [p for group in self.param_groups for p in group["params"]]


def constant_lr(optimizer, num_training_steps=None, last_epoch=-1, **_ignored):
    """The recipe's scheduler: a factor of 1 at every step (the scenario's rate holds)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: 1.0, last_epoch=last_epoch)


def _cleanup_before_training():
    import gc
    gc.collect()


def _get_memory_stats(device, reset_stats=True):
    return {}


def _log_memory_stats(stats, message=""):
    pass


def _init_process_group(*args, **kwargs):
    import torch.distributed as dist
    if not _gt._process_is_initialized():
        raise Unsupported("this recipe needs a torch.distributed process group, which "
                          "gradnorm's ranks have only as processes: run it with --nproc W "
                          "(rank processes over Gloo), torchrun or Slurm")
    backend = dist.get_backend()
    if backend != "gloo":
        raise Unsupported("the harness's process group is %s; recipes run over Gloo" % backend)


def _destroy_process_group(*args, **kwargs):
    pass


# --- loading a recipe ----------------------------------------------------------------------


def torchtune_recipes():
    """{name: file} of every recipe the installed torchtune ships (its registry, which
    `tune ls` and `tune run` read)."""
    import torchtune
    from torchtune._recipe_registry import get_all_recipes
    root = os.path.dirname(os.path.dirname(os.path.abspath(torchtune.__file__)))
    return {r.name: os.path.join(root, "recipes", r.file_path) for r in get_all_recipes()}


# The recipes that train with token-count normalisation and that gradnorm drives; the others
# (generation, evaluation, quantisation, preference and RL training) are refused by name.
TORCHTUNE_COVERED = ("full_finetune_single_device", "full_finetune_distributed",
                     "lora_finetune_single_device", "lora_finetune_distributed",
                     "knowledge_distillation_single_device",
                     "knowledge_distillation_distributed", "qat_distributed",
                     "qat_lora_finetune_distributed")
TORCHTUNE_NOT_COVERED = {
    "generate": "generates text; trains nothing",
    "eleuther_eval": "evaluates a model; trains nothing",
    "quantize": "quantises a checkpoint; trains nothing",
    "lora_dpo_single_device": "preference (DPO) loss over chosen/rejected pairs, not a token "
                              "mean: a different contract",
    "lora_dpo_distributed": "preference (DPO) loss over chosen/rejected pairs, not a token "
                            "mean: a different contract",
    "full_dpo_distributed": "preference (DPO) loss over chosen/rejected pairs, not a token "
                            "mean: a different contract",
    "ppo_full_finetune_single_device": "PPO: generates rollouts and trains a value model, not "
                                       "a token-mean contract",
}

_ENV_READY = False


def _prepare_environment():
    """Once per process: put the REPLACED torchtune helpers in place."""
    global _ENV_READY
    if _ENV_READY:
        return
    import torchtune.training as training
    training.get_memory_stats = _get_memory_stats
    training.log_memory_stats = _log_memory_stats
    training.cleanup_before_training = _cleanup_before_training
    _ENV_READY = True


def _recipe_class(module, path):
    # torchtune.recipe_interfaces.FTRecipeInterface is a Protocol (no isinstance): a recipe
    # class is a class of the file with its setup, train and cleanup.
    found = [value for value in vars(module).values()
             if isinstance(value, type) and value.__module__ == module.__name__
             and all(callable(getattr(value, m, None)) for m in ("setup", "train", "cleanup"))]
    if len(found) != 1:
        raise LookupError("%s defines %d recipe classes (classes with setup, train and "
                          "cleanup, as torchtune.recipe_interfaces.FTRecipeInterface has); "
                          "gradnorm drives a file with exactly one" % (path, len(found)))
    return found[0]


class Recipe:
    """One recipe file and the config keys the user set (--recipe-arg)."""

    def __init__(self, name, path, args, module_name):
        self.name = name
        self.file = path
        self.args = list(args)
        _prepare_environment()
        self.module = _gt.import_file(path, module_name)
        self.cls = _recipe_class(self.module, path)
        self.distributed = "init_process_group" in vars(self.module)
        # A recipe that reads cfg.teacher_model distils: the oracle then judges
        # (1 - kd_ratio) * CE + kd_ratio * forward KL against the harness's teacher.
        with open(path, encoding="utf-8") as source:
            text = source.read()
        self.distils = "cfg.teacher_model" in text
        # A QAT recipe fake-quantises its linears (torchao) once its quantizer prepared the
        # model; gradnorm's oracle has no torchao fake quantisation, so the forward must stay
        # the model's: the recipe's own fake_quant_after_n_steps holds it off for the run.
        self.quantizes = 'cfg.get("quantizer"' in text
        self.delays_fake_quant = 'cfg.get("fake_quant_after_n_steps"' in text
        # The names the recipe module imported, replaced in its own namespace only.
        if "init_process_group" in vars(self.module):
            self.module.init_process_group = _init_process_group
        if "destroy_process_group" in vars(self.module):
            self.module.destroy_process_group = _destroy_process_group
        if "tqdm" in vars(self.module):
            bar = self.module.tqdm

            @functools.wraps(bar)
            def quiet_bar(*args, **kwargs):
                kwargs["disable"] = True  # the distributed recipes pass disable= themselves
                return bar(*args, **kwargs)
            self.module.tqdm = quiet_bar
        from omegaconf import OmegaConf
        try:
            self.overrides = OmegaConf.from_dotlist(self.args)
        except Exception as error:  # OmegaConf's own grammar errors
            raise ValueError("--recipe-arg: %s" % error) from None
        for key in self.args:
            _check_override(key.split("=", 1)[0].strip())

    def cannot_run(self, scenario):
        if scenario["model"] != "python":
            return ("the recipe builds its model from a builder: the scenario's model must be "
                    "a torchtune module from a Python file (model = \"python:FILE.py:FUNCTION\"; "
                    "--recipe substitutes one for built-in models)")
        if scenario["dtype"] not in ("float32", "bfloat16"):
            return "torchtune trains in fp32 or bf16 (training.get_dtype); the scenario is %s" % (
                scenario["dtype"])
        if scenario["tp"] > 1 or scenario["cp"] > 1 or scenario["dp_replicate"] > 1:
            return "gradnorm drives the recipe's data-parallel (FSDP) mesh only"
        if not self.distributed and scenario["world_size"] > 1:
            return "a single-device recipe; the scenario has %d ranks" % scenario["world_size"]
        if self.distributed and not _gt._process_is_initialized():
            return ("a distributed recipe needs a torch.distributed process group, which "
                    "gradnorm's ranks have only as processes: run it with --nproc W (rank "
                    "processes over Gloo), torchrun or Slurm")
        if self.quantizes and not self.delays_fake_quant:
            return ("the recipe fake-quantises its linears from the first step (its quantizer "
                    "prepares the model and it reads no fake_quant_after_n_steps) and gradnorm's "
                    "oracle has no torchao fake quantisation: the normalisation cannot be judged "
                    "apart from the quantisation error")
        if scenario["loss"] not in _LOSSES:
            import torchtune.modules.loss as losses
            if scenario["loss"] == "linear_ce" and not hasattr(losses, "LinearCrossEntropyLoss"):
                return ("the installed torchtune has no LinearCrossEntropyLoss (torchtune %s's "
                        "torchtune.modules.loss)" % _torchtune_version())
            return "no torchtune loss for the scenario's loss %s" % scenario["loss"]
        return None

    def config(self, scenario, output_dir, model_config=None):
        from omegaconf import OmegaConf
        clip = scenario["clip_max_norm"]
        loss_component, loss_args = _LOSSES[scenario["loss"]]
        loss = {"_component_": loss_component}
        if "num_output_chunks" in loss_args:
            loss["num_output_chunks"] = int(scenario["loss_chunks"])
        here = __name__
        base = {
            "output_dir": output_dir,
            "device": "cpu",
            "dtype": {"float32": "fp32", "bfloat16": "bf16"}[scenario["dtype"]],
            "seed": int(scenario["seed"]),
            "epochs": 1,
            "max_steps_per_epoch": None,
            "batch_size": int(scenario["micro_batch_size"]),
            "gradient_accumulation_steps": int(scenario["accumulation_steps"]),
            "optimizer_in_bwd": bool(scenario["optimizer_in_backward"]),
            "clip_grad_norm": None if clip is None else float(clip),
            "compile": False,
            "shuffle": False,
            "resume_from_checkpoint": False,
            "enable_activation_checkpointing": False,
            "enable_activation_offloading": False,
            "log_every_n_steps": 1,
            "log_peak_memory_stats": False,
            # A model function may say what a recipe reads from its model section (the LoRA
            # recipes read cfg.model.lora_rank, lora_attn_modules, ...): its torchtune_config.
            "model": dict(model_config or {}, _component_=here + ".model"),
            # The LoRA recipes require a scheduler; the learning rate is the scenario's, which
            # the harness's optimizer applies, so this one keeps it constant.
            "lr_scheduler": {"_component_": here + ".constant_lr"},
            "tokenizer": {"_component_": here + ".Tokenizer"},
            "checkpointer": {"_component_": here + ".Checkpointer"},
            "dataset": {"_component_": here + ".Dataset"},
            "optimizer": {"_component_": here + ".Optimizer",
                          "lr": float(scenario["learning_rate"])},
            "loss": loss,
            "metric_logger": {"_component_": here + ".MetricLogger"},
            "profiler": {"enabled": False},
        }
        if self.quantizes:
            # torchtune's own QAT quantizer (int8 dynamic activations, int4 grouped weights),
            # its fake quantisation held off past the scenario's last step.
            hidden = int(scenario["hidden_size"])
            base.update({
                "quantizer": {"_component_":
                              "torchtune.training.quantization.Int8DynActInt4WeightQATQuantizer",
                              "groupsize": hidden},
                "fake_quant_after_n_steps": int(scenario["steps"]) + 1,
            })
        if self.distils:
            kd_component, kd_args = _KD_LOSSES[scenario["loss"]]
            kd_loss = {"_component_": kd_component}
            if "num_output_chunks" in kd_args:
                kd_loss["num_output_chunks"] = int(scenario["loss_chunks"])
            base.update({
                "teacher_model": dict(model_config or {}, _component_=here + ".teacher_model"),
                "teacher_checkpointer": {"_component_": here + ".TeacherCheckpointer"},
                "kd_loss": kd_loss,
                "kd_ratio": float(scenario["kd_ratio"]),
            })
        return OmegaConf.merge(OmegaConf.create(base), self.overrides)


def _torchtune_version():
    import importlib.metadata
    return importlib.metadata.version("torchtune")


# scenario loss -> (torchtune component, its arguments); all three are token means.
_LOSSES = {
    "mean_ce": ("torch.nn.CrossEntropyLoss", ()),
    "chunked_ce": ("torchtune.modules.loss.CEWithChunkedOutputLoss", ("num_output_chunks",)),
}

# scenario loss -> the distilling recipes' forward-KL loss of the same shape (torchtune's own).
_KD_LOSSES = {
    "mean_ce": ("torchtune.modules.loss.ForwardKLLoss", ()),
    "chunked_ce": ("torchtune.modules.loss.ForwardKLWithChunkedOutputLoss", ("num_output_chunks",)),
}

# Config keys the scenario decides: a --recipe-arg may not set them, since the oracle judges
# the scenario.
_OWNED = {
    "batch_size": "micro_batch_size", "gradient_accumulation_steps": "accumulation_steps",
    "dtype": "dtype", "seed": "seed", "epochs": "steps", "max_steps_per_epoch": "steps",
    "clip_grad_norm": "clip_max_norm", "optimizer_in_bwd": "optimizer_in_backward",
    "device": "(gradnorm runs on the CPU)", "model": "model", "dataset": "valid_tokens",
    "tokenizer": "(the dataset yields token ids)", "checkpointer": "(the initial parameters)",
    "optimizer": "optimizer", "metric_logger": "(gradnorm keeps what the recipe logs)",
    "shuffle": "(the dataset order is the scenario's)",
    "resume_from_checkpoint": "(every run starts from the initial parameters)",
    "kd_ratio": "kd_ratio", "teacher_model": "(the scenario's model, the teacher's weights)",
    "teacher_checkpointer": "(the harness's teacher)",
    "quantizer": "(torchtune's QAT quantizer, its fake quantisation held off)",
    "fake_quant_after_n_steps": "(after the last step: the oracle has no fake quantisation)",
}


def _check_override(key):
    top = key.split(".", 1)[0]
    if top in _OWNED:
        raise ValueError("--recipe-arg %s: the scenario decides %s (%s); choose a scenario that "
                         "has what you want (a catalogue scenario or a scenario file)"
                         % (key, top, _OWNED[top]))


# --- one run of a recipe on one rank -------------------------------------------------------


class GreenletRun:
    """A framework's one training run on this rank (a torchtune recipe, a Transformers
    Trainer), run inside a greenlet of the rank's own thread and resumed once per gradnorm
    step (advance); _main is the run itself and switches back to the harness between steps.
    The framework's optimizer is an Optimizer (below), which hands its gradients over here."""

    def __init__(self, ctx):
        self.scenario = ctx.scenario
        self.ctx = ctx
        self.model_file = self.scenario["model_file"]
        self.model_function = _model_function(self.model_file, self.scenario["model_function"])
        self.harness_model = ctx.model
        self.harness_named = dict(ctx.model.named_parameters())
        self.steps = int(self.scenario["steps"])
        self.accumulation_steps = int(self.scenario["accumulation_steps"])
        self.micro_batch_size = int(self.scenario["micro_batch_size"])
        self.dp_size = int(self.scenario["data_parallel_size"])
        self.dp_rank = ctx.rank
        self.step = 0  # the gradnorm step the run may serve samples of
        self.logged = {}
        self.optimizers = []
        self.pending = {}  # optimizer_in_bwd: parameter -> gradient handed over
        self.recipe_model = None
        self.finished = False
        from greenlet import greenlet
        self._greenlet = greenlet(self._main)

    def _main(self):
        raise NotImplementedError

    def _finished(self):
        """Called once the run has returned."""

    def advance(self, ctx, step):
        self.ctx = ctx
        self.step = step
        if self.finished:
            return
        from greenlet import getcurrent
        self._parent = getcurrent()
        previous = getattr(_local, "run", None)
        _local.run = self
        # The frameworks' logs (info, and warnings such as torchtune's " Profiling disabled."
        # on every run) and a deprecation warning of torchdata's would interleave with
        # gradnorm's table; errors still show, and what the framework does is what gradnorm
        # judges.
        import logging
        import warnings
        quiet = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
                self._greenlet.switch()
        finally:
            logging.disable(quiet)
            _local.run = previous
        if self._greenlet.dead:
            self.finished = True
            self._finished()

    # The optimizer's side.
    def _names(self):
        named = {}
        for name, p in self.recipe_model.named_parameters():
            named[id(p)] = (name, p)
        return named

    def hand_over(self, optimizer):
        if self.recipe_model is None:
            raise RuntimeError("the optimizer stepped before the model was built")
        if len(self.optimizers) == 1:
            self._step_harness([p for p in optimizer.params if p.grad is not None])
            return
        # optimizer_in_bwd: one optimizer per parameter, each stepped from a hook in backward.
        for p in optimizer.params:
            if p.grad is not None:
                self.pending[id(p)] = (p, _full(p.grad).detach().clone())
        waiting = sum(1 for o in self.optimizers for p in o.params if p.requires_grad)
        if len(self.pending) == waiting:
            pending, self.pending = self.pending, {}
            self._step_harness([p for p, _ in pending.values()],
                               {id(p): g for p, g in pending.values()})

    def _step_harness(self, params, grads=None):
        names = self._names()
        pairs = []
        for p in params:
            if id(p) not in names:
                raise RuntimeError("the recipe's optimizer holds a parameter its model does not")
            name, _ = names[id(p)]
            target = self.harness_named.get(name)
            if target is None:
                raise Unsupported("the recipe's model has a parameter %s the scenario's model "
                                  "has not" % name)
            grad = grads[id(p)] if grads is not None else _full(p.grad)
            target.grad = grad.detach().to(target.dtype).clone()
            pairs.append((target, p))
        self.ctx.optimizer.step()
        with torch.no_grad():
            for target, p in pairs:
                _write(p, target.detach())
        self.ctx.optimizer.zero_grad(set_to_none=True)


class _Run(GreenletRun):
    """A torchtune recipe's one training run on this rank."""

    def __init__(self, recipe, ctx):
        self.recipe = recipe
        self.samples_served = 0
        self.saved_epochs = []
        self._output = tempfile.TemporaryDirectory(prefix="gradnorm-recipe-")
        super().__init__(ctx)

    def _main(self):
        cfg = self.recipe.config(self.scenario, self._output.name,
                                 getattr(self.model_function, "torchtune_config", None))
        try:
            instance = self.recipe.cls(cfg=cfg)
        except _gt.GradnormUnsupported:
            raise
        except Exception as error:
            # The recipe's constructor validates its configuration (torchtune raises there for
            # combinations it does not support): a refusal, like a reference's, cited where
            # the recipe raised it.
            raise _gt.Refusal("%s (at %s)" % (_gt._message_of(error),
                                              _gt.where_raised(error, self.recipe.file))) from error
        instance.setup(cfg=cfg)
        instance.train()
        instance.cleanup()
        self.finished = True

    def _finished(self):
        self._output.cleanup()

    def wait_for_step(self, step):
        """Called by the dataset: a sample of a later step waits until gradnorm runs it."""
        while step > self.step:
            self._parent.switch()
        if step < self.step:
            raise RuntimeError("the recipe asked for a sample of step %d during step %d"
                               % (step, self.step))


def _full(tensor):
    from torch.distributed.tensor import DTensor
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _write(param, value):
    from torch.distributed.tensor import DTensor, distribute_tensor
    if isinstance(param, DTensor):
        local = distribute_tensor(value.to(param.dtype), param.device_mesh,
                                  param.placements).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(value.to(param.dtype))


def _model_function(path, function):
    wanted = os.path.abspath(path)
    for module in list(sys.modules.values()):
        if os.path.abspath(getattr(module, "__file__", "") or "") == wanted and hasattr(module, function):
            return getattr(module, function)
    raise LookupError("the scenario's model file %s is not loaded" % path)


# --- the step gradnorm runs ------------------------------------------------------------------


def _loss_of(logged, step):
    entry = logged.get(step, {})
    out = {}
    for key, name in (("loss", "loss_to_log"), ("grad_norm", "grad_norm")):
        value = entry.get(key)
        if value is not None:
            out[name] = float(value.detach().item()) if isinstance(value, torch.Tensor) else float(value)
    return out


def _from_rank_zero(logged):
    """torchtune's distributed recipes log on rank 0 only (`and self._is_rank_zero` before
    their metric logger's log_dict): every rank reports what rank 0 logged, sent from rank 0
    after the step (one broadcast, outside the recipe), so the verdict judges rank 0's log."""
    import torch.distributed as dist
    keys = ("loss_to_log", "grad_norm")
    packed = torch.tensor([[1.0 if k in logged else 0.0, float(logged.get(k, 0.0))] for k in keys],
                          dtype=torch.float64)
    dist.broadcast(packed, src=0)
    return {k: float(packed[i, 1]) for i, k in enumerate(keys) if packed[i, 0] != 0}


def make_step(recipe):
    def step(ctx):
        run = ctx.state.get("recipe run")
        if run is None:
            run = ctx.state["recipe run"] = _Run(recipe, ctx)
        run.advance(ctx, ctx.step_index)
        # The recipe's global_step counts from 1.
        logged = _loss_of(run.logged, ctx.step_index + 1)
        if recipe.distributed and ctx.world_size > 1:
            return _from_rank_zero(logged)
        return logged
    step.__name__ = "recipe_step"
    return step


_loaded = {}


def load_recipe(framework, target, args, module_name):
    """(file, step function, cannot_run, objective, what runs) for --recipe FRAMEWORK:TARGET."""
    if framework in ("transformers", "trl"):
        import gradnorm_transformers
        return gradnorm_transformers.load_trainer(target, args, module_name, framework)
    if framework != "torchtune":
        raise ValueError("--recipe %s:%s: unknown framework '%s' (known: torchtune, "
                         "transformers, trl)" % (framework, target, framework))
    if target.endswith(".py"):
        path, name = os.path.abspath(target), os.path.splitext(os.path.basename(target))[0]
        if not os.path.isfile(path):
            raise FileNotFoundError("--recipe torchtune:%s: no such file" % target)
    else:
        try:
            known = torchtune_recipes()
        except ImportError as error:
            raise ImportError("--recipe torchtune:%s: torchtune does not import here (%s); "
                              "scripts/install-deps.sh installs requirements.txt's pins"
                              % (target, error)) from None
        if target in TORCHTUNE_NOT_COVERED:
            raise ValueError("--recipe torchtune:%s: not judged by gradnorm: %s"
                             % (target, TORCHTUNE_NOT_COVERED[target]))
        if target not in known:
            raise ValueError("--recipe torchtune:%s: the installed torchtune ships no such "
                             "recipe; it ships %s" % (target, ", ".join(sorted(known))))
        path, name = known[target], target
    key = (path, tuple(args))
    if key not in _loaded:
        _loaded[key] = Recipe(name, path, args, module_name)
    recipe = _loaded[key]
    objective = "knowledge_distillation" if recipe.distils else "scenario_loss"
    return (recipe.file, make_step(recipe), recipe.cannot_run, objective,
            "torchtune %s's %s" % (_torchtune_version(), name))
