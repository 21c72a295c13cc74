"""The Python side of gradnorm (docs/design.md §10).

Two uses, one file:

* Embedded: gradnorm runs a user's ``def step(ctx)`` in its own interpreter. The context
  built here wraps the harness's own tensors: ``ctx.model``'s parameters *are* the tensors
  the harness snapshots, and ``ctx.optimizer.step()`` is the harness's recording optimizer,
  so the gradients judged are the ones the step produced, with no copy in between.
* In a pytest suite: ``load_vectors(path)`` reads what ``gradnorm export`` wrote (batches,
  initial parameters and the float64 oracle's answers) and ``assert_close_to_oracle``
  compares a step's own results with them under a stated tolerance.

torch.distributed inside a step: every rank (a thread or a process of the harness) gets a
default process group of its own whose all_reduce (SUM) and barrier are the harness's
collectives, so a step calls ``torch.distributed.all_reduce`` exactly as a recipe does and
reduces bit for bit as the harness's C++ steps do.
"""

import faulthandler
import functools
import importlib.util
import math
import numbers
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import distributed_c10d as _c10d

# --- torch.distributed: a default group per rank ------------------------------------------
# torch keeps one default group per process; the harness runs ranks as threads too, so the
# default group is looked up per thread (a process rank is one thread of its own).

_local = threading.local()
_process_default_group = _c10d._get_default_group
_c10d_is_initialized = _c10d.is_initialized
# fuzz --nproc: the fuzzing process asks each step's cannot_run about cases its rank processes
# will run, each with a process group; it has none of its own (plan_for_rank_processes).
_planning_for_rank_processes = False


def _process_is_initialized():
    return _planning_for_rank_processes or _c10d_is_initialized()


def plan_for_rank_processes():
    """From now on this process only plans runs for rank processes (fuzz --nproc): a step's
    cannot_run is answered as in a rank, which has a torch.distributed process group."""
    global _planning_for_rank_processes
    _planning_for_rank_processes = True

_process_init_process_group = _c10d.init_process_group


def _default_group():
    group = getattr(_local, "group", None)
    return group if group is not None else _process_default_group()


def _is_initialized():
    return getattr(_local, "group", None) is not None or _process_is_initialized()


_c10d._get_default_group = _default_group
_c10d.is_initialized = _is_initialized
dist.is_initialized = _is_initialized


class _Done(_c10d.Work):
    """A collective that has already completed (the harness's collectives block)."""

    def __init__(self, tensors):
        super().__init__()
        self._tensors = tensors

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def result(self):
        return self._tensors


class RankGroup(dist.ProcessGroup):
    """One rank's torch.distributed default group: all_reduce with ReduceOp.SUM and barrier,
    through the callables given (the harness's collectives, or a test's)."""

    def __init__(self, rank, world_size, all_reduce_sum, barrier):
        super().__init__(rank, world_size)
        self._all_reduce_sum = all_reduce_sum
        self._barrier = barrier

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if op != dist.ReduceOp.SUM:
            raise RuntimeError(
                "gradnorm's ranks implement all_reduce with ReduceOp.SUM only (what recipes use "
                "to total tokens and losses); this step asked for another op")
        self._all_reduce_sum(list(tensors))
        return _Done(tensors)

    def barrier(self, opts=None):
        self._barrier()
        return _Done([])

    def getBackendName(self):
        return "gloo"


class GradnormUnsupported(RuntimeError):
    """A torch.distributed feature gradnorm's ranks do not offer: the step cannot be judged
    as written (recorded under this name, never mistaken for a LibTorch error)."""


def _unsupported(op):
    def refuse(self, *args, **kwargs):
        raise GradnormUnsupported(
            "torch.distributed %s is not offered on gradnorm's ranks (all_reduce with "
            "ReduceOp.SUM and barrier are)" % op)
    return refuse


for _op in ("allgather", "_allgather_base", "allgather_coalesced", "broadcast", "reduce",
            "reduce_scatter", "_reduce_scatter_base", "allreduce_coalesced", "alltoall",
            "alltoall_base", "gather", "scatter", "send", "recv", "recv_anysource",
            "monitored_barrier"):
    setattr(RankGroup, _op, _unsupported(_op.strip("_")))


def _on_a_rank():
    return isinstance(getattr(_local, "group", None), RankGroup)


def _guard_function(module, name, replacement):
    original = getattr(module, name)

    @functools.wraps(original)  # keeps the function's attributes (fully_shard.state)
    def guarded(*args, **kwargs):
        if _on_a_rank():
            return replacement(*args, **kwargs)
        return original(*args, **kwargs)
    setattr(module, name, guarded)


def _refuse_function(name):
    def refuse(*args, **kwargs):
        raise GradnormUnsupported("torch.distributed.%s is not offered on gradnorm's ranks: the "
                                  "harness owns the process group" % name)
    return refuse


def _get_backend(group=None):
    return "gloo"


class _DefaultGroup:
    """``with _DefaultGroup(group):`` makes ``group`` this thread's default group."""

    def __init__(self, group):
        self._group = group
        self._before = None

    def __enter__(self):
        self._before = getattr(_local, "group", None)
        _local.group = self._group
        return self._group

    def __exit__(self, *exc):
        _local.group = self._before
        return False


# --- rank processes: the real process group ----------------------------------------------


def make_gloo_group(store, rank, size, timeout_ms, world):
    """This rank process's Gloo group over ``store`` (called by the harness, once per group):
    the world group is torch.distributed's default group, made by init_process_group as a
    recipe makes it, so a step's collectives, DistributedDataParallel and fully_shard run on
    it; a mesh's subgroup is a ProcessGroupGloo of its own. Returns the c10d Gloo backend the
    harness's C++ collectives use: the same object, so both sides share one sequence of
    collectives. Gloo's device follows GLOO_SOCKET_IFNAME, as torch.distributed's does."""
    import datetime
    timeout = datetime.timedelta(milliseconds=timeout_ms)
    if not world:
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    _process_init_process_group(backend="gloo", store=store, rank=rank, world_size=size,
                                timeout=timeout)
    return _process_default_group()._get_backend(torch.device("cpu"))


