"""Stage 4c (C++ backend): which loop order each part of a reduction kernel gets.

Input -> output: an ``ir.Kernel`` -> the same kernel with its sibling r loops merged
(``merge_reduction_loops``), split into a row part and a column part where it mixes both
(``split_by_layout``), and for each part the layout ``cpp_reduction.py`` generates: row (r the
inner, vectorised loop) or column (a tile of outputs inside, r outside); and the planes that a
pointwise kernel's x loop or a row reduction's r loops split into (``pointwise_plane``,
``reduction_plane``, ``plane_index``, ``plane_loops``). ``x.sum(0)`` reads
``load(a, 48*r + x)``: stride 1 in x, 48 in r, so a column::

    >>> import torch, toycomp
    >>> graph = toycomp.explain(lambda a: a.sum(0), torch.randn(64, 48)).graph("forward")
    >>> kernel = graph.scheduled.steps[0]
    >>> kernel.loops[0]
    for r:
      sum_buf0 = sum(load(primals_1, 48*r + x))
    >>> use_column_layout(kernel)
    True

NB: in PyTorch the choice lives in torch/_inductor/codegen/cpp.py (``CppKernelProxy``: the
tiling and vectorisation of the loop nest, chosen from the strides of the loads and stores).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import sympy

from toycomp.inductor import indexing, ir
from toycomp.inductor.codegen.common import IndentedBuffer

# [Note: one pass for sibling reductions]
# The scheduler stores a reduction's result right after its loop, so a kernel computing two
# sums that are both stored (LayerNorm's weight and bias gradients: sum(grad * xhat) and
# sum(grad) over the batch) comes as `for r: reduce A; once: store A; for r: reduce B; once:
# store B`, and reads `grad` twice. The store of A only writes memory that no loop of the kernel
# reads, so it may run after B's loop; then the two r loops are adjacent and, when B does not
# read A's result (which is only known after A's loop), they are one loop: one pass over
# `grad`. `merge_reduction_loops` does that before code generation, for both layouts.


def merge_reduction_loops(kernel: ir.Kernel) -> ir.Kernel:
    """``kernel`` with sibling r loops merged (see [Note: one pass for sibling reductions])."""
    loops = list(kernel.loops)
    i = 0
    while i + 2 < len(loops):
        first, stores, second = loops[i : i + 3]
        movable = not stores.over_r and all(isinstance(s, ir.Store) for s in stores.body)
        if first.over_r and second.over_r and movable and not _reads_locals_of(second, first):
            loops[i : i + 3] = [ir.Loop(True, first.body + second.body), stores]
        else:
            i += 1
    if len(loops) == len(kernel.loops):
        return kernel
    return dataclasses.replace(kernel, loops=_merge_adjacent_stores(loops))


def _reads_locals_of(loop: ir.Loop, earlier: ir.Loop) -> bool:
    reduced = {s.name for s in earlier.body if isinstance(s, ir.Reduce)}
    values = [s.value for s in loop.body]
    return any(isinstance(e, ir.Local) and e.name in reduced for e in ir.walk(*values))


def _merge_adjacent_stores(loops: list[ir.Loop]) -> tuple[ir.Loop, ...]:
    """Two adjacent once-per-x loops of stores are one loop."""
    merged: list[ir.Loop] = []
    for loop in loops:
        if merged and not loop.over_r and not merged[-1].over_r:
            merged[-1] = ir.Loop(False, merged[-1].body + loop.body)
        else:
            merged.append(loop)
    return tuple(merged)


# --- choosing the layout -----------------------------------------------------------------------
def use_column_layout(kernel: ir.Kernel) -> bool:
    """True when ``kernel`` reduces (or stores) over columns: see [Note: row and column
    reductions] in cpp_reduction.py."""
    if indexing.known_equal(kernel.numel, 1) or indexing.known_equal(kernel.rnumel, 1):
        return False
    if not all(independent_iterations(loop) for loop in kernel.loops):
        return False
    r_statements = [s for loop in kernel.loops if loop.over_r for s in loop.body]
    return _reads_columns(r_statements, reduction_plane(kernel))


def _reads_columns(statements: list[ir.Store | ir.Reduce], rplane: int | None) -> bool:
    """More of the indices that ``statements`` (of r loops) load and store have stride 1 in x
    than in r (in r1 when the row layout would split r into planes of ``rplane``: see [Note:
    reductions over planes]); those depending on x or r only (broadcasts) are cheap either
    way, not counted."""
    indices = {}
    for stmt in statements:
        if isinstance(stmt, ir.Store):
            indices[stmt.index] = None
        indices.update((e.index, None) for e in ir.walk(stmt.value) if isinstance(e, ir.Load))
    x_contiguous = r_contiguous = 0
    for index in indices:
        x_stride, r_stride = _stride(index, indexing.x), _stride(index, indexing.r)
        if rplane is not None:
            r_stride = _stride(plane_index(index, rplane, indexing.r), R1)
        if x_stride == 0 or r_stride == 0:
            continue
        x_contiguous += x_stride == 1
        r_contiguous += r_stride == 1
    return x_contiguous > r_contiguous


# [Note: a kernel of rows and columns]
# With a square matrix, a row reduction and a column reduction have the same (numel, rnumel),
# and the scheduler may fuse them: LayerNorm's backward at 4096 x 4096 is one kernel computing
# the row sums for grad_x AND the column sums for the weight and bias gradients, reading
# `tangents` at `r + 4096*x` and at `4096*r + x`. No single loop order reads both well (one
# layout walks the other's reads down columns: 200 ms instead of 20). But the two halves share
# nothing except their inputs: no statement of one reads a Local of the other. So code
# generation splits such a kernel: statements are grouped by the Locals they read (a Reduce and
# everything that uses its result stay together), each group votes row or column by its own
# reads, and when the votes differ the kernel becomes two parts, one per layout, two static
# functions that the kernel's function calls one after the other. (Inductor would not fuse
# them: it compares memory dependencies, and these are reads at different indices.)
def split_by_layout(kernel: ir.Kernel) -> list[ir.Kernel]:
    """``[kernel]``, or its row part and its column part (see [Note: a kernel of rows and
    columns]), each a kernel of its own named ``<name>_rows`` / ``<name>_columns``."""
    if indexing.known_equal(kernel.numel, 1) or indexing.known_equal(kernel.rnumel, 1):
        return [kernel]
    statements = [(loop.over_r, s) for loop in kernel.loops for s in loop.body]
    groups = _statement_groups([s for _, s in statements])
    columns: set[int] = set()
    rplane = reduction_plane(kernel)
    for group in groups:
        if _reads_columns([statements[i][1] for i in group if statements[i][0]], rplane):
            columns.update(group)
    if not columns or len(columns) == len(statements):
        return [kernel]
    parts = []
    for suffix, keep in (("rows", False), ("columns", True)):
        chosen = {id(s) for i, (_, s) in enumerate(statements) if (i in columns) == keep}
        loops = [ir.Loop(loop.over_r, tuple(s for s in loop.body if id(s) in chosen))
                 for loop in kernel.loops]  # fmt: skip
        loops = tuple(loop for loop in loops if loop.body)
        part = dataclasses.replace(kernel, name=f"{kernel.name}_{suffix}", loops=loops)
        parts.append(merge_reduction_loops(part))
    return parts


def _statement_groups(statements: list[ir.Store | ir.Reduce]) -> list[list[int]]:
    """The statements (by position) grouped: a Reduce with every statement reading its Local."""
    parent = list(range(len(statements)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    producer = {s.name: i for i, s in enumerate(statements) if isinstance(s, ir.Reduce)}
    for i, stmt in enumerate(statements):
        for e in ir.walk(stmt.value):
            if isinstance(e, ir.Local) and e.name in producer:
                parent[root(i)] = root(producer[e.name])
    groups: dict[int, list[int]] = {}
    for i in range(len(statements)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def _stride(index: sympy.Expr, var: sympy.Symbol) -> sympy.Expr | None:
    """How far ``index`` moves when ``var`` grows by one: a number or a size expression, or
    None when that depends on where it starts (a ``FloorDiv``, a modulo)."""
    step = sympy.expand(sympy.sympify(index).subs(var, var + 1) - index)
    return None if step.free_symbols & {indexing.x, indexing.r, R0, R1} else step


def independent_iterations(loop: ir.Loop) -> bool:
    """No buffer is both stored and loaded at another index in ``loop``: ``omp simd`` is safe."""
    if any(isinstance(s, ir.Store) and (s.indirect or s.accumulate) for s in loop.body):
        return False  # a scatter: two iterations may write one element
    stores = {(s.buffer, s.index) for s in loop.body if isinstance(s, ir.Store)}
    stored = {buffer for buffer, _ in stores}
    for e in ir.walk(*(stmt.value for stmt in loop.body)):
        if isinstance(e, ir.Load) and e.buffer in stored and (e.buffer, e.index) not in stores:
            return False
    return True


# [Note: pointwise kernels over planes]
# A pointwise kernel is one flat loop over x. When it broadcasts a per-channel value over the
# planes of an (N, C, H, W) tensor (a BatchNorm, a bias), that value is read at ``x // (H*W)
# - C*(x // (C*H*W))``: two 64-bit divisions and a gather for every element, every vector lane
# a different address, and the per-channel arithmetic (BatchNorm's 1/sqrt(var + eps)) redone
# for each element; a MobileNet-v2 BatchNorm + ReLU6 ran 5x slower than eager's. When every
# division of x in the kernel's indices is by a multiple of one extent P (here H*W), the loop
# splits into ``for x0 < numel/P: for x1 < P`` with ``x = P*x0 + x1``: each ``x // d`` becomes
# ``x0 // (d/P)``, which the inner loop does not change, so the compiler reads those values
# (and computes what depends only on them) once per plane, and the inner loop runs over
# contiguous memory, vectorised. Inductor's C++ backend tiles its loop nests the same way.
PLANE_MIN = 8  # a plane smaller than a vector is not worth a loop of its own
R0, R1 = indexing.index_vars("r", 2)  # r = P*r0 + r1 (and x = P*x0 + x1) over planes
PARALLEL_PLANES_MIN = 64  # planes that a one-row kernel needs to share them between cores


def pointwise_plane(kernel: ir.Kernel) -> int | None:
    """The extent P of the inner loop that [Note: pointwise kernels over planes] splits a
    pointwise kernel's x loop into, or None to keep one flat loop."""
    if any(loop.over_r for loop in kernel.loops) or not isinstance(kernel.numel, int):
        return None
    return _plane(_indices(kernel), indexing.x, kernel.numel)


