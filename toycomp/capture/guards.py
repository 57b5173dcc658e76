"""Guards: when may a captured graph be reused?  Python call arguments -> list[Guard].

A captured graph is only valid for inputs that look like the example inputs it was traced with:
the tracer (toycomp/capture/tracer.py) *specialised* on everything that is not tensor data, i.e.
shapes, strides, dtypes, Python ints and bools, the structure of the arguments. Guards write those
assumptions down so a caller can check them cheaply before reusing the graph:

    >>> def f(x, n):
    ...     return x * n
    >>> leaves, structure = flatten_user_inputs(signature_of(f), (torch.ones(3), 2), {})
    >>> [str(g) for g in input_guards(leaves, structure)]
    ['(*args, **kwargs) == (x: Tensor, n: int)', 'torch.is_grad_enabled() == True',
     'x.shape == (3,)', 'x.stride() == (1,)', 'x.dtype == torch.float32',
     "x.device == torch.device('cpu')", 'x.requires_grad == False', 'n == 2']

Every guard reads one *source* (``x``, ``pair[0]``, ``kwargs['y']``, ``fc1_weight``) from a dict of
current values and compares one property with the value seen while tracing.

NB: in PyTorch this lives in torch/_dynamo/guards.py (GuardBuilder, which compiles guards into a
C++ ``GuardManager`` tree) and torch/_guards.py (``Guard``, ``Source``).
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

# Sources that are not user arguments; neither is an identifier, so no argument can be named so.
STRUCTURE = "(*args, **kwargs)"
GRAD_MODE = "torch.is_grad_enabled()"

# Python values that are baked into the graph and guarded by value (``n == 3``).
CONSTANT_TYPES = (
    bool,
    int,
    float,
    complex,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


@dataclass(frozen=True)
class Guard:
    """One assumption of a captured graph, e.g. ``x.shape == (1000,)``.

    Attributes:
        source: what is read: an argument path (``x``, ``pair[0]``), a lifted tensor's placeholder
            name (``fc1_weight``), ``(*args, **kwargs)`` (argument structure) or
            ``torch.is_grad_enabled()``.
        kind: ``shape``, ``stride``, ``dtype``, ``device``, ``requires_grad`` (tensor metadata),
            ``value`` (a Python constant, type included), ``structure``, ``alias`` (two arguments
            are the same tensor) or ``identity`` (an arbitrary object, compared with ``is``).
        expected: the value seen while tracing.
    """

    source: str
    kind: str
    expected: Any

    def check(self, values: Mapping[str, Any]) -> bool:
        """Return True when the guard holds for ``values`` (source -> current value)."""
        if self.source not in values:
            return False
        value = values[self.source]
        if self.kind in _TENSOR_PROPERTIES:
            return isinstance(value, torch.Tensor) and _TENSOR_PROPERTIES[self.kind](value) == (
                self.expected
            )
        if self.kind == "value":
            return type(value) is type(self.expected) and value == self.expected
        if self.kind == "alias":
            return value is values.get(self.expected)
        return value is self.expected if self.kind == "identity" else value == self.expected

    def __str__(self) -> str:
        src, exp = self.source, self.expected
        if self.kind == "stride":
            return f"{src}.stride() == {exp}"
        if self.kind == "device":
            return f"{src}.device == torch.device({str(exp)!r})"
        if self.kind in _TENSOR_PROPERTIES:
            return f"{src}.{self.kind} == {exp}"
        if self.kind == "structure":
            return f"{src} == ({', '.join(exp)})"
        if self.kind == "alias":
            return f"{src} is {exp}"
        if self.kind == "identity":
            return f"{src} is <the {type(exp).__name__} object seen while tracing>"
        return f"{src} == {exp!r}"


_TENSOR_PROPERTIES: dict[str, Callable[[torch.Tensor], Any]] = {
    "shape": lambda t: tuple(t.shape),
    "stride": lambda t: tuple(t.stride()),
    "dtype": lambda t: t.dtype,
    "device": lambda t: t.device,
    "requires_grad": lambda t: t.requires_grad,
}


def tensor_guards(source: str, t: torch.Tensor) -> list[Guard]:
    """Guards on the metadata of one tensor (its data is never guarded)."""
    return [Guard(source, kind, read(t)) for kind, read in _TENSOR_PROPERTIES.items()]


def signature_of(fn: Callable) -> inspect.Signature | None:
    """The signature used to name arguments (a module's ``forward``), or None if unavailable."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def flatten_user_inputs(
    signature: inspect.Signature | None, args: tuple, kwargs: dict
) -> tuple[list[tuple[str, Any]], tuple[str, ...]]:
    """Name every leaf of the call arguments after the parameter it was passed to.

    Args:
        signature: the callee's signature (None: name positional args ``args[i]``).
        args: positional call arguments.
        kwargs: keyword call arguments.

    Returns:
        ``(leaves, structure)``: leaves as ``(source, value)`` pairs in a fixed order (tuples, lists
        and dicts are walked into), and the structure description ``("x: Tensor", "pair: tuple[2]",
        ...)`` that the structure guard compares.

    Raises:
        TypeError: when the arguments do not bind to the signature.
    """
    named: list[tuple[str, Any]] = []
    simple = plain_parameter_names(signature) if signature is not None else None
    if simple is not None and not kwargs and len(args) == len(simple):
        named = list(zip(simple, args))  # the common case, without Signature.bind's cost
    elif signature is None:
        named += [(f"args[{i}]", a) for i, a in enumerate(args)]
        named += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    else:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                named += [(f"{name}[{i}]", a) for i, a in enumerate(value)]
            elif kind is inspect.Parameter.VAR_KEYWORD:
                named += [(f"{name}[{k!r}]", v) for k, v in value.items()]
            else:
                named.append((name, value))
    leaves: list[tuple[str, Any]] = []
    structure: list[str] = []
    for source, value in named:
        _walk(source, value, leaves, structure)
    return leaves, tuple(structure)