# --- what a step sees -------------------------------------------------------------------


class Refusal(Exception):
    """Raise ``ctx.Refusal("...")`` where the recipe rejects its configuration on purpose
    (torchtune raises there too): recorded as a refusal, which matches a reference that
    refuses the same scenario."""


class HarnessModel(torch.nn.Module):
    """A ``torch.nn.Module`` whose parameters are the tensors given (not copies): the
    harness's own parameters, named as the harness names them (``head.weight``)."""

    def __init__(self, named_parameters, forward):
        super().__init__()
        for name, tensor in named_parameters:
            owner = self
            *path, leaf = name.split(".")
            for part in path:
                if part not in owner._modules:
                    owner._modules[part] = torch.nn.Module()
                owner = owner._modules[part]
            # Assigned directly: nn.Parameter(tensor) would make a new leaf, and the
            # gradients would land on it instead of on the harness's tensor.
            owner._parameters[leaf] = tensor
        self._logits = forward

    def forward(self, tokens):
        """Logits [B, T, V] for token ids (or, for the linear_head model, features) [B, T]."""
        return self._logits(tokens)


class HarnessOptimizer:
    """The optimizer the scenario names, built by the harness. ``step()`` consumes the
    ``.grad`` of every trainable parameter and the harness records what it consumed.

    After ``fully_shard(ctx.model)`` (rank processes, a model from a Python file) the
    module's parameters are DTensor shards that replaced the harness's tensors: ``step()``
    then gathers each full gradient into the harness's tensor (DTensor.full_tensor, an
    all-gather every rank makes in the same order), steps the harness's optimizer on the
    full tensors, and writes each updated value back into the rank's shard."""

    def __init__(self, step, zero_grad, named_params, facts, module):
        self._step = step
        self._zero_grad = zero_grad
        self._named = list(named_params)
        self._module = module
        self.param_groups = [dict(facts, params=[tensor for _, tensor in self._named])]

    def _sharded(self):
        """(harness tensor, the module's DTensor parameter) for each parameter fully_shard
        replaced; empty when the module's parameters are still the harness's."""
        current = dict(self._module.named_parameters())
        pairs = []
        for name, tensor in self._named:
            now = current.get(name)
            if now is None or now is tensor:
                continue
            from torch.distributed.tensor import DTensor
            if not isinstance(now, DTensor):
                raise GradnormUnsupported(
                    "parameter %s of ctx.model was replaced by a %s: gradnorm follows "
                    "parameters that fully_shard turns into DTensors, no other replacement"
                    % (name, type(now).__name__))
            pairs.append((tensor, now))
        return pairs

    def step(self, closure=None):
        if closure is not None:
            raise TypeError("gradnorm's optimizer takes no closure: run forward and backward "
                            "in the step, then call optimizer.step()")
        sharded = self._sharded()
        for tensor, shard in sharded:
            tensor.grad = None if shard.grad is None else shard.grad.full_tensor()
        self._step()
        if sharded:
            from torch.distributed.tensor import distribute_tensor
            with torch.no_grad():
                for tensor, shard in sharded:
                    local = distribute_tensor(tensor.detach(), shard.device_mesh,
                                              shard.placements).to_local()
                    shard.to_local().copy_(local)

    def zero_grad(self, set_to_none=True):
        for _, shard in self._sharded():
            if set_to_none:
                shard.grad = None
            elif shard.grad is not None:
                shard.grad.zero_()
        self._zero_grad(bool(set_to_none))


class StepContext:
    """What ``step(ctx)`` gets; see docs/steps.md."""

    Refusal = Refusal

    def __init__(self, *, model, micro_batches, loss_fn, optimizer, max_norm, rank,
                 world_size, step_index, scenario, state, average_gradients, teacher=None,
                 batches_of=None):
        self.model = model
        # A distilling variant's frozen teacher (a recipe with a teacher model), else None.
        self.teacher = teacher
        self.micro_batches = micro_batches
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.max_norm = max_norm
        self.rank = rank
        self.world_size = world_size
        self.step_index = step_index
        self.scenario = scenario
        self.state = state
        self._average_gradients = average_gradients
        self._batches_of = batches_of

    def batches_of(self, step):
        """This rank's micro-batches at step STEP of the run (as micro_batches are at that
        step), for framework code that reads ahead of the step it is in."""
        if self._batches_of is None:
            raise RuntimeError("this step context holds its own step's micro-batches only")
        return self._batches_of(step)

    def average_gradients(self):
        """Averages every trainable gradient over this rank's data-parallel (FSDP) group, as
        FSDP's reduce-scatter does inside a real recipe's backward. Call it once, after the
        window's backward passes; on one rank it does nothing."""
        self._average_gradients()


_RESULT_KEYS = ("loss_to_log", "grad_norm")


def _number(result, key):
    value = result.get(key)
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError("the step returned %s as a tensor of %d elements; it must be one "
                            "number" % (key, value.numel()))
        return float(value.detach().item())
    # numbers.Real takes NumPy's scalars too (numpy registers its floating and integer
    # types there), and a one-element NumPy array reads as its element.
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if type(value).__module__ == "numpy" and getattr(value, "size", None) == 1 \
            and hasattr(value, "item") and isinstance(value.item(), numbers.Real):
        return float(value.item())
    raise TypeError("the step returned %s of type %s; it must be a number or a one-element "
                    "tensor" % (key, type(value).__name__))


