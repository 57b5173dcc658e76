"""The one place where toycomp touches private PyTorch APIs.

Everything imported here may change between PyTorch releases (toycomp runs on torch 2.13 in CI
and torch 2.11 on the GPU machine). Stages import these names from here, never from
``torch._*`` / ``torch.utils._*`` directly, so a PyTorch upgrade is fixed in one file::

    >>> schema = schema_of(torch.ops.aten.add_.Tensor)
    >>> schema.name, schema.is_mutable, [(a.name, a.is_write) for a in schema.arguments]
    ('aten::add_', True, [('self', True), ('other', False), ('alpha', False)])
"""

import contextlib
import functools
from typing import Any, Callable, Iterator, NamedTuple

import sympy
import torch
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401  (functionalize.py's recorder)
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten  # noqa: F401
from torch._C import _set_grad_enabled  # noqa: F401  (capture.py records grad-mode changes)
from torch._ops import OpOverload  # noqa: F401  (decompositions.py: is this target an ATen op?)
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily


# Ops that update their running stats in place although their schema does not say so.
_UNANNOTATED_WRITES = {
    f"aten::{name}": ("running_mean", "running_var")
    for name in ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm")
}


def written_tensor_args(func, args, kwargs):  # capture.py: which tensors does an ATen op mutate?
    """Tensor arguments that an OpOverload's schema marks as written (``Tensor(a!)``)."""
    written = []
    unannotated = _UNANNOTATED_WRITES.get(func._schema.name, ())
    for i, arg in enumerate(func._schema.arguments):
        if arg.name in unannotated or (arg.alias_info is not None and arg.alias_info.is_write):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            written += [v for v in values if hasattr(v, "untyped_storage")]
    return written


def tensor_version(t):  # capture/side_effects.py: a tensor's in-place version counter
    """``t._version``, or None for an inference tensor (made under ``torch.inference_mode()``):
    those have no version counter, so only writes announced by an op's schema are seen."""
    return None if t.is_inference() else t._version


# [Note: cudnn and mkldnn flags]
# Through torch._C rather than ``torch.backends.*.enabled = False``: that assignment raises once
# PyTorch's test utilities have frozen the global flags, and the ``flags()`` context managers
# also reset TF32 and determinism settings.
@contextlib.contextmanager
def cudnn_and_mkldnn_disabled() -> Iterator[None]:
    """Turn cudnn and mkldnn (oneDNN) off while AOT records ATen ops (see the Note above)."""
    was = torch._C._get_cudnn_enabled(), torch._C._get_mkldnn_enabled()
    torch._C._set_cudnn_enabled(False)
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_cudnn_enabled(was[0])
        torch._C._set_mkldnn_enabled(was[1])


class SchemaArgument(NamedTuple):
    """One argument of an ATen op's schema, in plain Python values."""

    name: str
    type: str  # "Tensor", "Optional[Tensor]", "List[Tensor]", "int"...
    is_write: bool  # annotated ``Tensor(a!)``: the op writes to it
    is_out: bool  # an ``out=`` argument
    has_default: bool
    default: Any  # meaningful when has_default


class OpSchema(NamedTuple):
    """An ATen op's schema (``aten::add_.Tensor(Tensor(a!) self, Tensor other, *, ...)``)."""

    name: str  # "aten::add_"
    arguments: tuple[SchemaArgument, ...]
    is_mutable: bool  # writes to some argument


@functools.lru_cache(maxsize=None)
def schema_of(op: OpOverload) -> OpSchema:  # functional_utils.py, partitioners.py
    """``op._schema`` as an ``OpSchema`` (read once per op: the recorder asks on every op)."""
    schema = op._schema
    arguments = tuple(
        SchemaArgument(a.name, str(a.type), a.alias_info is not None and a.alias_info.is_write,
                       a.is_out, a.has_default_value(),
                       a.default_value if a.has_default_value() else None)
        for a in schema.arguments)
    return OpSchema(schema.name, arguments, schema.is_mutable)


def overload_name(op: OpOverload) -> str:  # prims/decompositions.py: relu_.default's functional
    """The overload part of an ATen op's name.

    >>> overload_name(torch.ops.aten.add_.Tensor), overload_name(torch.ops.aten.relu_.default)
    ('Tensor', 'default')
    """
    return op._overloadname


def returns_alias(op: OpOverload) -> bool:  # prims/decompositions.py: views and in-place ops
    """True when one of ``op``'s results aliases an input (``-> Tensor(a)`` in its schema).

    >>> returns_alias(torch.ops.aten.t.default), returns_alias(torch.ops.aten.sin.default)
    (True, False)
    """
    return any(r.alias_info is not None for r in op._schema.returns)


def fake_tensor_mode():  # capture/output_graph.py: compile on metadata, never on the user's data
    """A fresh ``FakeTensorMode`` (static shapes): tensors with shapes, strides and dtypes only."""
    return FakeTensorMode()


def fake_mode_of(tensors):  # aot/aot_autograd.py: trace on the capture's fake tensors
    """The ``FakeTensorMode`` of the first fake tensor among ``tensors`` (None if none is)."""
    return next((t.fake_mode for t in tensors if isinstance(t, FakeTensor)), None)


def is_fake(t) -> bool:  # aot/functional_utils.py, tests: a tensor with metadata only
    return isinstance(t, FakeTensor)


def no_fake_mode():  # aot/tensor_tracker.py: plain meta tensors for meta["val"] while tracing
    """A context in which factory functions make ordinary tensors even inside a fake mode."""
    return unset_fake_temporarily()


def storage_identity(storage) -> int:  # aot/functional_utils.py: aliasing among fake tensors
    """The address of its C++ ``StorageImpl`` (a fake tensor's ``data_ptr()`` is always 0)."""
    return storage._cdata


def fake_on_device(t, device):  # pipeline.py: toycomp.explain on meta inputs compiles for CPU
    """A fake tensor like the fake ``t`` (shape, strides, dtype, requires_grad), on ``device``."""
    with no_fake_mode():
        meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        fake = FakeTensor(t.fake_mode, meta, device)
    return fake.requires_grad_(t.requires_grad)


# -- toycomp/exercises: real PyTorch's counterparts that the notebooks' checks compare with ----
def make_fx(fn, *args, decomposition_table=None):  # exercises: PyTorch's ATen-level tracer
    """``torch.fx.experimental.proxy_tensor.make_fx(fn, decomposition_table)(*args)``."""
    from torch.fx.experimental.proxy_tensor import make_fx as _make_fx

    return _make_fx(fn, decomposition_table=decomposition_table)(*args)


def partitioner_size_of(node) -> int:  # exercises/nb02.py: what the min cut weighs a node by
    """``torch._functorch.partitioners._size_of(node)``: bytes of ``node.meta["val"]``."""
    from torch._functorch.partitioners import _size_of

    return _size_of(node)


def aten_decomposition(op):  # exercises/nb03.py: PyTorch's own decomposition of an ATen op
    """``torch._decomp.decomposition_table[op]`` (None when PyTorch has none)."""
    from torch._decomp import decomposition_table

    return decomposition_table.get(op)


# -- symbolic sizes (dynamic shapes) -----------------------------------------------------------
def sym_expr(x):  # symbolic_shapes.py: the sympy expression of a SymInt / SymFloat / SymBool
    """``s0 * 3`` for a SymInt standing for it (``x.node.expr``: SymNode is private)."""
    return x.node.expr


def sym_hint(x):  # symbolic_shapes.py: a SymInt's value on the example inputs
    """The value a SymInt had on the inputs it was traced with (None for data-dependent ones)."""
    return x.node.hint


def _shape_env():
    """A ``ShapeEnv`` naming its symbols s0, s1, ... in creation order (PyTorch >= 2.9 names
    them by a hash of their source, s77, to keep names stable across recompiles)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    class SequentialShapeEnv(ShapeEnv):
        def _generate_unique_id(self, source_name):
            self.unique_ids.add(len(self.unique_ids))
            return len(self.unique_ids) - 1

    # Like Dynamo's defaults: an op whose output shape depends on data (nonzero) or an .item()
    # raises, as it does without a ShapeEnv, rather than making a data-dependent symbol.
    return SequentialShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False)


def symbolic_fake_tensor_mode():  # capture/output_graph.py: compile with dynamic shapes
    """A fresh ``FakeTensorMode`` with a ``ShapeEnv``: fake tensors may have symbolic sizes."""
    return FakeTensorMode(shape_env=_shape_env())


def fake_with_symbols(mode, t, dims: list, name: str):  # capture/output_graph.py
    """``mode``'s fake tensor for ``t``; ``dims[i]`` says how dimension i is made: "static",
    "dynamic" (a fresh symbol) or "duck" (the symbol of an earlier size with the same value).
    ``name`` (the tensor's guard text) names its sizes in the ShapeEnv's messages."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    kinds = {"static": DimDynamic.STATIC, "dynamic": DimDynamic.DYNAMIC, "duck": DimDynamic.DUCK}
    context = StatelessSymbolicContext(dynamic_sizes=[kinds[d] for d in dims])
    return mode.from_tensor(t, symbolic_context=context, source=ConstantSource(name))


def fake_mode_shape_env(mode):  # capture: the ShapeEnv of a FakeTensorMode (None: static)
    return getattr(mode, "shape_env", None)


def shape_env_guards(shape_env) -> list:  # capture/guard_builder.py: what the trace assumed
    """The sympy conditions the trace relied on (``Eq(s0, s1)``, ``s0 > 4``), in order."""
    return [guard.expr for guard in shape_env.guards]


def symbol_range(shape_env, symbol) -> tuple:  # capture: the bounds a symbol was given
    """(lower, upper) of a symbol's value range; None for an unbounded side."""
    bounds = shape_env.var_to_range.get(symbol)
    if bounds is None:
        return None, None

    def as_int(b):
        return int(b) if getattr(b, "is_Integer", False) else None  # not int_oo, -int_oo

    return as_int(bounds.lower), as_int(bounds.upper)


# -- symbolic sizes in stages 3-4 (prims/symbolic_sizes.py, inductor/sizevars.py) -------------
def shape_env_of(x):  # inductor/sizevars.py: the ShapeEnv owning a SymInt's symbols (or None)
    return x.node.shape_env


def implied_by_guards(shape_env, condition) -> bool:  # inductor/sizevars.py: sizes equal?
    """Whether the ShapeEnv knows ``condition`` (a sympy relation over its symbols) is true
    given the guards recorded so far, without adding a guard."""
    from torch.utils._sympy.functions import FloorDiv

    condition = condition.replace(lambda e: type(e).__name__ == "FloorDiv",
                                  lambda e: FloorDiv(*e.args))  # fmt: skip
    return bool(shape_env._maybe_evaluate_static(condition) == sympy.true)


def symbol_order(shape_env, symbol) -> int:  # inductor/sizevars.py: s77 was made first -> 0
    """The position of ``symbol`` among the ShapeEnv's backed symbols (-1: not one of them)."""
    values = getattr(shape_env, "backed_var_to_val", None)  # torch 2.13; 2.11: var_to_val
    values = shape_env.var_to_val if values is None else values
    return list(values).index(symbol) if symbol in values else -1


def dynamo_marked_dims(t) -> set:  # capture/dynamic_shapes.py: torch._dynamo.mark_dynamic's
    """Dimensions ``torch._dynamo.mark_dynamic`` marked on ``t`` (a private attribute)."""
    return set(getattr(t, "_dynamo_dynamic_indices", ()))


def symbolic_int(mode, value: int, name: str):  # capture/output_graph.py: a dynamic int input
    """A SymInt for the int argument ``value`` >= 2 (named ``name``) in ``mode``'s ShapeEnv,
    made like a size: its symbol ranges over 2, 3, ... (stages 3-4 rely on that)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    env, source = mode.shape_env, ConstantSource(name)
    symbol = env.create_symbol(value, source, DimDynamic.DYNAMIC)
    return env.create_symintnode(symbol, hint=value, source=source)


def assert_async(condition, message: str) -> None:  # prims/decomp_table.py: a check on the GPU
    """Assert a one-element bool tensor on its device, without waiting for it (CUDA: a
    device-side assert, as eager's own index checks)."""
    torch._assert_async(condition, message)


def clear_saved_tensors(ctx) -> None:  # aot/runtime_wrappers.py: free saved values in backward
    """Free saved tensors after the backward read them (``ctx.maybe_clear_saved_tensors()``)."""
    ctx.maybe_clear_saved_tensors()


def empty_strided_cuda(size, stride, dtype, device=None):  # inductor/wrapper.py: allocations
    """``torch.empty_strided`` on the *current* CUDA device, which the wrapper's device guard has
    set to ``device``: Inductor's allocator (``empty_strided_cuda``), without the Python
    argument parsing and device lookup of ``torch.empty_strided`` (2.5 us against 5.1 us a
    call on the H100's host; a training step allocates a few hundred buffers)."""
    return torch._C._dynamo.guards._empty_strided_cuda(size, stride, dtype)


def clear_cublas_workspaces() -> None:  # inductor/opt/cudagraphs.py: around each capture
    """Free cuBLAS's cached workspaces (one per handle and stream), so the next matmul
    allocates a new one: inside a capture, from the graph's own pool (Inductor's
    ``clear_cublass_cache`` in cudagraph_trees.py)."""
    torch._C._cuda_clearCublasWorkspaces()


def tensor_guards(tensors: list) -> tuple:  # capture/guard_check.py: a model's tensor guards
    """``(check, why)``: ``check(*ts)`` is whether tensors ``ts`` have the exact Python types,
    dispatch keys, dtypes, devices, requires_grad, sizes and strides of ``tensors``, in one C++
    call (Dynamo's ``TensorGuards``, no reference kept to the tensors); ``why(ts, names)`` says
    the first difference in Dynamo's words (``tensor 'w' dtype mismatch. expected Float, ...``).
    """
    guards = torch._C._dynamo.guards.TensorGuards(
        *tensors,
        dynamic_dims_sizes=[list(t.shape) for t in tensors],
        dynamic_dims_strides=[list(t.stride()) for t in tensors],
    )
    return guards.check, lambda ts, names: guards.check_verbose(*ts, tensor_check_names=names)


def _never(*tensors) -> bool:
    return False


# [Note: input layouts in one call]
# ``LayoutsSeen.check(*ts)``: do tensors ``ts`` have exactly the Python types, dtypes, devices,
# requires_grad, sizes and strides of the tensors last given to ``remember``? One C++ call for
# all of them (Dynamo's ``TensorGuards``, which checks its TENSOR_MATCH guards): about 0.07 us a
# tensor on the 2-core CPU, where a Python ``check_input`` costs 1.5 us. It keeps no reference to
# the tensors, and is False until something is remembered.
class LayoutsSeen:  # inductor/wrapper.py, aot/runtime_wrappers.py: inputs checked once
    """Inputs checked against the layouts last remembered ([Note: input layouts in one call])."""

    __slots__ = ("check",)

    def __init__(self) -> None:
        self.check = _never

    def remember(self, *tensors: torch.Tensor) -> None:
        n = len(tensors)
        if len({id(t) for t in tensors}) < n:  # a tensor given twice
            self.check = _with_repeats(tensors)
            return
        check = torch._C._dynamo.guards.TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        ).check
        self.check = lambda *ts: len(ts) == n and check(*ts)  # (TensorGuards raises otherwise)


def _with_repeats(tensors: tuple) -> Callable:
    """TensorGuards is False for a tensor given twice (Dynamo passes each once): check the
    others, and that the repeated positions hold the same tensor again."""
    first: dict[int, int] = {}  # id -> the first position of that tensor
    for i, t in enumerate(tensors):
        first.setdefault(id(t), i)
    unique = sorted(first.values())
    check, _ = tensor_guards([tensors[i] for i in unique])
    n = len(tensors)
    repeats = [(i, first[id(t)]) for i, t in enumerate(tensors) if first[id(t)] != i]
    return lambda *ts: (
        len(ts) == n
        and all(ts[i] is ts[j] for i, j in repeats)
        and check(*[ts[i] for i in unique]))  # fmt: skip
