"""torch functions and torch's context managers while tracing.

A call to a torch function (``torch.sin``, ``F.relu``, ``torch.Tensor.add``) is put in the graph
as one ``call_function`` node and run on fake tensors for its result's metadata. Functions that
answer from global state (``torch.is_grad_enabled()``) are constants: the guards pin that state.
``with torch.no_grad():`` and ``with torch.autocast(...)`` put their state changes in the graph
(``torch._C._set_grad_enabled(False)``, ``_enter_autocast``/``_exit_autocast``) and change the
state for real while tracing, so the fake results get the right ``requires_grad`` and dtype.

Example: ``with torch.no_grad(): y = x * 2`` traces to::

    _set_grad_enabled = torch._C._set_grad_enabled(False)
    mul = x * 2
    _set_grad_enabled_1 = torch._C._set_grad_enabled(True)

>>> TorchVariable(torch.Size).call_function(None, [ConstantVariable((2, 3))], {})
ConstantVariable(torch.Size([2, 3]))

NB: in PyTorch this lives in torch/_dynamo/variables/torch.py (TorchInGraphFunctionVariable) and
torch/_dynamo/variables/ctx_manager.py (GradModeVariable, AutocastModeVariable).
"""

from __future__ import annotations

import torch

from toycomp.capture.variables.base import (
    ConstantVariable,
    Unsupported,
    ValueVariable,
    VariableTracker,
)
from toycomp.capture.variables.tensor import NumpyArrayVariable, TensorVariable

CONSTANT_FUNCTIONS = {torch.is_grad_enabled, torch.get_default_dtype, torch.is_autocast_enabled,
                      torch.get_autocast_dtype, torch.Size, torch.device, torch.finfo, torch.iinfo,
                      torch.is_inference_mode_enabled}
UNSUPPORTED = {torch.manual_seed, torch.seed, torch.set_default_dtype, torch.save, torch.load,
               torch.compile, torch.set_printoptions, torch.use_deterministic_algorithms,
               torch.autograd.grad, torch.autograd.backward, torch.inference_mode,
               torch.nn.Parameter, torch.Tensor, torch.Generator, torch.get_rng_state,
               torch.set_rng_state,
               torch.embedding_bag, torch.nn.functional.embedding_bag}  # (see below)
# embedding_bag: its meta kernel gives offset2bag and bag_size other sizes than its CPU kernel
# does (they depend on the mode and the device), so no graph can plan them: a graph break.
AUTOCAST = {torch.autocast, torch.amp.autocast}
# Questions about who is tracing, with a fixed answer while toycomp traces (Dynamo:
# ``tracing_state_functions``). nn.MultiheadAttention asks ``_is_make_fx_tracing()`` to leave
# its fused inference kernel for the composite path, which is made of ops the graph can hold.
TRACING_STATE = {torch.jit.is_scripting: False, torch.jit.is_tracing: False,
                 torch.compiler.is_compiling: True, torch.compiler.is_exporting: False,
                 torch.fx._symbolic_trace.is_fx_tracing: False,
                 torch.nn.modules.activation._is_make_fx_tracing: True}
# Callables whose call TorchVariable.call_special handles (most add no graph op).
SPECIAL_FUNCTIONS = (torch.from_numpy, torch.as_tensor, torch.asarray, torch.jit.annotate,
                     torch.is_tensor, torch.no_grad, torch.enable_grad, torch.set_grad_enabled)


def is_special(fn) -> bool:
    """Custom ops, refused calls, tracing state, constants, grad mode, autocast, classes."""
    return (isinstance(getattr(fn, "_opoverload", None), torch._ops.OpOverload)
            or fn in UNSUPPORTED or getattr(fn, "__module__", "").startswith("torch._dynamo")
            or any(fn is f for f in TRACING_STATE) or fn in SPECIAL_FUNCTIONS
            or fn in CONSTANT_FUNCTIONS or fn in AUTOCAST or isinstance(fn, type))


class TorchVariable(ValueVariable):
    """A torch function or class; calling it adds a graph node (or a context manager)."""

    def var_getattr(self, tx, name):
        return tx.output.wrap(getattr(self.value, name), None, guard=False)

    def call_function(self, tx, args, kwargs):
        if is_special(self.value):  # not a plain graph call
            return self.call_special(tx, args, kwargs)
        if self.value in ARGUMENT_RULES:  # torch.arange's dtype, F.one_hot's number of classes
            args, kwargs = ARGUMENT_RULES[self.value](tx, args, kwargs)
        return tx.output.create_call("call_function", self.value, args, kwargs)

    def call_special(self, tx, args, kwargs):
        fn = self.value
        if isinstance(getattr(fn, "_opoverload", None), torch._ops.OpOverload):  # a custom_op:
            # the graph calls its operator (metadata: its fake impl), as Dynamo does
            return tx.output.create_call("call_function", fn._opoverload, args, kwargs)
        if fn in UNSUPPORTED or getattr(fn, "__module__", "").startswith("torch._dynamo"):
            raise Unsupported(f"call to {getattr(fn, '__qualname__', fn)}")
        if any(fn is f for f in TRACING_STATE):
            return ConstantVariable(TRACING_STATE[fn])
        if fn in (torch.from_numpy, torch.as_tensor, torch.asarray) and not kwargs and \
                isinstance(args[0], NumpyArrayVariable):  # t.numpy() back: t's data, no grad
            return tx.output.create_call("call_method", "detach", [args[0].tensor], {})
        if fn is torch.jit.annotate:  # a type hint for TorchScript: the value itself
            return args[1]
        if fn is torch.is_tensor:
            return ConstantVariable(isinstance(args[0], TensorVariable))
        if fn in CONSTANT_FUNCTIONS:
            consts = [a.as_python_constant() for a in args]
            kw = {k: v.as_python_constant() for k, v in kwargs.items()}
            return ConstantVariable(fn(*consts, **kw))
        if fn in (torch.no_grad, torch.enable_grad):
            return GradModeVariable(fn is torch.enable_grad)
        if fn is torch.set_grad_enabled:
            return GradModeVariable(args[0].as_python_constant()).enter(tx, now=True)
        if fn in AUTOCAST:
            return AutocastVariable(args, kwargs)
        if isinstance(fn, type):
            raise Unsupported(f"creating a {fn.__qualname__}")
        return tx.output.create_call("call_function", fn, args, kwargs)  # torch.as_tensor(t)

    def reconstruct(self, codegen):
        return codegen.source(self.source) if self.source else codegen.constant(self.value)

    def __repr__(self):
        return f"TorchVariable({getattr(self.value, '__qualname__', self.value)})"