def read_result(result):
    """(loss_to_log, grad_norm) from what the step returned: a dict, or None."""
    if result is None:
        return None, None
    if not isinstance(result, dict):
        raise TypeError("the step must return a dict with 'loss_to_log' (and 'grad_norm' when "
                        "it clipped), or None; it returned %s" % type(result).__name__)
    unknown = sorted(set(result) - set(_RESULT_KEYS))
    if unknown:
        raise TypeError("the step returned unknown keys %s; known: %s"
                        % (", ".join(map(str, unknown)), ", ".join(_RESULT_KEYS)))
    return _number(result, "loss_to_log"), _number(result, "grad_norm")


# --- the embedded runtime (called from C++) ---------------------------------------------


class TorchError(RuntimeError):
    """LibTorch raised inside a harness call (the model's forward, the loss, the optimizer):
    recorded as the c10::Error a C++ step would see."""


class HarnessInterrupt(BaseException):
    """Raised into the step when a harness call failed (another rank's step raised, a
    collective timed out): the harness carries its own error; a step must not catch it."""


_step_folders = {}  # folder -> the step file that brought it onto sys.path


def _module_file(module):
    return os.path.abspath(getattr(module, "__file__", "") or "")


def _check_imports(folder, path):
    """Refuses a step whose folder provides a module an earlier step's folder also provides:
    one process imports a top-level name once, so one of them would run the other's code."""
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        loaded = _module_file(module)
        owner = os.path.dirname(loaded)
        if owner == folder or owner not in _step_folders:
            continue
        mine = [os.path.join(folder, name + ".py"), os.path.join(folder, name, "__init__.py")]
        clash = next((m for m in mine if os.path.exists(m)), None)
        if clash is not None:
            raise ImportError(
                "%s and %s (brought by %s) both provide module '%s'; one gradnorm process "
                "imports a module name once, so one step would run the other's code: rename "
                "one" % (clash, loaded, _step_folders[owner], name))


