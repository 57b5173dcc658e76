"""Stage 4c (C++ backend): values a row reduction computes twice, kept in an array instead.

Input -> output: an ``ir.Kernel`` in the row layout (see cpp_reduction.py) -> a plan: which
sub-expressions of its r loops go into a per-row array (``float row0[rnumel]``), which loop
stores each and which loops read it back; ``cpp.py`` applies the plan as it generates the
loops. For a softmax, ``exp(a - max)`` is computed by the sum loop, stored into ``row0``, and
read back by the loop that divides it by the sum::

        float sum_buf1 = 0.0f;
        float row0[1000];
        #pragma omp simd reduction(+:sum_buf1)
        for (int64_t rindex = 0; rindex < 1000; rindex++)
        {
            ...
            float tmp3 = toycomp_expf(tmp2);
            sum_buf1 = sum_buf1 + tmp3;
            row0[rindex] = tmp3;
        }
        #pragma omp simd
        for (int64_t rindex = 0; rindex < 1000; rindex++)
        {
            float tmp4 = row0[rindex];
            ...

NB: in PyTorch this lives in torch/_inductor/codegen/cpp.py and cpp_utils.py
(``LocalBufferContext``: a buffer local to the kernel, one row per thread).
"""

from __future__ import annotations

import sympy
import torch

from toycomp.inductor import indexing, ir
from toycomp.inductor.codegen.common import compute_dtype

# [Note: a row's costly values, kept]
# A softmax kernel computes exp(a - max) twice for each element: in the loop that sums it and
# in the loop that divides it by the sum (the scheduler inlines it into both). exp costs more
# than reading a float from L1, so the row layout keeps such a value: the first r loop that
# computes it also stores it in `float row0[rnumel]`, an array on the stack of the thread
# running this x, and later r loops of the same x read it back instead of computing it: 8192 x
# 1000 softmax, 24 -> 14 ms on one core. The value is the same bits either way, so a kernel
# with the array and one without agree exactly (see [Note: vectorised libm] in cpp.py). Kept:
# the largest sub-expressions of a later r loop that an earlier r loop computes too (compared
# by structure, not identity, since the scheduler may build each loop's expressions apart), that
# depend on r and call a libm function (sums and products cost less than the store). Only with
# a static rnumel of at most ROW_BUFFER_MAX elements: the array lives on the thread's stack.
# Inductor does the same with its "local buffers" (torch/_inductor/codegen/cpp.py,
# LocalBufferContext), one row of the softmax's exp per thread.
ROW_BUFFER_MAX = 16384
COSTLY_OPS = frozenset({"exp", "log", "log1p", "sin", "cos", "tanh", "erf", "pow"})


class RowBuffers:
    """Which values a row-layout kernel keeps in row arrays: see [Note: a row's costly values,
    kept]. ``stores[i]`` / ``loads[i]``: (node, array) pairs that loop ``i`` writes / reads."""

    def __init__(self, kernel: ir.Kernel) -> None:
        self.kernel = kernel
        self.arrays: dict[int, tuple[str, torch.dtype]] = {}  # structure key -> array
        self.stores: dict[int, list[tuple[ir.Expr, str]]] = {}
        self.loads: dict[int, list[tuple[ir.Expr, str]]] = {}
        self.loop = 0  # the loop that code generation is at
        if indexing.is_static(kernel.rnumel) and 1 < kernel.rnumel <= ROW_BUFFER_MAX:
            if not indexing.known_equal(kernel.numel, 1):
                self._plan(_StructureKeys())

    def _plan(self, keys: "_StructureKeys") -> None:
        earlier: dict[int, tuple[int, ir.Expr]] = {}  # costly values of earlier r loops
        for i, loop in enumerate(self.kernel.loops):
            if not loop.over_r:
                continue
            computed = []
            values = [s.value for s in loop.body]
            for node in _top_down(*values, stop=lambda n: keys(n) in earlier):
                key = keys(node)
                if key in earlier:
                    name = self._array(key, node)
                    j, first = earlier[key]
                    if (first, name) not in self.stores.get(j, []):
                        self.stores.setdefault(j, []).append((first, name))
                    self.loads.setdefault(i, []).append((node, name))
                elif keys.costly(node):
                    computed.append((key, node))
            for key, node in computed:
                earlier.setdefault(key, (i, node))

    def _array(self, key: int, node: ir.Expr) -> str:
        if key not in self.arrays:
            self.arrays[key] = (f"row{len(self.arrays)}", compute_dtype(node.dtype))
        return self.arrays[key][0]

    def before_loop(self, cg) -> None:
        """The next loop (the kernel's loops come in turn) reads its kept values from their
        arrays instead of computing them."""
        for node, name in self.loads.get(self.loop, []):
            r = cg.print_index(indexing.r)  # rindex, or P*r0 + r1 over planes
            value = cg.cse.generate(cg.loads, f"{name}[{r}]", node.dtype)
            cg.generated[id(node)] = (node, value)

    def after_loop(self, cg) -> None:
        """That loop stores the values it keeps, into arrays declared just before it."""
        dtypes = dict(self.arrays.values())
        for node, name in self.stores.get(self.loop, []):
            cg.prefix.writeline(f"{cg.ctype(dtypes[name])} {name}[{self.kernel.rnumel}];")
            r = cg.print_index(indexing.r)  # rindex, or P*r0 + r1 over planes
            cg.stores.writeline(f"{name}[{r}] = {cg.generated[id(node)][1]};")
        self.loop += 1


class _StructureKeys:
    """One number per distinct expression structure (hash-consing), and which are costly: an
    Op that depends on r and calls a libm function somewhere below it."""

    def __init__(self) -> None:
        self.table: dict[tuple, int] = {}
        self.memo: dict[int, tuple[ir.Expr, int, bool, bool]] = {}  # id -> node, key, r, libm

    def __call__(self, node: ir.Expr) -> int:
        return self._info(node)[1]

    def costly(self, node: ir.Expr) -> bool:
        _, _, on_r, libm = self._info(node)
        return isinstance(node, ir.Op) and on_r and libm

    def _info(self, node: ir.Expr) -> tuple[ir.Expr, int, bool, bool]:
        if id(node) not in self.memo:
            for n in ir.post_order(node):
                if id(n) not in self.memo:
                    self.memo[id(n)] = (n, *self._describe(n))
        return self.memo[id(node)]

    def _describe(self, n: ir.Expr) -> tuple[int, bool, bool]:
        if isinstance(n, ir.Op):
            args = [self.memo[id(a)] for a in n.args]
            shape = ("op", n.name, n.dtype, *(a[1] for a in args))
            on_r = any(a[2] for a in args)
            libm = n.name in COSTLY_OPS or any(a[3] for a in args)
        else:
            shape = (type(n).__name__, repr(n), getattr(n, "dtype", None))
            index = getattr(n, "index", None)
            on_r = index is not None and indexing.r in sympy.sympify(index).free_symbols
            libm = False
        return self.table.setdefault(shape, len(self.table)), on_r, libm


def _top_down(*exprs: ir.Expr, stop) -> list[ir.Expr]:
    """The nodes of ``exprs`` parents first, not descending below a node where ``stop``."""
    seen: set[int] = set()
    order, stack = [], list(reversed(exprs))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        if isinstance(node, ir.Op) and not stop(node):
            stack.extend(reversed(node.args))
    return order