def _arange_arguments(tx, args, kwargs) -> tuple[list, dict]:
    """Integer bounds give int64: written out, so that sizes (SymInts) keep it."""
    if "dtype" not in kwargs and all(
            isinstance(a, ConstantVariable) and a.python_type() is int for a in args):
        kwargs = {**kwargs, "dtype": ConstantVariable(torch.int64)}
    return args, kwargs


def _one_hot_arguments(tx, args, kwargs) -> tuple[list, dict]:
    """``one_hot``'s arguments, its classes through ``toycomp::check_one_hot``: traced on fake
    tensors, ATen's one_hot skips the range check eager makes ([Note: checks that raise as
    eager does] in prims/decomp_table.py). num_classes=-1 (read from the data) is left alone."""
    n = kwargs["num_classes"] if "num_classes" in kwargs else (args[1] if len(args) > 1 else None)
    if n is None or n.as_python_constant() < 0:
        return list(args), kwargs
    check = torch.ops.toycomp.check_one_hot.default
    return [tx.output.create_call("call_function", check, [args[0], n], {}), *args[1:]], kwargs


# Functions whose arguments are adjusted before they become a graph node.
ARGUMENT_RULES = {torch.arange: _arange_arguments, torch.nn.functional.one_hot: _one_hot_arguments}


class ContextManagerVariable(VariableTracker):
    """A context manager; ``BEFORE_WITH`` calls ``enter``, the ``__exit__`` call ``exit``.
    ``reenter()`` is how to enter it again after a graph break: a callable and its arguments
    (Dynamo: ``reconstruct_type`` and ``target_values``)."""

    def reenter(self) -> tuple:
        raise Unsupported(f"a graph break inside `with {self}`")

    def reconstruct(self, codegen):
        raise Unsupported("a graph break inside a `with` block")


class GradModeVariable(ContextManagerVariable):
    """``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(mode)``."""

    def __init__(self, mode: bool):
        self.mode = mode
        self.prev = None

    def enter(self, tx, now=False):
        if self.prev is None:  # set_grad_enabled() already entered when it was called
            self.prev = torch.is_grad_enabled()
            set_grad(tx, self.mode)
        return self if now else ConstantVariable(None)

    def exit(self, tx):
        set_grad(tx, self.prev)
        return ConstantVariable(None)

    def reenter(self):
        return torch.set_grad_enabled, (self.mode,)


def set_grad(tx, mode: bool) -> None:
    """Switch grad mode in the graph and for real; no node when it is already ``mode`` (the
    guards pin the mode at the graph's start; Dynamo also coalesces these)."""
    if torch.is_grad_enabled() != mode:
        tx.output.create_call("call_function", torch._C._set_grad_enabled,
                              [ConstantVariable(mode)], {})
        torch._C._set_grad_enabled(mode)


class AutocastVariable(ContextManagerVariable):
    """``torch.autocast(device_type, dtype=...)``: graph nodes enter and leave the region."""

    def __init__(self, args, kwargs):
        self.args = [a.as_python_constant() for a in args]
        self.kwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
        self.node = None
        self.real = None

    def enter(self, tx):
        real = torch.autocast(*self.args, **self.kwargs)
        params = [real.device, real.fast_dtype, real._enabled, real._cache_enabled]
        enter = torch.amp.autocast_mode._enter_autocast
        self.node = tx.output.opaque_call(enter, [ConstantVariable(p) for p in params])
        self.real = real
        real.__enter__()
        tx.output.entered.append(real)  # left for real when the trace ends, whatever happens
        return ConstantVariable(None)

    def exit(self, tx):
        exit_fn = torch.amp.autocast_mode._exit_autocast
        tx.output.opaque_call(exit_fn, [self.node])
        self.real.__exit__(None, None, None)
        tx.output.entered.remove(self.real)
        return ConstantVariable(None)

    def reenter(self):
        real = self.real or torch.autocast(*self.args, **self.kwargs)
        return torch.autocast, (real.device, real.fast_dtype, real._enabled, real._cache_enabled)


class WithExitFunctionVariable(VariableTracker):
    """The ``__exit__`` that ``BEFORE_WITH`` leaves on the stack; calling it exits the region.

    At a graph break inside the block it is not rebuilt as a value: the graph exits the region
    at its end, the breaking instruction runs inside ``with <ctx.reenter()>:`` and the resume
    function enters the region again where this ``__exit__`` was on the stack
    (toycomp/capture/resume_execution.py). ``in_try``: the ``with`` is inside a ``try`` block."""

    def __init__(self, ctx: ContextManagerVariable, in_try: bool = False):
        self.ctx = ctx
        self.in_try = in_try

    def call_function(self, tx, args, kwargs):
        return self.ctx.exit(tx)

    def reconstruct(self, codegen):
        raise Unsupported("the __exit__ of a `with` block used as a value")