def import_file(path, module_name):
    """Imports the file at ``path`` as the module ``module_name`` (in sys.modules)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError("cannot load %s as a Python module" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def load_step(path, function, module_name):
    """Imports the user's file as its own module and returns its step function."""
    folder = os.path.dirname(os.path.abspath(path))
    _check_imports(folder, path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    _step_folders.setdefault(folder, path)
    try:
        module = import_file(path, module_name)
    finally:
        leave_forked_child(0)
    _check_imports(folder, path)
    step = getattr(module, function, None)
    if step is None:
        raise LookupError("%s defines no function '%s'" % (path, function))
    if not callable(step):
        raise LookupError("%s: '%s' is not callable" % (path, function))
    return step


def where_raised(error, path):
    """'FILE:LINE' of the innermost frame in the user's file (as the user named it), or of
    the innermost frame at all; for a SyntaxError, its own location."""
    if isinstance(error, SyntaxError) and error.filename:
        shown = path if os.path.abspath(error.filename) == os.path.abspath(path) else error.filename
        return "%s:%s" % (shown, error.lineno)
    mine = os.path.abspath(path)
    found = None
    innermost = None
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        innermost = (code.co_filename, tb.tb_lineno)
        if os.path.abspath(code.co_filename) == mine:
            found = (path, tb.tb_lineno)
        tb = tb.tb_next
    place = found or innermost
    return "%s:%s" % place if place else path


def safe_text(text):
    """`text` as valid UTF-8 (lone surrogates escaped)."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def _message_of(error):
    if isinstance(error, SyntaxError):
        return safe_text(error.msg)
    try:
        text = str(error)
    except BaseException:  # an exception whose __str__ raises
        try:
            text = repr(error)
        except BaseException:
            text = "<unprintable %s>" % type(error).__name__
    lines = text.splitlines()
    return safe_text(lines[0] if lines else "")


def describe(error, path, function=None):
    """(type name, 'message (at FILE:LINE)') for an exception a step raised. Where the
    traceback never reaches the user's file (an error in what the step returned), the
    step's own definition is cited."""
    place = where_raised(error, path)
    if function is not None and not place.startswith(str(path) + ":"):
        code = getattr(function, "__code__", None)
        if code is not None and not os.path.dirname(code.co_filename):
            # A recipe's step is gradnorm's own, compiled in under its module's bare name: the
            # module is cited, not a line of it, so that a report does not change when an
            # adapter is edited around the step.
            place = "the step defined in %s" % code.co_filename
        elif code is not None:
            place = "the step defined at %s:%d" % (code.co_filename, code.co_firstlineno)
    return safe_text(type(error).__name__), "%s (at %s)" % (_message_of(error), safe_text(place))


def classify(error):
    """'refusal', 'torch' (an error LibTorch raised) or 'step'."""
    if isinstance(error, Refusal):
        return "refusal"
    if isinstance(error, TorchError):
        return "torch"
    if type(error) is RuntimeError and raised_inside_torch(error):
        return "torch"
    return "step"


class _Rank:
    """One rank of one run: the handle the harness gives, with the model, the optimizer and
    the default process group built around it once."""

    def __init__(self, handle):
        self.handle = handle
        named = handle.parameters()
        # A model from a Python file is the user's own module (its parameters are the
        # harness's); the built-in and TorchScript models are wrapped.
        self.model = handle.python_model()
        if self.model is None:
            self.model = HarnessModel([(name, tensor) for name, tensor, _ in named],
                                      handle.logits)
            for _, tensor, _ in named:
                tensor._gradnorm_forward_in_cpp = True  # fully_shard refuses these
        self.optimizer = HarnessOptimizer(
            handle.optimizer_step, handle.zero_grad,
            [(name, tensor) for name, tensor, trainable in named if trainable],
            handle.optimizer_facts(), self.model)
        # A rank process over Gloo has the real default group (make_gloo_group); ranks as
        # threads, and raw NCCL, get the harness's collectives as a group of their own.
        self.group = None if _process_is_initialized() else RankGroup(
            handle.rank, handle.world_size, handle.all_reduce_sum, handle.barrier)
        self.state = {}
        self.teacher = handle.teacher_model()


def bind(handle):
    return _Rank(handle)


def _refuse_wrapper_on_shim_ranks(cls, name):
    original = cls.__init__

    def init(self, *args, **kwargs):
        if _on_a_rank():
            raise GradnormUnsupported(
                "%s needs a real process group, which gradnorm's ranks have only as processes "
                "(--nproc W, torchrun, Slurm; Gloo): ranks as threads share one process, whose "
                "torch.distributed has no group per thread. Here call ctx.average_gradients() "
                "after the backward passes, which averages the gradients as DDP and FSDP do"
                % name)
        original(self, *args, **kwargs)
    cls.__init__ = init


_HARNESS_PID = os.getpid()
_real_exit = os._exit


def in_forked_child():
    """True in a process a step forked (a DataLoader's worker, an os.fork()): the harness's
    threads and state did not come with it, so it must never return into the harness."""
    return os.getpid() != _HARNESS_PID


def become_harness(environment):
    """This process is a harness of its own: a warm rank process the harness forked
    (docs/ranks.md), not a child a step forked. Its environment is ENVIRONMENT: os.environ
    (which CPython copies once, at start-up) and the C environment both, as an exec'd rank's
    would be."""
    global _HARNESS_PID, _planning_for_rank_processes
    _HARNESS_PID = os.getpid()
    _planning_for_rank_processes = False  # a rank's own process group is real
    os.environ.clear()
    os.environ.update(environment)


def leave_forked_child(status):
    """Ends a forked child that reached the harness's code again (a step returned or raised
    in it): the parent's harness goes on; the child goes at once, with no cleanup of the
    state it copied (the parent's threads and locks, which it does not own)."""
    if in_forked_child():
        sys.stdout.flush()
        sys.stderr.flush()
        _real_exit(status)


def _no_exit(status=0):
    if in_forked_child():  # a forked worker (multiprocessing ends its children so) ends alone
        _real_exit(status)
    raise GradnormUnsupported("os._exit(%r) inside a gradnorm step: the harness would vanish "
                              "with no report; raise an exception instead" % (status,))


class _HeldStream:
    """sys.stdout or sys.stderr inside gradnorm: what the code under test writes is held for
    the row whose rank wrote it, or for the run's log (harness/output_capture.hpp), unless
    gradnorm prints it as it comes (--verbose) or nothing is being judged. The rest (fileno,
    isatty, encoding) is the stream's own."""

    def __init__(self, stream):
        import _gradnorm_native
        self._stream = stream
        self._hold = _gradnorm_native.hold_output

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        # A child a step forked holds nothing: its copy of the harness reports nothing.
        if in_forked_child() or not self._hold(text.encode("utf-8", "replace")):
            return self._stream.write(text)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def embed():
    """Guards that hold inside gradnorm only (never in a pytest suite importing this file):
    no os._exit; on ranks as threads (and raw NCCL's shim), no DDP/FSDP wrapper and no
    process-group management; on rank processes the harness owns the default group, so a
    step may not create or destroy it (new_group and every collective are torch's own)."""
    global _HARNESS_PID
    _HARNESS_PID = os.getpid()
    # User code that kills the process (a segfault in an extension, os.abort()) ended it with
    # an empty stderr: Python's own fault handler names the file and line of the thread that
    # crashed (a rank process's supervisor quotes them from the rank's log).
    faulthandler.enable(file=sys.__stderr__, all_threads=False)
    sys.stdout = _HeldStream(sys.stdout)
    sys.stderr = _HeldStream(sys.stderr)
    os._exit = _no_exit
    os.fork = _fork_unless_ranks_are_threads(os.fork)
    for name in ("alarm", "setitimer"):
        setattr(signal, "_gradnorm_original_" + name, getattr(signal, name))
        setattr(signal, name, _refuse_timer(name))
    _keep_interrupts(signal)
    _refuse_wrapper_on_shim_ranks(torch.nn.parallel.DistributedDataParallel,
                                  "DistributedDataParallel")
    from torch.distributed.fsdp import FullyShardedDataParallel
    _refuse_wrapper_on_shim_ranks(FullyShardedDataParallel, "FullyShardedDataParallel")
    import torch.distributed.fsdp as _fsdp
    if hasattr(_fsdp, "fully_shard"):
        _guard_function(_fsdp, "fully_shard", _refuse_function_on_threads("fully_shard"))
        _refuse_fully_shard_of_built_in_models(_fsdp)
    _guard_function(_c10d, "get_backend", _get_backend)
    _guard_function(dist, "get_backend", _get_backend)
    for name in ("new_group", "monitored_barrier"):
        _guard_function(_c10d, name, _refuse_function(name))
        _guard_function(dist, name, _refuse_function(name))
    for name in ("destroy_process_group", "init_process_group"):
        setattr(_c10d, name, _refuse_function(name))
        setattr(dist, name, _refuse_function(name))


def _fork_unless_ranks_are_threads(real_fork):
    """A fork copies only the calling thread. Ranks as threads of one process (a multi-rank
    scenario under --launcher threads) would leave the child holding the other ranks' locks
    and rooms with no thread to release them: refused there (multiprocessing, a DataLoader's
    workers and os.fork all come through here). One device and rank processes fork freely."""
    @functools.wraps(real_fork)
    def fork():
        import _gradnorm_native
        ranks = _gradnorm_native.ranks_running_as_threads()
        if ranks > 1 and not in_forked_child():
            raise GradnormUnsupported(
                "os.fork inside a gradnorm step whose %d ranks are threads of one process (a "
                "DataLoader's workers, multiprocessing): the child would hold the other ranks' "
                "locks with no thread to release them. Fork on one device, give the ranks "
                "their own processes (--nproc W), or use num_workers=0" % ranks)
        return real_fork()
    return fork


def _refuse_timer(name):
    def refuse(*args, **kwargs):
        if in_forked_child():
            return getattr(signal, "_gradnorm_original_" + name)(*args, **kwargs)
        raise GradnormUnsupported(
            "signal.%s inside a gradnorm step: the timer's signal would end the whole harness "
            "with no report (its default action) or run a handler on another rank's thread; "
            "gradnorm's --timeout bounds a step's time" % name)
    return refuse


# The signals that end a run (SIGINT, SIGTERM, SIGHUP: 130, 143, 129 and no report) belong to
# the harness. What code under test installs for them is kept, and reported back by
# signal.getsignal, but never reaches the process: a recipe that ignored SIGTERM at import made
# the run immune to it.
_ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_kept_handlers = {}


def _keep_interrupts(module):
    real_signal, real_getsignal = module.signal, module.getsignal

    @functools.wraps(real_signal)
    def signal_(signalnum, handler):
        if signalnum not in _ENDING_SIGNALS or in_forked_child():
            return real_signal(signalnum, handler)
        if (not (callable(handler) or handler in (module.SIG_DFL, module.SIG_IGN))
                or threading.current_thread() is not threading.main_thread()):
            return real_signal(signalnum, handler)  # the error the caller would get
        previous = _kept_handlers.get(signalnum, module.SIG_DFL)
        _kept_handlers[signalnum] = handler
        return previous

    @functools.wraps(real_getsignal)
    def getsignal(signalnum):
        if signalnum not in _ENDING_SIGNALS or in_forked_child():
            return real_getsignal(signalnum)
        return _kept_handlers.get(signalnum, module.SIG_DFL)

    module.signal, module.getsignal = signal_, getsignal


def _refuse_fully_shard_of_built_in_models(fsdp):
    """fully_shard replaces a module's parameters by DTensor shards and gathers them around
    the module's own forward. A built-in or TorchScript model's forward runs in C++ on the
    harness's tensors (HarnessModel), which would never see them: refused by name."""
    guarded = fsdp.fully_shard

    @functools.wraps(guarded)
    def fully_shard(module, *args, **kwargs):
        for m in (module if isinstance(module, (list, tuple)) else [module]):
            if any(getattr(p, "_gradnorm_forward_in_cpp", False) for p in m.parameters()):
                raise GradnormUnsupported(
                    "fully_shard needs a model whose forward is its own Python: name one with "
                    "model = \"python:FILE.py:FUNCTION\" in the scenario; a built-in or "
                    "TorchScript model's forward runs in C++ on gradnorm's own tensors, which "
                    "would never see the shards (DistributedDataParallel works on it)")
        return guarded(module, *args, **kwargs)
    fsdp.fully_shard = fully_shard


def _refuse_function_on_threads(name):
    def refuse(*args, **kwargs):
        raise GradnormUnsupported(
            "%s needs a real process group, which gradnorm's ranks have only as processes "
            "(--nproc W, torchrun, Slurm; Gloo)" % name)
    return refuse


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def raised_inside_torch(error):
    """True when the innermost frame is torch's own Python code (e.g. autograd's backward
    raising what LibTorch raised): the error a C++ step would see as a c10::Error."""
    tb = error.__traceback__
    innermost = None
    while tb is not None:
        innermost = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return innermost is not None and os.path.abspath(innermost).startswith(_TORCH_DIR)


def run_step(step, rank):
    """One optimizer step of a user's step on one rank; returns (loss_to_log, grad_norm)."""
    handle = rank.handle
    context = StepContext(
        model=rank.model,
        micro_batches=[{"tokens": tokens, "labels": labels, "first_labels": first}
                       for tokens, labels, first in handle.micro_batches()],
        loss_fn=handle.loss,
        optimizer=rank.optimizer,
        max_norm=handle.max_norm,
        rank=handle.rank,
        world_size=handle.world_size,
        step_index=handle.step_index(),
        scenario=handle.scenario(),
        state=rank.state,
        average_gradients=handle.average_gradients,
        teacher=rank.teacher,
        batches_of=lambda step: [{"tokens": tokens, "labels": labels, "first_labels": first}
                                 for tokens, labels, first in handle.micro_batches_of_step(step)],
    )
    saved = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads(),
             torch.are_deterministic_algorithms_enabled())
    # A step drawing random numbers draws the same ones on every run of this rank and step.
    torch.manual_seed((int(context.scenario["seed"]) * 1000003 + handle.rank * 1009
                       + context.step_index) % (2 ** 63))
    try:
        if rank.group is None:
            result = read_result(step(context))
        else:
            with _DefaultGroup(rank.group):
                result = read_result(step(context))
    except BaseException:
        leave_forked_child(1)
        raise
    finally:
        # What a step changes of torch's global state must not leak into the next run
        # (set_default_dtype is common in recipes).
        torch.set_default_dtype(saved[0])
        torch.set_grad_enabled(saved[1])
        torch.set_num_threads(saved[2])
        torch.use_deterministic_algorithms(saved[3])
    leave_forked_child(0)
    return result