# [Note: reductions over planes]
# A BatchNorm's backward sums over (N, H, W) for each channel: a row reduction whose r index
# reads ``r + H*W*x + (C-1)*H*W*(r // (H*W))``, one 64-bit division per element in the
# vectorised r loop: 18 ms of a MobileNet-v2 training step on 2 images (one core of this
# CPU) for one 96-channel sum at 112 x 112, and 83 ms for the 52 such kernels of the step.
# The rule of [Note: pointwise kernels over planes] applies to r as it does to x: when every
# division of r in the kernel's indices is by a multiple of one extent P (at least PLANE_MIN),
# each r loop of the row layout becomes ``for r0 < rnumel/P: for r1 < P`` with ``r = P*r0 +
# r1`` and ``r // d`` written ``r0 // (d/P)``: the index above is ``C*H*W*r0 + r1 + H*W*x``,
# contiguous in r1, no division left (that kernel 2.3 ms, the 52 of them 10 ms).
# The inner loop keeps the r loop's ``omp simd`` and its reduction clauses: it folds its
# vector lanes into the accumulators after each plane, which changes only the order a float
# sum is added in (in blocks of P, as [Note: summing in blocks] does on purpose). A kernel of
# one row (numel 1: a whole-tensor sum, r on all cores) shares out the planes, ``omp parallel
# for`` over r0 with the same reduction clauses, when there are at least PARALLEL_PLANES_MIN
# of them (fewer would leave cores idle); else its r loop stays flat.
# The layout vote ([Note: row and column reductions]) then counts r's stride as r1's: ``r +
# 49*x + 62671*(r // 49)`` has no stride in r (a step of r moves it by 1 or by 62672), but
# stride 1 in r1. Without that, MobileNet-v2's last BatchNorm backward (1280 channels of
# 7 x 7) voted column on the strength of one broadcast read (the pooled gradient, stride 1 in
# x), and gathered its two large reads at a stride of 49 floats.
def reduction_plane(kernel: ir.Kernel) -> int | None:
    """The extent P of the inner loop that [Note: reductions over planes] splits a row
    reduction's r loops into, or None to keep them flat."""
    if not any(loop.over_r for loop in kernel.loops) or not isinstance(kernel.rnumel, int):
        return None
    plane = _plane(_indices(kernel), indexing.r, kernel.rnumel)
    one_row = indexing.known_equal(kernel.numel, 1)
    if plane and one_row and kernel.rnumel // plane < PARALLEL_PLANES_MIN:
        return None  # too few planes to share between cores
    return plane