@functools.lru_cache(maxsize=256)
def plain_parameter_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    """Parameter names when every parameter is a plain positional-or-keyword one without a
    default (then binding positional arguments is just zipping), else None."""
    params = signature.parameters.values()
    plain = all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params)
    return tuple(signature.parameters) if plain else None


def _walk(source: str, value: Any, leaves: list, structure: list) -> None:
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        structure.append(f"{source}: {type(value).__name__}[{len(value)}]")
        for i, item in enumerate(value):
            _walk(f"{source}[{i}]", item, leaves, structure)
    elif isinstance(value, dict):
        structure.append(f"{source}: {type(value).__name__}{list(value)}")
        for key, item in value.items():
            _walk(f"{source}[{key!r}]", item, leaves, structure)
    else:
        kind = "Tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        structure.append(f"{source}: {kind}")
        leaves.append((source, value))


def placeholder_name(source: str) -> str:
    """A valid, readable identifier for a source: ``pair[0]`` -> ``pair_0``, ``0.w`` -> ``_0_w``."""
    name = re.sub(r"\W+", "_", source.replace("'", "")).strip("_") or "input"
    return f"_{name}" if name[0].isdigit() else name


def input_guards(leaves: list[tuple[str, Any]], structure: tuple[str, ...]) -> list[Guard]:
    """Guards on the user's arguments: structure, grad mode, then one group per leaf.

    Tensors get metadata guards (or an ``alias`` guard when the same tensor was passed twice);
    Python constants get ``value`` guards; other objects get ``identity`` guards.
    """
    guards = [
        Guard(STRUCTURE, "structure", structure),
        Guard(GRAD_MODE, "value", torch.is_grad_enabled()),
    ]
    first_seen: dict[int, str] = {}
    for source, value in leaves:
        if isinstance(value, torch.Tensor):
            if id(value) in first_seen:
                guards.append(Guard(source, "alias", first_seen[id(value)]))
            else:
                first_seen[id(value)] = source
                guards += tensor_guards(source, value)
        elif isinstance(value, CONSTANT_TYPES):
            guards.append(Guard(source, "value", value))
        else:
            guards.append(Guard(source, "identity", value))
    return guards


def first_failing(guards: list[Guard], values: Mapping[str, Any]) -> Guard | None:
    """The first guard that does not hold for ``values``, or None when all hold."""
    for guard in guards:
        if not guard.check(values):
            return guard
    return None


