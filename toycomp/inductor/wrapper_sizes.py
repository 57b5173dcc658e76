"""Stage 4e, sizes in the wrapper: symbolic sizes -> the Python that reads and prints them.

Input -> output: a ``ScheduledGraph``'s inputs and size expressions -> the wrapper's source
text for them. With dynamic shapes the wrapper reads each size symbol from an input once
(``s0 = primals_1.size(0)``) and every check, allocation and launch uses it::

    >>> import sympy, torch
    >>> from toycomp.inductor import ir
    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> symbol_sources([ir.InputBuffer("a", (s0, 16), (16, 1), torch.float32)])
    {s0: 'a.size(0)'}
    >>> render_tuple((4 * s0, 3)), render_tuple((8, 16))
    ('(4*s0, 3)', '(8, 16)')

NB: in PyTorch this lives in torch/_inductor/codegen/wrapper.py (``codegen_input_size_var_decl``,
``codegen_shape_tuple``).
"""

from __future__ import annotations

import sympy

from toycomp.inductor import indexing, ir
from toycomp.inductor.codegen.common import IndexPrinter


# [Note: sizes at call time]
# With dynamic shapes the wrapper is the one place that learns the sizes: it reads each size
# symbol from the first input that has it as a size, a stride or a value (``s0 =
# primals_3.size(0)``, or ``s0 = primals_1`` for a SymInt input), then every check, allocation,
# view and kernel call computes with ``s0``. A symbol that appears twice (two dims that share
# it) is read once and checked by ``check_input`` on the other: a call that breaks the relation
# is an error, never a wrong index (the caller's shape guards normally recompile first).
def symbol_sources(inputs) -> dict[sympy.Symbol, str]:
    """Each size symbol of ``inputs`` -> Python source reading it from the call's arguments."""
    parts = [(b.expr,) if isinstance(b, ir.SizeInput) else (*b.size, *b.stride) for b in inputs]
    needed = indexing.size_symbols(*parts)
    return _read_symbols(inputs, needed) if needed else {}  # dynamic shapes


def _read_symbols(inputs, needed: list[sympy.Symbol]) -> dict[sympy.Symbol, str]:
    sources: dict[sympy.Symbol, str] = {}
    for b in inputs:
        if isinstance(b, ir.SizeInput) and isinstance(b.expr, sympy.Symbol):
            sources.setdefault(b.expr, b.name)
    for what in ("size", "stride"):
        for b in inputs:
            for dim, value in enumerate(getattr(b, what, ())):
                if isinstance(value, sympy.Symbol):
                    sources.setdefault(value, f"{b.name}.{what}({dim})")
    missing = [s for s in needed if s not in sources]
    if missing:
        raise NotImplementedError(f"toycomp wrapper: no input gives the size {missing[0]} alone")
    return dict(sorted(sources.items(), key=lambda item: (item[0].name[0], int(item[0].name[1:]))))


def scalars_used(graph: ir.ScheduledGraph) -> set[sympy.Symbol]:
    """The symbols that kernels, extern calls or outputs of ``graph`` read."""
    parts: list = [o for o in graph.outputs if not isinstance(o, ir.TensorArg)]
    for step in graph.steps:
        if isinstance(step, ir.Kernel):
            parts += step.size_symbols()
        else:
            parts += [step.size, step.stride, *_flat_args((step.args, step.kwargs))]
    return set(indexing.size_symbols(*[p for p in parts if p is not None]))


def _flat_args(value) -> list:
    if isinstance(value, ir.TensorArg):
        return [value.size, value.stride, value.offset]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat_args(v)]
    return [value] if isinstance(value, sympy.Basic) else []


def render_size(value) -> str:
    """A size as Python source: ``8``, ``s0``, ``4*s0``."""
    return str(value) if indexing.is_static(value) else IndexPrinter().doprint(value)


def render_tuple(values) -> str:
    """A tuple of sizes as Python source: ``(8, 16)``, ``(s0,)``, ``(4*s0, 3)``."""
    if all(indexing.is_static(v) for v in values):
        return repr(tuple(int(v) for v in values))
    items = [render_size(v) for v in values]
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
