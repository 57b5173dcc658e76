"""Stage 1's rules: an intercepted torch call -> a graph break, or how to write it as an FX node.

Rule tables say which torch calls the tracer records, which ones break the graph (and why), and how
a recorded call is written in the FX graph.

toycomp/capture/tracer.py asks these rules about every call its ``TorchFunctionMode`` intercepts
(the arguments of ``target_for`` are FX nodes by then; strings stand in for them here):

    >>> x = torch.ones(1)
    >>> check_supported(torch.Tensor.item, (x,), {})
    Traceback (most recent call last):
      ...
    toycomp.capture.rules.GraphBreakError: Tensor.item: Tensor.item() turns a tensor value into ...
    >>> check_supported(torch.sin, (x,), {})  # passes: record it
    >>> target_for(torch.Tensor.add, ("a", "b"), {})
    ('call_function', <built-in function add>, ('a', 'b'), {})
    >>> target_for(torch.Tensor.sum, ("a",), {"dim": 0})
    ('call_method', 'sum', ('a',), {'dim': 0})

The tables are keyed by the call's name (``"item"``, ``"__bool__"``, ``"add"``); supporting a new
construct means adding an entry, not editing the tracer.

[Note: why a TorchFunctionMode tracer specialises control flow]
Python code between torch calls (``if n > 2:``, loops over ``range(x.shape[0])``, attribute lookups)
is invisible to the mode; it simply runs with the real values, and the graph records the one path
that was taken. That is sound as long as every value the path depended on is guarded: Python
arguments get value guards, shapes get shape guards (guards.py). But ``if x.sum() > 0:``
depends on tensor *data*, which no guard covers (the next call has new data), so
``Tensor.__bool__`` - and ``.item()``, ``int(t)``, ops whose output shape depends on data - must
stop the capture: a graph break (``VALUE_DEPENDENT``, ``DATA_DEPENDENT_SHAPE``). Calls that return
Python values computed from metadata only (``x.size()``, ``x.dtype``) are fine: the tensor guards
cover them (``METADATA``).

NB: in PyTorch this lives in torch/_dynamo/: trace_rules.py (which functions are kept in the
graph, inlined or skipped), variables/torch.py (``TorchInGraphFunctionVariable``: torch calls put
in the graph), variables/builtin.py (``BuiltinVariable``: operators), symbolic_convert.py
(``generic_jump`` breaks on ``if tensor:``) and variables/tensor.py (``method_item`` breaks on
``.item()`` unless ``config.capture_scalar_outputs``).
"""

from __future__ import annotations

import inspect
import operator
import types
from typing import Any, Callable

import torch