def lifted_tensor_sources(fn: Callable) -> dict[int, tuple[torch.Tensor, str, str, Callable]]:
    """Readable names for the tensors ``fn`` can reach without receiving them as arguments.

    Looks at ``fn`` itself when it is an nn.Module (or a method of one), at its closure cells and
    at the globals its code names. A parameter ``fc1.weight`` of the module becomes placeholder
    ``fc1_weight``; a closed-over module ``model`` gives ``model_fc1_weight``.

    Returns:
        ``id(tensor) -> (tensor, placeholder name, source, fetch)``, where ``fetch()`` re-reads the
        tensor through the same path (so a replaced parameter is seen on the next call).
    """
    table: dict[int, tuple[torch.Tensor, str, str, Callable]] = {}
    for name, prefix, read_root, root in _roots(fn):
        for path, t in _named_tensors(root):
            source = f"{prefix}.{path}" if path else prefix
            short = path if name == "self" and not path[0].isdigit() else f"{name}.{path}"
            fetch = _attr_reader(read_root, path)
            table.setdefault(id(t), (t, placeholder_name(short), source, fetch))
    return table


def state_guards(fn: Callable) -> tuple[list[Guard], dict[str, Callable[[], Any]]]:
    """Guards on Python state ``fn`` reads besides its arguments, and readers for their sources.

    Covers the ``training`` flags of the modules ``fn`` reaches (``self.training == True``) and
    Python constants in its closure (``n == 3``) or globals (``G['DEBUG'] == False``). Values read
    any other way (attributes of other objects, helper functions' globals) are specialised
    without a guard.
    """
    guards: list[Guard] = []
    readers: dict[str, Callable[[], Any]] = {}
    for _, prefix, read_root, root in _roots(fn):
        if isinstance(root, torch.nn.Module):
            source, reader = f"{prefix}.training", _training_reader(read_root)
        elif isinstance(root, CONSTANT_TYPES):
            source, reader = prefix, read_root
        else:
            continue
        guards.append(Guard(source, "value", reader()))
        readers[source] = reader
    return guards, readers


def _roots(fn: Callable) -> list[tuple[str, str, Callable[[], Any], Any]]:
    """Objects ``fn`` reaches directly: itself if a module, closure cells, globals it names.

    Returns ``(name, source, reader, current value)``; a global ``w`` has source ``G['w']``.
    """
    roots: list[tuple[str, str, Callable[[], Any]]] = []
    owner = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        roots.append(("self", "self", lambda: owner))
    code_owner = fn.forward if isinstance(fn, torch.nn.Module) else fn
    code = getattr(code_owner, "__code__", None)
    if code is not None:
        cells = getattr(code_owner, "__closure__", None) or ()
        roots += [(n, n, _cell_reader(cell)) for n, cell in zip(code.co_freevars, cells)]
        scope = getattr(code_owner, "__globals__", {})
        roots += [(n, f"G[{n!r}]", _global_reader(scope, n)) for n in code.co_names if n in scope]
    result = []
    for name, source, read_root in roots:
        try:
            result.append((name, source, read_root, read_root()))
        except ValueError:  # an empty closure cell
            continue
    return result


def _training_reader(read_root: Callable[[], Any]) -> Callable[[], Any]:
    """``True``/``False`` when all submodules agree, else the tuple of their flags."""

    def read() -> Any:
        flags = tuple(m.training for m in read_root().modules())
        return flags[0] if len(set(flags)) == 1 else flags

    return read


def _named_tensors(root: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(root, torch.Tensor):
        return [("", root)]
    if isinstance(root, torch.nn.Module):
        return [*root.named_parameters(), *root.named_buffers()]
    return []


def _cell_reader(cell: Any) -> Callable[[], Any]:
    return lambda: cell.cell_contents


def _global_reader(scope: dict, name: str) -> Callable[[], Any]:
    return lambda: scope[name]


def _attr_reader(read_root: Callable[[], Any], path: str) -> Callable[[], torch.Tensor]:
    def fetch() -> torch.Tensor:
        obj = read_root()
        for part in path.split(".") if path else ():
            obj = getattr(obj, part)
        return obj

    return fetch
