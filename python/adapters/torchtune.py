"""torchtune's recipes, unmodified, judged as gradnorm steps (docs/design.md §14): the
adapter for ``--recipe torchtune:...`` over the shared machinery (python/gradnorm_frameworks.py).

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

import torch

import gradnorm_frameworks as _gf
import gradnorm_torch as _gt
# The recipe's config names these as components of this module.
from gradnorm_frameworks import Optimizer, constant_lr  # noqa: F401

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

_current_run = _gf.current_run
Unsupported = _gf.Unsupported


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
        k = _gf.own_sample(run, index, "the recipe's sampler handed data-parallel rank")
        step, micro, row = _gf.sample_place(run, k)
        run.wait_for_step(step)
        tokens, aligned = _gf.aligned_sample(run.ctx.micro_batches[micro], row)
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
        for arg in self.args:
            # OmegaConf takes "foo" as foo=None and "=1" as an empty key; tune run's overrides
            # are KEY=VALUE, as Trainer's --recipe-arg are.
            if "=" not in arg or not arg.split("=", 1)[0].strip():
                raise ValueError("--recipe-arg %s: expected KEY=VALUE (a config key, dotted, "
                                 "as tune run takes it: optimizer.lr=2e-5)" % arg)
        try:
            self.overrides = OmegaConf.from_dotlist(self.args)
        except Exception as error:  # OmegaConf's own grammar errors
            raise ValueError("--recipe-arg: %s" % error) from None
        for key in self.args:
            _check_override(key.split("=", 1)[0].strip())
        self._warn_unread(text)

    def _warn_unread(self, text):
        """tune run takes a config key no recipe reads and says nothing (a typo,
        optimizer.lr vs. optimzer.lr, trains as if it were not there): warned here, naming
        the key, when the recipe's source never names its first part."""
        import re
        for arg in self.args:
            key = arg.split("=", 1)[0].strip()
            top = key.split(".", 1)[0]
            if top in _OWNED or re.search(r"\b%s\b" % re.escape(top), text):
                continue
            # gradnorm's own word: past the streams that hold the code under test's output.
            sys.__stderr__.write("gradnorm: warning: --recipe-arg %s: %s never reads a config "
                                 "key '%s' (tune run would take it silently too): a typo?\n"
                                 % (arg, os.path.basename(self.file), top))

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
    # The harness's optimizer applies the scenario's learning rate, constant: a scheduler
    # would change what the oracle's update is judged against.
    "lr_scheduler": "learning_rate (constant, applied by the harness's optimizer)",
}
# What a --recipe-arg may still set, and why: loss (the oracle judges the scenario's loss, so a
# loss that differs from it is judged wrong, as it should be), profiler (changes no number; it
# writes under the run's own output_dir), and any key the recipe reads that is not above
# (compile, activation checkpointing, logging). None of this is a security boundary: a
# _component_ names any callable, and a scenario file and its recipe_args are code
# (docs/ranks.md, "Trust boundary").


def _check_override(key):
    top = key.split(".", 1)[0]
    if top in _OWNED:
        raise ValueError("--recipe-arg %s: the scenario decides %s (%s); choose a scenario that "
                         "has what you want (a catalogue scenario or a scenario file)"
                         % (key, top, _OWNED[top]))


# --- one run of a recipe on one rank -------------------------------------------------------


class _Run(_gf.GreenletRun):
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
        except (_gt.GradnormUnsupported, MemoryError, RecursionError):
            raise  # the process ran out of something: not a refusal of the configuration
        except (ValueError, RuntimeError) as error:
            # The recipe's constructor validates its configuration (torchtune 0.6.1's recipes
            # raise ValueError or RuntimeError there, 45 times, for combinations they do not
            # support): a refusal, like a reference's, cited where the recipe raised it. Any
            # other exception (a NameError in a copied recipe) is the recipe's error.
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


# --- the step gradnorm runs ------------------------------------------------------------------


def make_step(recipe):
    def step(ctx):
        run = _gf.resumed(ctx, "recipe run", lambda: _Run(recipe, ctx))
        # The recipe's global_step counts from 1.
        logged = _gf.logged_values(run.logged, ctx.step_index + 1)
        if recipe.distributed and ctx.world_size > 1:
            return _gf.from_rank_zero(logged)
        return logged
    step.__name__ = "recipe_step"
    return step


_loaded = {}


def load_recipe(target, args, module_name, framework="torchtune"):
    """(file, step function, cannot_run, objective, what runs) for --recipe torchtune:TARGET."""
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
    if target.endswith(".py"):
        # The user's file, named as theirs: it read as "torchtune 0.6.1's STEM".
        runs = "%s (a recipe file, on %s%s)" % (target, _gf.release("torchtune"),
                                                _gf.origin("torchtune"))
    else:
        runs = "%s's %s%s" % (_gf.release("torchtune"), name, _gf.origin("torchtune"))
    return (recipe.file, make_step(recipe), recipe.cannot_run, objective, runs)


_gf.register("torchtune", load_recipe)
