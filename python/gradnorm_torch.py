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

import importlib.util
import math
import os
import sys
import threading

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

# --- torch.distributed: a default group per rank ------------------------------------------
# torch keeps one default group per process; the harness runs ranks as threads too, so the
# default group is looked up per thread (a process rank is one thread of its own).

_local = threading.local()
_process_default_group = _c10d._get_default_group
_process_is_initialized = _c10d.is_initialized


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
    ``.grad`` of every trainable parameter and the harness records what it consumed."""

    def __init__(self, step, zero_grad, params, facts):
        self._step = step
        self._zero_grad = zero_grad
        self.param_groups = [dict(facts, params=list(params))]

    def step(self, closure=None):
        if closure is not None:
            raise TypeError("gradnorm's optimizer takes no closure: run forward and backward "
                            "in the step, then call optimizer.step()")
        self._step()

    def zero_grad(self, set_to_none=True):
        self._zero_grad(bool(set_to_none))


class StepContext:
    """What ``step(ctx)`` gets; see the README's "Write your step in Python"."""

    Refusal = Refusal

    def __init__(self, *, model, micro_batches, loss_fn, optimizer, max_norm, rank,
                 world_size, step_index, scenario, state, average_gradients):
        self.model = model
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
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
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


class HarnessInterrupt(BaseException):
    """Raised into the step when a harness call failed (another rank's step raised, a
    collective timed out): the harness carries its own error; a step must not catch it."""


def load_step(path, function, module_name):
    """Imports the user's file as its own module and returns its step function."""
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError("cannot load %s as a Python module" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
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


def describe(error, path):
    """(type name, 'message (at FILE:LINE)') for an exception a step raised."""
    message = str(error).splitlines()[0] if str(error) else ""
    if isinstance(error, SyntaxError):
        message = error.msg
    return type(error).__name__, "%s (at %s)" % (message, where_raised(error, path))


class _Rank:
    """One rank of one run: the handle the harness gives, with the model, the optimizer and
    the default process group built around it once."""

    def __init__(self, handle):
        self.handle = handle
        named = handle.parameters()
        self.model = HarnessModel([(name, tensor) for name, tensor, _ in named], handle.logits)
        self.optimizer = HarnessOptimizer(
            handle.optimizer_step, handle.zero_grad,
            [tensor for _, tensor, trainable in named if trainable], handle.optimizer_facts())
        self.group = RankGroup(handle.rank, handle.world_size, handle.all_reduce_sum,
                               handle.barrier)
        self.state = {}


def bind(handle):
    return _Rank(handle)


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
        micro_batches=[{"tokens": tokens, "labels": labels}
                       for tokens, labels in handle.micro_batches()],
        loss_fn=handle.loss,
        optimizer=rank.optimizer,
        max_norm=handle.max_norm,
        rank=handle.rank,
        world_size=handle.world_size,
        step_index=handle.step_index(),
        scenario=handle.scenario(),
        state=rank.state,
        average_gradients=handle.average_gradients,
    )
    with _DefaultGroup(rank.group):
        return read_result(step(context))