def _indices(kernel: ir.Kernel) -> list[sympy.Expr]:
    """Every index that ``kernel`` stores at, loads from or computes with."""
    indices = [s.index for loop in kernel.loops for s in loop.body if isinstance(s, ir.Store)]
    values = [s.value for loop in kernel.loops for s in loop.body]
    indices += [e.index for e in ir.walk(*values) if isinstance(e, (ir.Load, ir.IndexValue))]
    return [sympy.sympify(index) for index in indices]


def _plane(indices: list[sympy.Expr], var: sympy.Symbol, numel: int) -> int | None:
    """The gcd P of the divisors d of every ``var // d`` in ``indices``, when it is at least
    PLANE_MIN and divides ``numel`` into two planes or more; None when ``var`` appears inside
    anything else (a division of a sum, a ``Min``) or there is no such P."""
    divisors = set()
    for index in indices:
        for f in index.atoms(sympy.Function):
            if var not in f.free_symbols:
                continue
            if not isinstance(f, indexing.FloorDiv) or f.args[0] != var:
                return None  # var inside anything but ``var // d``: keep the flat loop
            if not f.args[1].is_Integer:
                return None
            divisors.add(int(f.args[1]))
    plane = math.gcd(*divisors) if divisors else 0
    if plane < PLANE_MIN or numel % plane or numel // plane < 2:
        return None
    return plane