# --- models from Python files: model = "python:FILE.py:FUNCTION" ------------------------


def build_model(function, path, name, vocab_size, hidden_size, sequence_length, seed):
    """The torch.nn.Module ``function`` returns for the scenario's sizes, its random draws
    made from the scenario's seed (torch's global generator is forked, then restored), so
    every rank and process builds the same initial parameters. What the function changes of
    torch's global state (the default dtype, grad mode) is put back."""
    saved = (torch.get_default_dtype(), torch.is_grad_enabled())
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            module = function(vocab_size=int(vocab_size), hidden_size=int(hidden_size),
                              sequence_length=int(sequence_length))
    finally:
        leave_forked_child(0)
        torch.set_default_dtype(saved[0])
        torch.set_grad_enabled(saved[1])
    if not isinstance(module, torch.nn.Module):
        raise TypeError("%s returned %s, not a torch.nn.Module"
                        % (name, type(module).__name__))
    if isinstance(module, torch.jit.ScriptModule):
        # Its forward is TorchScript, which deep copies and dtype conversions handle apart
        # from the module's Python (error rows on every scenario).
        raise TypeError("%s returned a TorchScript module (torch.jit.script or trace): save it "
                        "with torch.jit.save and name it with model = \"torchscript:FILE.pt\", "
                        "or return the module unscripted" % name)
    return module


