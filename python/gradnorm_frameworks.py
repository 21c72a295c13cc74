"""What every framework adapter needs, in one place (docs/design.md §14), and the registry of
adapters by name.

An adapter (python/adapters/NAME.py, one file per framework) says how its framework is
driven; everything below is the same for all of them:

* a **run**: the framework's one training run on this rank (``GreenletRun``), inside a
  greenlet of the rank's own thread, resumed once per gradnorm step, so that what the
  framework carries between steps is its own;
* the **samples** a rank trains on: the scenario's micro-batches as sequences with labels
  aligned to the tokens (``aligned_sample``), and the **feeding proof** (``FeedingProof``):
  at every optimizer step, what the framework's dataloader collated and what reached the
  model are this step's micro-batches in order, so a rank fed anything else is an error,
  not a verdict;
* an **optimizer** (``Optimizer``) whose ``step()`` hands what the framework produced to the
  harness's recording optimizer, and copies the updated values back;
* the **logged values** (``logged_values``, ``from_rank_zero``): what the framework logged
  at a step, as the verdict reads it.

An adapter registers itself with ``register(NAME, load)``; ``load_recipe`` (what the harness
calls for ``--recipe NAME:TARGET``) finds it by name. Adapters import this module, never
each other's internals, except TRL's, which is Trainer's subclass and extends its adapter.
"""

import os
import sys
import threading

import torch

import gradnorm_torch as _gt

IGNORE_INDEX = -100

_local = threading.local()  # .run: the framework run executing on this thread


def current_run():
    run = getattr(_local, "run", None)
    if run is None:
        raise RuntimeError("gradnorm's framework components are built by a gradnorm recipe run "
                           "only (gradnorm run --recipe)")
    return run


class Unsupported(_gt.GradnormUnsupported):
    """The framework cannot be driven on this scenario or launcher, for a stated reason."""


# --- the registry -----------------------------------------------------------------------------

_ADAPTERS = {}  # name -> load(target, args, module_name, framework)


def register(name, load):
    """Makes ``--recipe NAME:TARGET`` call ``load(target, args, module_name, name)``, which
    returns (file, step function, cannot_run, objective, what runs)."""
    if name in _ADAPTERS:
        raise RuntimeError("gradnorm bug: two adapters register the framework '%s'" % name)
    _ADAPTERS[name] = load