@functools.lru_cache(maxsize=4096)  # (pure: each load and store of a kernel asks, often alike)
def plane_index(index: sympy.Expr, plane: int, var: sympy.Symbol = indexing.x) -> sympy.Expr:
    """``index`` over ``x0`` (the plane) and ``x1`` (within it), where ``x = plane*x0 + x1``;
    over ``r0`` and ``r1`` for ``var`` r."""
    outer, inner = indexing.index_vars(var.name, 2)
    index = index.replace(
        lambda e: isinstance(e, indexing.FloorDiv) and e.args[0] == var,
        lambda e: indexing.FloorDiv(outer, e.args[1] // plane),
    )
    return sympy.expand(index.subs(var, plane * outer + inner))


def plane_loops(var: str, numel: int, plane: int, body: IndentedBuffer,
                outer: str | None, inner: str | None) -> IndentedBuffer:  # fmt: skip
    """``for (var0 < numel/plane) for (var1 < plane) {body}``, each loop after its pragma
    (``outer``, ``inner``: a whole ``#pragma omp ...`` line, or None for none)."""
    code = IndentedBuffer()
    if outer is not None:
        code.writeline(outer)
    code.writeline(f"for (int64_t {var}0 = 0; {var}0 < {numel // plane}; {var}0++)")
    code.writeline("{")
    with code.indent():
        if inner is not None:
            code.writeline(inner)
        code.writeline(f"for (int64_t {var}1 = 0; {var}1 < {plane}; {var}1++)")
        code.writeline("{")
        with code.indent():
            code.splice(body)
        code.writeline("}")
    code.writeline("}")
    return code