def parameter_elements(module):
    """The elements of the module's parameters (shared ones once) and buffers: what the memory
    budget's estimate scales with."""
    return float(sum(p.numel() for p in module.parameters())
                 + sum(b.numel() for b in module.buffers()))


def sparse_gradient_modules(module):
    """The submodules whose weight gets a sparse gradient (Embedding or EmbeddingBag built
    with sparse=True), as "NAME (TYPE)"."""
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return ["%s (%s)" % (name or "the model", type(m).__name__)
            for name, m in module.named_modules() if isinstance(m, kinds) and m.sparse]


def model_copy(module, dtype):
    """A deep copy of ``module`` with its floating parameters and buffers in ``dtype``
    ('float64', 'float32', 'bfloat16'): each rank's model, and the oracle's float64 twin."""
    import copy
    twin = copy.deepcopy(module)
    with torch.no_grad():
        twin.to(getattr(torch, dtype))
    return twin


def model_logits(module, tokens, dtype, scenario_dtype):
    """``module(tokens)``: a tensor of logits [B, T, V], or an output with a ``logits``
    tensor (as Hugging Face's models return). Their dtype is the parameters' (``dtype``), or
    float32 (models that cast their output up, as torchtune's TransformerDecoder does), except
    in a float64 scenario: there the oracle's twin must give float64 logits. (In a float32 or
    bfloat16 scenario the twin's logits rounded to float32 are off by at most 6e-8 relative,
    170 times under float32's 1e-5 gradient tolerance.)"""
    try:
        out = module(tokens)
    finally:
        leave_forked_child(0)
    logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise TypeError("forward returned %s, not a tensor of logits (nor an output with a "
                        "'logits' tensor)" % type(out).__name__)
    want = getattr(torch, dtype)
    upcast = logits.dtype == torch.float32 and scenario_dtype != "float64"
    if logits.dtype != want and not upcast:
        raise TypeError("forward returned %s logits for %s parameters; expected %s%s"
                        % (str(logits.dtype).replace("torch.", ""), dtype, dtype,
                           "" if scenario_dtype == "float64" or dtype == "float32"
                           else " or float32"))
    return logits


# --- oracle vectors: a step checked from a pytest suite ---------------------------------
# `gradnorm export SCENARIO... --out DIR` writes one file per scenario; this part loads it,
# runs a step the way gradnorm would (a model and loss written here in Python, every rank
# as a thread) and compares what the step produced with the float64 oracle.

_FORMAT = "gradnorm oracle vectors"
_VERSION = 1


class Disagreement(AssertionError):
    """A step disagrees with the oracle: one line per check that failed."""


def load_vectors(path):
    """The oracle vectors in `path` (written by `gradnorm export`).

    Loaded with torch.load's weights_only unpickler (the default since torch 2.6): the file
    holds only tensors, numbers, strings, lists and dicts; the one global it names is the
    type tag LibTorch's pickler writes for typed lists and dicts, allowed here by name."""
    from torch.jit._pickle import restore_type_tag
    with torch.serialization.safe_globals([restore_type_tag]):
        data = torch.load(path, weights_only=True)
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ValueError("%s: not a gradnorm oracle vectors file" % path)
    if data.get("version") != _VERSION:
        raise ValueError("%s: oracle vectors version %s; this helper reads version %d"
                         % (path, data.get("version"), _VERSION))
    return OracleVectors(data, str(path))


def _upcast(logits):
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _rel_l2(got, want):
    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    if not bool(torch.isfinite(got).all()):
        return math.inf
    scale = float(want.norm())
    error = float((got - want).norm())
    return error / scale if scale > 0 else error


def _rel(got, want):
    if got is None or not math.isfinite(got):
        return math.inf
    return abs(got - want) / abs(want) if want != 0 else abs(got)


class _Room:
    """Ranks as threads of one process: sums in rank order, as gradnorm's threads do."""

    def __init__(self, world_size, timeout):
        self._world = world_size
        self._timeout = timeout
        self._barrier = threading.Barrier(world_size)
        self._slots = [None] * world_size

    def all_reduce_sum(self, rank, tensors):
        self._slots[rank] = [t.detach().clone() for t in tensors]
        self._barrier.wait(self._timeout)
        for i, tensor in enumerate(tensors):
            total = self._slots[0][i].clone()
            for other in range(1, self._world):
                total += self._slots[other][i]
            with torch.no_grad():
                tensor.copy_(total)
        self._barrier.wait(self._timeout)

    def barrier(self):
        self._barrier.wait(self._timeout)

    def abort(self):
        self._barrier.abort()