def load_adapters(sources):
    """Imports every adapter compiled into gradnorm ({module name: source}), each as its own
    module (so an adapter may import another, as TRL's imports Trainer's), in name order; each
    registers its framework as it is imported."""
    import importlib
    import importlib.abc
    import importlib.util

    class Embedded(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name not in sources:
                return None
            return importlib.util.spec_from_loader(name, self, origin=name + ".py")

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            module.__file__ = module.__name__ + ".py"
            # Compiled under its own name, so tracebacks through it read NAME.py.
            exec(compile(sources[module.__name__], module.__file__, "exec"), module.__dict__)

    sys.meta_path.append(Embedded())
    for name in sorted(sources):
        importlib.import_module(name)


def load_recipe(framework, target, args, module_name):
    """(file, step function, cannot_run, objective, what runs) for --recipe FRAMEWORK:TARGET."""
    load = _ADAPTERS.get(framework)
    if load is None:
        raise ValueError("--recipe %s:%s: unknown framework '%s' (known: %s)"
                         % (framework, target, framework, ", ".join(_ADAPTERS)))
    _require_greenlet(framework, target)
    return load(target, args, module_name, framework)


def _require_greenlet(framework, target):
    """Imports greenlet (what GreenletRun runs framework code in) before the user's files, and
    checks it is the package: a greenlet.py of the user's on the path made every row an
    ImportError read as the recipe's verdict. Once imported, no later folder shadows it."""
    try:
        import greenlet
    except ImportError as error:
        raise ImportError("--recipe %s:%s: gradnorm runs framework code in a greenlet, and "
                          "greenlet does not import here (%s); scripts/install-deps.sh installs "
                          "requirements.txt's pins" % (framework, target, error)) from None
    if not (hasattr(greenlet, "greenlet") and hasattr(greenlet, "getcurrent")):
        raise ImportError("--recipe %s:%s: 'greenlet' here is %s, not the greenlet package "
                          "gradnorm runs framework code in: a file of yours shadows it (rename it, "
                          "or take its folder off the path)"
                          % (framework, target, getattr(greenlet, "__file__", "a module")))


# --- a user's loop function ------------------------------------------------------------------


class UserLoop:
    """A loop a user wrote, named ``--recipe NAME:PATH.py:FUNCTION`` (Fabric, Accelerate and
    DeepSpeed loops): the file imported as a module of its own, FUNCTION found in it, and the
    ``--recipe-arg`` keys every loop takes (``log_name=NAME``: what the logged loss is read
    under). An adapter's subclass says how FUNCTION is called (CALL), what its framework is
    called in messages (WHO: "an Accelerate loop") and which --recipe-arg keys it takes beside
    log_name (``take(key, text, arg)``, True where it took it)."""

    CALL = "FUNCTION(...)"
    WHO = "a loop"
    FRAMEWORK = "the framework"
    LOG_NAME = "loss"

    def __init__(self, target, args, module_name, framework):
        path, _, name = target.rpartition(":")
        if not path.endswith(".py") or not name:
            raise ValueError("--recipe %s:%s: expected %s:PATH.py:FUNCTION (your loop, called as "
                             "%s)" % (framework, target, framework, self.CALL))
        self.file = os.path.abspath(path)
        if not os.path.isfile(self.file):
            raise FileNotFoundError("--recipe %s:%s: no such file %s" % (framework, target, path))
        module = _gt.import_file(self.file, module_name)
        found = getattr(module, name, None)
        if not callable(found) or isinstance(found, type):
            raise LookupError("--recipe %s:%s: %s defines no function named '%s'"
                              % (framework, target, path, name))
        self.function = found
        self.log_name = self.LOG_NAME
        for arg in args:
            key, sep, text = arg.partition("=")
            key, text = key.strip(), text.strip()
            if not sep or not key:
                raise ValueError("--recipe-arg %s: expected KEY=VALUE" % arg)
            if key == "log_name":
                self.log_name = text
            elif not self.take(key, text, arg):
                raise ValueError("--recipe-arg %s: %s takes %s" % (arg, self.WHO, self.TAKES))

    TAKES = "log_name=NAME only"

    def take(self, key, text, arg):
        return False

    def cannot_run(self, scenario):
        """Why the scenario cannot be judged on the loop, or None."""
        if scenario["model"] != "python":
            return ("%s trains a torch module: the scenario's model must come from a Python file "
                    "(--recipe substitutes examples/python/tiny_transformer.py for built-in "
                    "models)" % self.WHO)
        if scenario["tp"] > 1 or scenario["cp"] > 1 or scenario["dp_replicate"] > 1:
            return "gradnorm gives %s data parallelism only" % self.FRAMEWORK
        if scenario["optimizer_in_backward"]:
            return "%s steps its optimizer once per window" % self.WHO
        if scenario["loss"] != "mean_ce":
            return "the loss is the loop's own, not the scenario's %s" % scenario["loss"]
        if scenario["world_size"] > 1 and not _gt._process_is_initialized():
            return ("%s on W ranks needs a torch.distributed process group, which gradnorm's "
                    "ranks have only as processes: run it with --nproc W (rank processes over "
                    "Gloo), torchrun or Slurm" % self.FRAMEWORK)
        return None


def literal(text):
    """A --recipe-arg value as a Python value: true/false in any case, a Python literal
    (numbers, strings, lists, dicts, None), else the text itself."""
    import ast
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def rank_environment(run):
    """What frameworks read to find this rank's place (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT where unset: accelerate's state.py,
    deepspeed's comm), set before the framework builds its state. OMP_NUM_THREADS is set to
    the harness's thread count where unset: accelerate changes torch's otherwise."""
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    if run.dp_size == 1:
        return
    os.environ.update(RANK=str(run.dp_rank), WORLD_SIZE=str(run.dp_size),
                      LOCAL_RANK=str(run.dp_rank), LOCAL_WORLD_SIZE=str(run.dp_size))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


# --- samples and the feeding proof --------------------------------------------------------------


def aligned_sample(batch, row):
    """(tokens, labels) of sequence ROW of a micro-batch, labels aligned with the tokens as a
    dataset returns them to a model that shifts: [first label, shifted labels[:T-1]]."""
    shifted = batch["labels"][row]
    if int(shifted[-1]) != IGNORE_INDEX:
        raise RuntimeError("gradnorm bug: a shifted label at position T-1")
    aligned = torch.cat([batch["first_labels"][row:row + 1], shifted[:-1]])
    return batch["tokens"][row], aligned


def sample_place(run, k):
    """(step, micro-batch, row) of this rank's K-th sequence: a rank's sequences run step by
    step, micro-batch by micro-batch, sequence by sequence."""
    step, within = divmod(int(k), run.accumulation_steps * run.micro_batch_size)
    micro, row = divmod(within, run.micro_batch_size)
    return step, micro, row


def own_sample(run, index, handed):
    """This rank's sequence number of dataset INDEX, where sample g is rank g % W's sample
    g // W (torch's DistributedSampler order without shuffling); an index of another rank's is
    Unsupported, saying who handed it ("the recipe's sampler handed data-parallel rank")."""
    index = int(index)
    rank, k = index % run.dp_size, index // run.dp_size
    if rank != run.dp_rank:
        raise Unsupported(
            "%s %d the sample %d, which is rank %d's: gradnorm's dataset follows torch's "
            "DistributedSampler order (rank r gets r, r+W, ...) without shuffling"
            % (handed, run.dp_rank, index, rank))
    return k


class RankSamples(torch.utils.data.Dataset):
    """This rank's sequences as a dataset: step by step, micro-batch by micro-batch, sequence
    by sequence (sample_place), each a dict {"input_ids": [T], "labels": [T]} with labels
    aligned (aligned_sample), for a framework whose dataloader reads one rank's data in order."""

    def __init__(self, run):
        self._run = run

    def __len__(self):
        run = self._run
        return run.steps * run.accumulation_steps * run.micro_batch_size

    def __getitem__(self, index):
        run = self._run
        step, micro, row = sample_place(run, index)
        tokens, aligned = aligned_sample(run.ctx.batches_of(step)[micro], row)
        return {"input_ids": tokens.clone(), "labels": aligned}


def resumed(ctx, key, make):
    """The framework's run on this rank, kept in the step's state under KEY (made by MAKE at
    the first step) and advanced to ctx's step."""
    run = ctx.state.get(key)
    if run is None:
        run = ctx.state[key] = make()
    run.advance(ctx, ctx.step_index)
    return run


class FeedingProof:
    """Proof that a rank trained on its own micro-batches in order. ``collated(ids)`` records
    each batch the framework's dataloader collated, ``fed(ids)`` each batch that reached the
    model (a forward pre-hook); ``check(window)`` at each optimizer step: the batches collated
    since the last step begin with this step's window (one more may follow: a dataloader
    fetches a batch ahead), and what reached the model is the window's micro-batches in order
    (a user's code may skip one). Each step checks its own window once, so all steps together
    are checked in order."""

    def __init__(self, framework, movers):
        self._framework = framework  # "Trainer": whose dataloader
        self._movers = movers  # "its sampler or accelerate's sharding": what could move batches
        self._fed = []
        self._collated = []

    def collated(self, input_ids):
        self._collated.append(input_ids.detach().clone())

    def fed(self, input_ids):
        self._fed.append(input_ids.detach().clone())

    def check(self, window, rank, step):
        collated = self._collated[:len(window)]
        if len(collated) < len(window) or any(not torch.equal(c, w)
                                              for c, w in zip(collated, window)):
            raise RuntimeError(
                "rank %d step %d: %s's dataloader gave this rank batches other than the "
                "scenario's, in their order (%d collated, %d expected): %s moved them"
                % (rank, step, self._framework, len(self._collated), len(window), self._movers))
        del self._collated[:len(window)]
        fed, self._fed = self._fed, []
        at = 0
        for tokens in fed:
            while at < len(window) and not torch.equal(tokens, window[at]):
                at += 1
            if at == len(window):
                raise RuntimeError(
                    "rank %d step %d: the model was given input_ids that are not this window's "
                    "micro-batches in order (%d forwards, %d micro-batches)"
                    % (rank, step, len(fed), len(window)))
            at += 1


# --- the optimizer --------------------------------------------------------------------------------


class Optimizer(torch.optim.Optimizer):
    """A torch optimizer whose step() gives the framework's gradients to the harness's
    recording optimizer: the full gradient of each parameter (gathered where fully_shard
    made it a DTensor) becomes the harness parameter's .grad, the harness steps with the
    scenario's optimizer, and the updated values are copied back into the framework's model.
    Per-parameter optimizers (optimizer_in_bwd) each hand over their parameter's gradient;
    the harness steps once all of them have. A closure (Lightning passes one: the window's
    last forward and backward, and its clipping) runs first, and the gradients it leaves are
    what is handed over."""

    def __init__(self, params, lr=1e-3, **extra):
        params = list(params)
        super().__init__(params, dict(lr=lr, **extra))
        self._run = current_run()
        self._run.optimizers.append(self)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            if not self._run.takes_closure:
                raise TypeError("gradnorm's optimizer takes no closure")
            with torch.enable_grad():
                loss = closure()
        self._run.hand_over(self)
        return loss

    @property
    def params(self):
        return [p for group in self.param_groups for p in group["params"]]


def constant_lr(optimizer, num_training_steps=None, last_epoch=-1, **_ignored):
    """The framework's scheduler: a factor of 1 at every step (the scenario's rate holds)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: 1.0, last_epoch=last_epoch)


def recording_clip_norms(run):
    """A context in which torch.nn.utils.clip_grad_norm_ records the norm it returns, and
    clip_grads_with_norm_ the total norm it is given, in run.clip_norms[run.stepped + 1] (the
    window being stepped), changing nothing else: for
    frameworks that clip with it and discard the norm (Lightning's Precision.clip_grad_by_norm,
    Fabric's and Accelerate's clip_gradients/clip_grad_norm_ return it to a loop that may not
    log it), while what clipping returned is what the verdict judges. Runs are judged one at a
    time, and the wrapper is in place only while the run executes."""
    import contextlib

    utils = torch.nn.utils

    @contextlib.contextmanager
    def recording():
        real, real_with_norm = utils.clip_grad_norm_, utils.clip_grads_with_norm_

        def clip(*args, **kwargs):
            norm = real(*args, **kwargs)
            run.clip_norms[run.stepped + 1] = float(norm)
            return norm

        def clip_with_norm(parameters, max_norm, total_norm, *args, **kwargs):
            # Accelerate computes the total norm itself (get_total_norm) and clips with it.
            run.clip_norms[run.stepped + 1] = float(total_norm)
            return real_with_norm(parameters, max_norm, total_norm, *args, **kwargs)
        utils.clip_grad_norm_, utils.clip_grads_with_norm_ = clip, clip_with_norm
        try:
            yield
        finally:
            utils.clip_grad_norm_, utils.clip_grads_with_norm_ = real, real_with_norm
    return recording()


# --- one run of a framework on one rank ---------------------------------------------------------


class GreenletRun:
    """A framework's one training run on this rank (a torchtune recipe, a Transformers
    Trainer, Lightning's Trainer.fit), run inside a greenlet of the rank's own thread and
    resumed once per gradnorm step (advance); _main is the run itself and switches back to the
    harness between steps. The framework's optimizer is an Optimizer (above), which hands its
    gradients over here."""

    takes_closure = False  # whether the framework steps its optimizer with a closure
    framework = "the framework"  # its name in messages ("Trainer")

    def __init__(self, ctx):
        self.scenario = ctx.scenario
        self.ctx = ctx
        self.model_file = self.scenario["model_file"]
        self.model_function = model_function(self.model_file, self.scenario["model_function"])
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
        # Where the run proves what it trains on (a FeedingProof), each hand-over is checked
        # against the step's window and counted: one optimizer step per gradnorm step.
        self.feeding = getattr(self, "feeding", None)
        self.stepped = 0  # optimizer steps handed over
        self.clip_norms = {}  # optimizer step (from 1) -> the norm clipping computed, recorded
        from greenlet import greenlet
        self._greenlet = greenlet(self._main)

    def _main(self):
        raise NotImplementedError

    def quiet_warnings(self):
        """warnings.filterwarnings arguments for the framework's own warnings about its setup,
        which would interleave with gradnorm's table (what it does is what is judged)."""
        return ()

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
                for ignored in self.quiet_warnings():
                    warnings.filterwarnings("ignore", **ignored)
                self._greenlet.switch()
        finally:
            logging.disable(quiet)
            _local.run = previous
        if self._greenlet.dead:
            self.finished = True
            self._finished()

    def scenario_model(self):
        """A fresh instance of the scenario's Python-file model holding the harness's initial
        parameters (the framework trains its own copy; the harness's are stepped on hand-over
        and copied back)."""
        s = self.scenario
        model = _gt.build_model(self.model_function, self.model_file, self.model_file,
                                s["vocab_size"], s["hidden_size"], s["sequence_length"], s["seed"])
        with torch.no_grad():
            model.load_state_dict({n: t.detach().clone()
                                   for n, t in self.harness_model.state_dict().items()})
        return model

    # The optimizer's side.
    def _names(self):
        named = {}
        for name, p in self.recipe_model.named_parameters():
            named[id(p)] = (name, p)
        return named

    def collate(self, samples):
        """A dataloader's collate function: torch's default_collate, each batch recorded for
        the feeding proof."""
        batch = torch.utils.data.default_collate(samples)
        self.feeding.collated(batch["input_ids"])
        return batch

    def hand_back_at_forward(self, model):
        """Hands control back to gradnorm at MODEL's first forward after an optimizer step (the
        next step begins: gradnorm judges the one before, logged by then, by the loop's
        contract), calling before_hand_back() first; every forward's input_ids reach the
        feeding proof."""
        def begins(_module, args, kwargs):
            while self.stepped > self.step:
                self.before_hand_back()
                self._parent.switch()
            self.feeding.fed(kwargs.get("input_ids", args[0] if args else None))
        model.register_forward_pre_hook(begins, with_kwargs=True)

    def before_hand_back(self):
        """What the run reads of the step just taken before gradnorm judges it."""

    def count_step(self):
        """An optimizer step began: where the run proves what it trains on, the step's window
        is checked and the step counted (one per gradnorm step)."""
        if self.feeding is not None:
            self.feeding.check([b["tokens"] for b in self.ctx.micro_batches], self.dp_rank,
                               self.step)
            if self.stepped != self.step:
                raise RuntimeError("%s stepped its optimizer twice in gradnorm step %d"
                                   % (self.framework, self.step))
            self.stepped += 1
        if self.recipe_model is None:
            raise RuntimeError("the optimizer stepped before the model was built")

    def write(self, param, value):
        """Puts the harness's updated VALUE where the framework's next step reads PARAM."""
        write_parameter(param, value)

    def hand_over(self, optimizer):
        self.count_step()
        if len(self.optimizers) == 1:
            self._step_harness([p for p in optimizer.params if p.grad is not None])
            return
        # optimizer_in_bwd: one optimizer per parameter, each stepped from a hook in backward.
        for p in optimizer.params:
            if p.grad is not None:
                self.pending[id(p)] = (p, full_tensor(p.grad).detach().clone())
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
            grad = grads[id(p)] if grads is not None else full_tensor(p.grad)
            target.grad = grad.detach().to(target.dtype).clone()
            pairs.append((target, p))
        self.ctx.optimizer.step()
        with torch.no_grad():
            for target, p in pairs:
                self.write(p, target.detach())
        self.ctx.optimizer.zero_grad(set_to_none=True)


def full_tensor(tensor):
    from torch.distributed.tensor import DTensor
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def write_parameter(param, value):
    from torch.distributed.tensor import DTensor, distribute_tensor
    if isinstance(param, DTensor):
        local = distribute_tensor(value.to(param.dtype), param.device_mesh,
                                  param.placements).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(value.to(param.dtype))


def model_function(path, function):
    wanted = os.path.abspath(path)
    for module in list(sys.modules.values()):
        if os.path.abspath(getattr(module, "__file__", "") or "") == wanted and hasattr(module, function):
            return getattr(module, function)
    raise LookupError("the scenario's model file %s is not loaded" % path)


# --- what the framework logged -------------------------------------------------------------------


def logged_values(logged, step):
    """{"loss_to_log": ..., "grad_norm": ...} of what the run logged at STEP, where it did."""
    entry = logged.get(step, {})
    out = {}
    for key, name in (("loss", "loss_to_log"), ("grad_norm", "grad_norm")):
        value = entry.get(key)
        if value is not None:
            out[name] = float(value.detach().item()) if isinstance(value, torch.Tensor) else float(value)
    return out


def framework_step(name, key, make_run, rank_zero=True):
    """The step function of a framework's run: the run made at the scenario's first step (and
    resumed at the next, under KEY), then what it stepped and logged at this one (rank 0's log
    on every rank unless RANK_ZERO is false)."""
    def step(ctx):
        run = resumed(ctx, key, lambda: make_run(ctx))
        return stepped_values(run, ctx, rank_zero=rank_zero)
    step.__name__ = name
    return step


INSTALLS_REQUIREMENTS = "scripts/install-deps.sh installs requirements.txt's pins"


def release(distribution):
    """"NAME VERSION" of an installed distribution (what a report's variants name as judged)."""
    import importlib.metadata
    return "%s %s" % (distribution, importlib.metadata.version(distribution))


def origin(distribution):
    """Where an installed distribution comes from when it is not an index's release: ", editable
    from PATH" for an editable install of a checkout (a framework's pull request, pip install
    -e .), ", installed from PATH" for a folder; "" otherwise (PEP 610's direct_url.json)."""
    import importlib.metadata
    import json
    from urllib.parse import unquote, urlparse
    try:
        origin = json.loads(importlib.metadata.distribution(distribution).read_text("direct_url.json")
                            or "null")
    except (ValueError, importlib.metadata.PackageNotFoundError):
        return ""
    if not isinstance(origin, dict) or not isinstance(origin.get("dir_info"), dict):
        return ""
    path = unquote(urlparse(str(origin.get("url", ""))).path)
    return ", %s from %s" % ("editable" if origin["dir_info"].get("editable") else "installed", path)


def import_error(framework, target, error, where=INSTALLS_REQUIREMENTS, name=None):
    """The ImportError for --recipe FRAMEWORK:TARGET when the framework (NAME, by default
    FRAMEWORK) does not import: the first cause (a lazy import wraps what failed in a
    RuntimeError) and WHERE to get it."""
    while error.__cause__ is not None:
        error = error.__cause__
    error = "%s: %s" % (type(error).__name__, error)
    return ImportError("--recipe %s:%s: %s does not import here (%s); %s"
                       % (framework, target, name or framework, error, where))


def stepped_values(run, ctx, rank_zero=True):
    """What a step returns for a run that counts its optimizer steps: the values logged at
    this step (counted from 1) and the norm clipping computed, rank 0's on every rank where the
    framework's loggers write rank 0's (RANK_ZERO). A run that did not step is an error."""
    if run.stepped != ctx.step_index + 1:
        raise RuntimeError("%s did not step its optimizer in gradnorm step %d"
                           % (run.framework, ctx.step_index))
    logged = logged_values(run.logged, ctx.step_index + 1)
    if ctx.step_index + 1 in run.clip_norms:
        logged["grad_norm"] = run.clip_norms[ctx.step_index + 1]
    if rank_zero and ctx.world_size > 1:
        return from_rank_zero(logged)
    return logged


def from_rank_zero(logged):
    """What rank 0 logged, on every rank: a framework that logs on rank 0 only (or whose
    loggers write rank 0's values only) is judged by rank 0's log, sent from rank 0 after the
    step (one broadcast, outside the framework)."""
    import torch.distributed as dist
    keys = ("loss_to_log", "grad_norm")
    packed = torch.tensor([[1.0 if k in logged else 0.0, float(logged.get(k, 0.0))] for k in keys],
                          dtype=torch.float64)
    dist.broadcast(packed, src=0)
    return {k: float(packed[i, 1]) for i, k in enumerate(keys) if packed[i, 0] != 0}