class GraphBreakError(Exception):
    """Raised inside the tracer when it meets a construct it cannot capture."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check_tensor_type(t: torch.Tensor | type, what: str) -> None:
    """Break on tensor subclasses: their ``__torch_function__`` would run unrecorded logic."""
    cls = t if isinstance(t, type) else type(t)
    if cls not in (torch.Tensor, torch.nn.Parameter):
        raise GraphBreakError(f"{what} is a tensor subclass ({cls.__name__})")


def is_tensor_sequence(result: Any) -> bool:
    """True for a tuple / list of tensors (``None`` allowed), as ``torch.split`` returns."""
    if not isinstance(result, (tuple, list)):
        return False
    is_tensor = [isinstance(r, torch.Tensor) for r in result]
    return any(is_tensor) and all(t or r is None for t, r in zip(is_tensor, result))


# ----------------------------------------------------------------------------------------------
# Which calls are supported
# ----------------------------------------------------------------------------------------------

VALUE_DEPENDENT = {
    "__bool__": "Python control flow on a tensor's value (`if t:`, `while t:`, `and`/`or`)",
    "item": "Tensor.item() turns a tensor value into a Python number",
    "tolist": "Tensor.tolist() turns tensor values into Python numbers",
    "numpy": "Tensor.numpy() leaves PyTorch",
    "__array__": "converting a tensor to a NumPy array leaves PyTorch",
    "__int__": "int() of a tensor turns a tensor value into a Python number",
    "__float__": "float() of a tensor turns a tensor value into a Python number",
    "__complex__": "complex() of a tensor turns a tensor value into a Python number",
    "__index__": "using a tensor as a Python index turns its value into a Python int",
    "backward": "calling .backward() inside the captured function",
}
DATA_DEPENDENT_SHAPE = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"}
DATA_DEPENDENT_SHAPE |= {"bincount"}

# Calls returning Python values that depend only on metadata (covered by the tensor guards).
METADATA = {"size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset"}
METADATA |= {"is_contiguous", "is_floating_point", "is_complex", "is_signed", "element_size"}
METADATA |= {"get_device", "__len__", "__hash__", "is_same_size", "shape", "ndim", "dtype"}
METADATA |= {"device", "layout", "requires_grad", "is_leaf", "is_cuda", "is_cpu", "is_meta"}
METADATA |= {"is_sparse", "is_quantized", "is_nested", "itemsize", "nbytes", "type"}


def check_supported(func: Callable, args: tuple, kwargs: dict) -> None:
    """Refuse a call whose result depends on tensor values in a way no guard can cover.

    Args:
        func: the torch function or Tensor method the mode intercepted.
        args: its positional arguments (real tensors).
        kwargs: its keyword arguments.

    Raises:
        GraphBreakError: naming the call and why it cannot be captured.
    """
    name = func_name(func)
    if name in VALUE_DEPENDENT:
        raise GraphBreakError(f"{display_name(func)}: {VALUE_DEPENDENT[name]}")
    shape_from_values = name in DATA_DEPENDENT_SHAPE
    shape_from_values |= name == "where" and len(args) + len(kwargs) == 1
    shape_from_values |= name == "repeat_interleave" and isinstance(
        args[1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor
    )
    shape_from_values |= name == "__getitem__" and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
        for i in (args[1] if isinstance(args[1], tuple) else (args[1],))
    )
    if shape_from_values:
        raise GraphBreakError(
            f"{display_name(func)}: the output shape depends on tensor values (data-dependent)"
        )


def is_property_getter(func: Callable) -> bool:
    """True for a Tensor property read (``x.shape``, ``x.T``): the mode sees its ``__get__``."""
    owner = getattr(func, "__self__", None)
    return getattr(func, "__name__", None) == "__get__" and isinstance(
        owner, (types.GetSetDescriptorType, property)
    )


def func_name(func: Callable) -> str:
    """The key of the rule tables: ``"sin"``, ``"__bool__"``, ``"shape"`` for a property."""
    if is_property_getter(func):
        owner = func.__self__
        return getattr(owner, "__name__", None) or owner.fget.__name__
    return getattr(func, "__name__", type(func).__name__)


def _is_tensor_method(func: Callable) -> bool:
    name = func_name(func)
    qualname = getattr(func, "__qualname__", "")
    if getattr(torch.Tensor, name, None) is func:
        return True
    return qualname.startswith(("Tensor.", "TensorBase."))


def display_name(func: Callable) -> str:
    """How error messages name a call: ``Tensor.item``, ``torch.nonzero``."""
    if _is_tensor_method(func) or is_property_getter(func):
        return f"Tensor.{func_name(func)}"
    module = getattr(func, "__module__", None) or "torch"
    return f"{module}.{func_name(func)}"


# ----------------------------------------------------------------------------------------------
# How a recorded call is written in the graph
# ----------------------------------------------------------------------------------------------

# x.add(y) and x + y are the same call to PyTorch; the graph prints the operator form.
BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}
BINARY |= {"matmul": operator.matmul, "pow": operator.pow, "__floordiv__": operator.floordiv}
BINARY |= {"remainder": operator.mod, "__getitem__": operator.getitem, "eq": operator.eq}
BINARY |= {"__eq__": operator.eq, "ne": operator.ne, "__ne__": operator.ne, "gt": operator.gt}
BINARY |= {"lt": operator.lt, "ge": operator.ge, "le": operator.le, "__and__": operator.and_}
BINARY |= {"__or__": operator.or_, "__xor__": operator.xor}
UNARY = {"neg": operator.neg, "__invert__": operator.invert}
REVERSED = {"__rsub__": operator.sub, "__rdiv__": operator.truediv, "__rpow__": operator.pow}
REVERSED |= {"__rtruediv__": operator.truediv, "__rmatmul__": operator.matmul}
REVERSED |= {"__rfloordiv__": operator.floordiv}


def _drop_defaults(func: Callable, kwargs: dict) -> dict:
    """Python torch functions (F.cross_entropy) pass every keyword on; keep non-default ones."""
    if not kwargs or not inspect.isfunction(func):
        return kwargs
    params = inspect.signature(func).parameters
    return {
        k: v
        for k, v in kwargs.items()
        if k not in params or type(v) is not type(params[k].default) or v != params[k].default
    }


def target_for(func: Callable, args: tuple, kwargs: dict) -> tuple[str, Any, tuple, dict]:
    """How a torch call is written in the graph.

    Tensor methods with an operator form become ``call_function`` nodes on ``operator.*`` (so
    ``x.add(y)`` and ``x + y`` print alike), other Tensor methods ``call_method`` nodes, and
    ``torch.*`` / ``F.*`` functions ``call_function`` nodes on themselves.

    Args:
        func: the intercepted torch function or Tensor method.
        args: its positional arguments, tensors already replaced by FX nodes.
        kwargs: its keyword arguments, likewise.

    Returns:
        ``(op, target, args, kwargs)`` for ``torch.fx.Graph.create_node``.
    """
    name = func_name(func)
    if is_property_getter(func):
        return "call_function", getattr, (args[0], name), {}
    if not _is_tensor_method(func):
        return "call_function", func, args, _drop_defaults(func, kwargs)
    if name == "__setitem__":
        return "call_function", operator.setitem, args, kwargs
    if name in REVERSED and len(args) == 2 and not kwargs:
        return "call_function", REVERSED[name], (args[1], args[0]), {}
    if name in BINARY and len(args) == 2 and not kwargs:
        return "call_function", BINARY[name], args, {}
    if name in UNARY and len(args) == 1 and not kwargs:
        return "call_function", UNARY[name], args, {}
    return "call_method", name, args, kwargs