class OracleVectors:
    """One exported scenario: its batches, initial parameters and the oracle's answers."""

    def __init__(self, data, path):
        self.path = path
        self.scenario = data["scenario"]
        self.initial_parameters = data["initial_parameters"]
        self.trainable = list(data["trainable"])
        self.batches = data["batches"]
        self.tolerance = data["tolerance"]
        self.oracle = data["oracle"]
        self.name = self.scenario["name"]

    # -- the scenario's model and loss, in Python -------------------------------------------

    def model(self):
        """A fresh copy of the scenario's model at its initial parameters."""
        kind = self.scenario["model"]
        if kind not in ("causal_lm", "linear_head", "token_probe", "lora"):
            raise NotImplementedError(
                "%s: the helper has no Python model for '%s'; run your own model and compare "
                "with compare()" % (self.name, kind))
        params = []
        for name, value in self.initial_parameters.items():
            tensor = value.detach().clone()
            tensor.requires_grad_(name in self.trainable)
            params.append((name, tensor))
        values = dict(params)

        def linear(x, layer):
            out = F.linear(x, values[layer + ".weight"], values.get(layer + ".bias"))
            if layer + ".lora_a" in values:
                out = out + F.linear(F.linear(x, values[layer + ".lora_a"]),
                                     values[layer + ".lora_b"]) * 2.0
            return out

        def forward(tokens):
            if kind == "token_probe":
                table = values["probe.weight"]
                return table.index_select(0, tokens.reshape(-1)).view(tokens.size(0), tokens.size(1), -1)
            if kind == "linear_head":
                return linear(tokens, "head")
            embedded = values["embedding.weight"].index_select(0, tokens.reshape(-1))
            embedded = embedded.view(tokens.size(0), tokens.size(1), -1)
            length = tokens.size(1)
            counts = torch.arange(1, length + 1, dtype=embedded.dtype).view(1, length, 1)
            hidden = torch.tanh(linear(embedded.cumsum(1) / counts, "hidden"))
            return linear(hidden, "head")

        return HarnessModel(params, forward)

    def loss_fn(self, logits, labels):
        """The scenario's loss on one micro-batch: a token mean, formed as its module forms it."""
        vocab = logits.size(-1)
        kind = self.scenario["loss"]
        if kind == "mean_ce":
            return F.cross_entropy(_upcast(logits).reshape(-1, vocab), labels.reshape(-1),
                                   ignore_index=-100)
        if kind == "chunked_ce":
            valid = (labels != -100).sum()
            total = None
            chunks = self.scenario["loss_chunks"]
            for piece_logits, piece_labels in zip(logits.chunk(chunks, dim=1), labels.chunk(chunks, dim=1)):
                piece = F.cross_entropy(_upcast(piece_logits).reshape(-1, vocab),
                                        piece_labels.reshape(-1), ignore_index=-100, reduction="sum")
                total = piece if total is None else total + piece
            return total / valid
        if kind == "linear_ce":
            mask = labels.reshape(-1) != -100
            valid = int(mask.sum())
            if valid == 0:
                return torch.zeros((), dtype=_upcast(logits).dtype)
            rows = _upcast(logits).reshape(-1, vocab)[mask]
            return F.cross_entropy(rows, labels.reshape(-1)[mask], ignore_index=-100,
                                   reduction="sum") / float(valid)
        raise NotImplementedError("%s: no Python loss for '%s'" % (self.name, kind))

    def check_model(self):
        """Raises Disagreement unless this helper's model and loss reproduce, on every
        micro-batch, the logits and loss gradnorm's own model gave (so a later disagreement
        is the step's, not the helper's)."""
        model = self.model()
        problems = []
        with torch.no_grad():
            for step, ranks in enumerate(self.batches):
                for rank, micros in enumerate(ranks):
                    for micro, batch in enumerate(micros):
                        logits = model(batch["tokens"])
                        error = _rel_l2(logits, batch["logits"])
                        if error > self.tolerance["tensor_rel_l2"]:
                            problems.append("step %d rank %d micro-batch %d: logits rel L2 %.3g"
                                            % (step, rank, micro, error))
                        loss = self.loss_fn(logits, batch["labels"])
                        want = float(batch["loss"])
                        if not (math.isnan(want) and math.isnan(float(loss))) and \
                                _rel(float(loss), want) > self.tolerance["scalar_rel"]:
                            problems.append("step %d rank %d micro-batch %d: loss %r, gradnorm %r"
                                            % (step, rank, micro, float(loss), want))
        if problems:
            raise Disagreement("%s: the helper's model or loss is not gradnorm's:\n  %s"
                               % (self.name, "\n  ".join(problems)))

    # -- running a step ---------------------------------------------------------------------

    def _optimizer(self, params):
        s = self.scenario
        if s["optimizer"] == "sgd":
            return torch.optim.SGD(params, lr=s["learning_rate"], weight_decay=s["weight_decay"])
        if s["optimizer"] == "sgd_momentum":
            return torch.optim.SGD(params, lr=s["learning_rate"], momentum=s["momentum"],
                                   weight_decay=s["weight_decay"])
        if s["optimizer"] == "adamw":
            return torch.optim.AdamW(params, lr=s["learning_rate"], weight_decay=s["weight_decay"])
        raise NotImplementedError("%s: no optimizer '%s'" % (self.name, s["optimizer"]))

    def _run_rank(self, step, rank, room, out):
        s = self.scenario
        model = self.model()
        named = [(n, p) for n, p in model.named_parameters() if n in self.trainable]
        inner = self._optimizer([p for _, p in named])
        consumed = {}

        def optimizer_step():
            for name, p in named:
                consumed[name] = None if p.grad is None else p.grad.detach().clone()
            inner.step()

        def zero_grad(set_to_none):
            inner.zero_grad(set_to_none=set_to_none)

        def average_gradients():
            if s["world_size"] == 1:
                return
            grads = []
            for _, p in named:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
            with torch.no_grad():
                before = s["rank_average"] == "divide_before_sum"
                if before:
                    for g in grads:
                        g.div_(s["world_size"])
                room.all_reduce_sum(rank, grads)
                if not before:
                    for g in grads:
                        g.div_(s["world_size"])

        optimizer = HarnessOptimizer(optimizer_step, zero_grad, named,
                                     {"optimizer": s["optimizer"], "lr": s["learning_rate"]}, model)
        group = RankGroup(rank, s["world_size"], lambda tensors: room.all_reduce_sum(rank, tensors),
                          room.barrier)
        state = {}
        steps = []
        try:
            for index, ranks in enumerate(self.batches):
                consumed.clear()
                context = StepContext(
                    model=model,
                    # Copies: a step that writes into its batch must not change the file's.
                    micro_batches=[{"tokens": b["tokens"].clone(), "labels": b["labels"].clone()}
                                   for b in ranks[rank]],
                    loss_fn=self.loss_fn, optimizer=optimizer,
                    max_norm=s["clip_max_norm"], rank=rank, world_size=s["world_size"],
                    step_index=index, scenario=s, state=state,
                    average_gradients=average_gradients)
                with _DefaultGroup(group):
                    loss_to_log, grad_norm = read_result(step(context))
                steps.append({
                    "gradients": {name: consumed.get(name) for name, _ in named},
                    "loss_to_log": loss_to_log,
                    "grad_norm": grad_norm,
                    "parameters_after": {name: p.detach().clone() for name, p in named},
                })
            out[rank] = {"steps": steps, "error": None}
        except BaseException as error:  # recorded, and the other ranks released
            out[rank] = {"steps": steps, "error": error}
            room.abort()

    def run(self, step, timeout=60.0):
        """Runs `step(ctx)` on every rank (threads) for every optimizer step of the scenario,
        as gradnorm would; returns one {"steps": [...], "error": exception or None} per rank."""
        s = self.scenario
        if s["tp"] > 1 or s["cp"] > 1:
            raise NotImplementedError("%s: the helper runs data-parallel ranks only (no tensor or "
                                      "context parallelism); run it with gradnorm itself" % self.name)
        world = s["world_size"]
        room = _Room(world, timeout)
        out = [None] * world
        threads = [threading.Thread(target=self._run_rank, args=(step, r, room, out))
                   for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    # -- judging ----------------------------------------------------------------------------

    def compare(self, ranks, tensor_rel_l2=None, scalar_rel=None):
        """What disagrees with the oracle in `ranks` (as run() returns them), one line each;
        empty when the step agrees. Tolerances default to gradnorm's for the dtype."""
        tensor_tol = self.tolerance["tensor_rel_l2"] if tensor_rel_l2 is None else tensor_rel_l2
        scalar_tol = self.tolerance["scalar_rel"] if scalar_rel is None else scalar_rel
        oracle = self.oracle
        problems = []
        for rank, observed in enumerate(ranks):
            where = "rank %d" % rank
            error = observed["error"]
            if oracle["no_gradient"]:
                # The contract: raise, or show non-finite values. Finite gradients are a
                # silent update; no gradient and a finite loss hide that nothing was learnt.
                signalled = error is not None or any(
                    (g is not None and not bool(torch.isfinite(g).all()))
                    or (st["loss_to_log"] is not None and not math.isfinite(st["loss_to_log"]))
                    for st in observed["steps"] for g in st["gradients"].values())
                if not signalled:
                    problems.append("%s: N == 0 but the step neither raised nor returned a "
                                    "non-finite value: a silent update where no gradient exists"
                                    % where)
                continue
            if error is not None:
                problems.append("%s: raised %s: %s where the oracle has a gradient"
                                % (where, type(error).__name__, error))
                continue
            for index, (got, want) in enumerate(zip(observed["steps"], oracle["steps"])):
                at = "%s step %d" % (where, index)
                for name, expected in want["gradients"].items():
                    g = got["gradients"].get(name)
                    if g is None:
                        problems.append("%s: %s: no gradient consumed" % (at, name))
                        continue
                    e = _rel_l2(g, expected)
                    if not e <= tensor_tol:
                        problems.append("%s: %s gradient rel L2 error %.3g > %.0e"
                                        % (at, name, e, tensor_tol))
                e = _rel(got["loss_to_log"], want["loss"])
                if not e <= scalar_tol:
                    problems.append("%s: logged loss %r, oracle %.9g, rel error %.3g > %.0e"
                                    % (at, got["loss_to_log"], want["loss"], e, scalar_tol))
                clip = self.scenario["clip_max_norm"]
                if clip is not None and got["grad_norm"] is None:
                    problems.append("%s: clip_max_norm is %g but the step returned no grad_norm "
                                    "(clip_grad_norm_ never ran)" % (at, clip))
                elif clip is not None and got["grad_norm"] is not None:
                    e = _rel(got["grad_norm"], want["grad_norm"])
                    if not e <= scalar_tol:
                        problems.append("%s: grad norm %r, oracle %.9g, rel error %.3g > %.0e"
                                        % (at, got["grad_norm"], want["grad_norm"], e, scalar_tol))
                problems.extend(self._compare_update(at, got, want, index, tensor_tol))
            if len(observed["steps"]) != len(oracle["steps"]):
                problems.append("%s: completed %d of %d steps" % (where, len(observed["steps"]),
                                                                 len(oracle["steps"])))
        return problems

    def _compare_update(self, at, got, want, index, tensor_tol):
        """The step's parameter update against the oracle's, allowing for what storing the
        parameters in the scenario's dtype alone costs (as gradnorm does); not checked where
        that is half the update or more."""
        before = self.initial_parameters if index == 0 else \
            self.oracle["steps"][index - 1]["parameters_after"]
        problems = []
        for name, expected_after in want["parameters_after"].items():
            start = before[name].to(torch.float64)
            oracle_update = expected_after - start
            stored = expected_after.to(self.initial_parameters[name].dtype).to(torch.float64)
            allowance = _rel_l2(stored - start, oracle_update)
            if allowance > 0.5:
                continue
            e = _rel_l2(got["parameters_after"][name].to(torch.float64) - start, oracle_update)
            if not e <= tensor_tol + allowance:
                problems.append("%s: %s update rel L2 error %.3g > %.0e + %.2g"
                                % (at, name, e, tensor_tol, allowance))
        return problems

    def assert_agrees(self, step, tensor_rel_l2=None, scalar_rel=None):
        """Runs `step` and raises Disagreement, naming each failed check, unless it agrees
        with the oracle."""
        problems = self.compare(self.run(step), tensor_rel_l2, scalar_rel)
        if problems:
            raise Disagreement("%s (%s):\n  %s" % (self.name, self.path, "\n  ".join(problems)))
