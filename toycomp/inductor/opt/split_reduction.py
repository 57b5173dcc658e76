"""Stage 4b': split reductions, ``ir.LoweredGraph`` -> ``ir.LoweredGraph`` (Triton backend).

Input -> output: the lowered buffers -> the same buffers, where a reduction with few outputs
and a long reduced range is replaced by two: a *partial* reduction over chunks of the range
(``splits`` partial results per output, its body still the producers' fused pointwise work)
and a small *finishing* reduction over the partials. A column sum of a 4096 x 4096 matrix
becomes 16 partial sums of 256 rows each, then their sum::

    >>> (i0,), (r0,) = indexing.index_vars("i", 1), indexing.index_vars("r", 1)
    >>> body = ir.Load("a", i0 + 4096 * r0, torch.float32)
    >>> column_sum = ir.Reduction("buf0", (4096,), (4096,), ir.ReductionType.SUM, torch.float32,
    ...                           body)
    >>> column_sum
    buf0[4096] = sum[r<[4096]](load(a, i0 + 4096*r0))
    >>> num_splits(column_sum)  # split reduced dim 0 in 16; the loads are contiguous along i0
    (0, 16, <ReductionHint.OUTER: 'outer'>)
    >>> for node in split_reduction(column_sum, 0, 16, ReductionHint.OUTER):
    ...     print(node)
    buf0_split[16, 4096] = sum[r<[256]](load(a, 1048576*i0 + i1 + 4096*r0))
    buf0[4096] = sum[r<[16]](load(buf0_split, i0 + 4096*r0))

Without an exact divisor (a prime or a symbolic number of rows) the chunks are ragged: the
last one's rows past the end are clamped and dropped (see [Note: ragged splits]).

``reduction_hint`` (used here and by triton_heuristics.py to shape the tile) says whether a
reduction reads memory contiguously along its reduced range (INNER: row sums) or along its
outputs (OUTER: column sums).

NB: in PyTorch this lives in torch/_inductor/ir.py (``Reduction.num_splits``,
``Reduction.create_multilayer``, ``ReductionHint``) and torch/_inductor/choices.py
(``reduction_split_factor``).
"""

from __future__ import annotations

import dataclasses
from enum import Enum

import sympy
import torch

import toycomp.config as config
import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.inductor.scheduler import buffer_reads
from toycomp.inductor.sizevars import SizeVars
from toycomp.symbolic_shapes import hint as example_value

# [Note: split reductions]
# A GPU is filled by many programs: an H100 has 132 SMs, each running several programs at once.
# A reduction kernel runs one program per XBLOCK outputs, so a reduction with few outputs and
# a long range leaves the GPU nearly empty: the bias gradient of a GPT layer sums 16384 rows
# into 384 columns, which is 6 programs of 64 columns (or 384 of one column), each walking
# 16384 rows alone. Splitting the range into `splits` chunks gives splits times more programs:
#   partial[s, i] = reduce over the chunk s of the range   (splits * numel outputs: many programs)
#   out[i]        = reduce over s of partial[s, i]         (a small kernel: splits * numel reads)
# The partial keeps the reduction's body, so the pointwise work feeding it (grad * xhat for
# LayerNorm's weight gradient) stays fused into the big kernel; only the partials, `splits`
# times smaller than the input, go through memory. The partials are fp32 for fp16/bf16
# results, as the one-kernel reduction accumulates (so splitting loses no precision).
# Which reductions: sum, amax and amin (the IR's three kinds), whose result does not depend on
# how the range is grouped: max/min are exact in any order (NaN propagates through both
# levels); integer sums are exact; a float sum changes its rounding, as eager's own tree
# reduction does (within fp32 tolerance). An order-sensitive reduction (argmax's first index,
# a scan) would need its index carried along; the IR has none, so none is split.
# When not to split: bool results, and reductions with enough programs already. Chunks are
# exact when a divisor of a reduced dim is near the wanted split count (static sizes: the
# fastest kernel, no test per element); otherwise they are ragged, see [Note: ragged splits].
# How many: about TARGET_PROGRAMS programs for the partial kernel (a few per SM, like
# Inductor's reduction_split_factor), each reducing at least MIN_CHUNK_{INNER,OUTER} elements.
# Measured on an H100 (torch.profiler kernel times): the 4096 x 4096 column sum took 133 us as
# one kernel of one column per program; split in 16 with the [64, 8] tile, 23.7 + 1.4 us
# (Inductor 24.2 + 2.4, eager 32 us). Targets of 512-4096 programs and chunks of 64-256 rows
# were within a few percent of these choices; 256 programs was up to 3x slower.
#
# [Note: ragged splits]
# A prime number of rows (1031), or a symbolic one (s0: one kernel for every batch size), has
# no exact chunks. Then chunk = ceil(R / splits), FloorDiv(s0 + S - 1, S), and the partial's
# row s*chunk + r may run past R in the last chunk. Our loads are masked only by xmask and
# rmask (Inductor would mask the load itself), so every load index gets its row clamped,
# Min(row, R - 1): always in bounds, and the body becomes where(row < R, body, identity), so
# the clamped duplicates of row R - 1 count as 0 in a sum and -inf/+inf in amax/amin (a NaN
# of a real row still propagates; an int sum stays exact). `splits` stays a compile-time
# number: with symbolic sizes it is chosen from the sizes' example values (`size_hints`, as
# Inductor's size hints), or SIZE_GUESS for a symbol without one; every later size is still
# correct (a batch of 2 gives chunks of 1 row and some empty ones), only the speed is tuned
# for the example. The indices hold Min: Triton prints tl.minimum, C++ std::min (common.py),
# and index_bounds bounds Min(row, s0 - 1) by s0 - 1 (32-bit indices stay possible). The
# reduction hint reads through the clamp (`_unclamped`). Measured on an H100 (summed kernel
# time, benchmarks/dynamic_shapes.py, one run), dynamic / static: 1.04 for the 4096 x 4096
# column sum, 0.95 for layer_norm w,b fwd+bwd, 1.00 for the MLP 1024-4096-1024 step (batch /
# static: 1.00, 0.98, 1.00); unsplit they were 4.6, 4.2 and 1.13. With SIZE_GUESS for every
# symbol instead of the hints the column sum took 8 splits, not 16: 1.11.
TARGET_PROGRAMS = 1024
OUTER_XBLOCK = 64  # outputs per program of an outer reduction (triton_heuristics uses it)
MIN_CHUNK_OUTER = 128  # rows per partial of a column sum: 16 steps of an 8-row tile
MIN_CHUNK_INNER = 4096  # elements per partial of a row sum: 4 steps of a 1024-wide tile
INNER_MIN_RNUMEL = 8192  # an inner reduction shorter than this stays one kernel (Inductor's)
SIZE_GUESS = 8192  # what a size symbol is taken to be (Inductor's unbacked_symint_fallback)


class ReductionHint(Enum):
    """Along which axis a reduction's loads are contiguous (PyTorch: ``ir.ReductionHint``)."""

    INNER = "inner"  # along the reduced range: a row sum, each output reads a contiguous row
    OUTER = "outer"  # along the outputs: a column sum, neighbouring outputs read neighbours


# [Note: outer reductions]
# `x.sum(0)` on a row-major matrix reads column j for output j: element (r, j) at r*ncols + j.
# One output per program walking its column reads one float per 4096-byte row: every load a
# separate memory transaction (uncoalesced), and 16x-32x slower than the memory allows. The
# fix is the tile's shape: a program takes XBLOCK neighbouring columns and RBLOCK rows at once
# ([XBLOCK, RBLOCK] = [64, 8]), so each row of the tile is 64 consecutive floats (coalesced),
# and it loops over the rows accumulating 64 partial sums. The hint comes from the loads'
# strides: a load whose index moves by 1 along the outputs and not along the range votes
# OUTER; by 1 along the range, INNER (Inductor's rule in ``Reduction.num_splits``). Loads that
# do not depend on both (a per-row mean, a per-column weight) do not vote.
def reduction_hint(indices, xvar: sympy.Symbol, rvar: sympy.Symbol) -> ReductionHint:
    """OUTER when most ``indices`` that use both ``xvar`` (innermost output variable) and
    ``rvar`` (innermost reduced variable) move by other than 1 along ``rvar``, else INNER."""
    inner = outer = 0
    for index in indices:
        index = sympy.sympify(index)
        if not {xvar, rvar} <= index.free_symbols:
            continue
        if _stride(index, rvar) == 1:
            inner += 1
        else:
            outer += 1
    return ReductionHint.OUTER if outer > inner else ReductionHint.INNER


def _stride(index: sympy.Expr, var: sympy.Symbol):
    """How far ``index`` moves when ``var`` goes from 0 to 1, every other variable at 0 (a
    ragged split's clamped row ``Min(row, s0 - 1)`` counts as ``row``)."""
    index = index.replace(lambda e: isinstance(e, sympy.Min), _unclamped)
    zero = {v: 0 for v in index.free_symbols if not indexing.is_size_symbol(v)}
    return sympy.expand(index.subs({**zero, var: 1}) - index.subs(zero))


def _unclamped(clamp: sympy.Min) -> sympy.Expr:
    """The argument of ``clamp`` that moves with the loop variables, if only one does."""
    moving = [a for a in clamp.args if not all(map(indexing.is_size_symbol, a.free_symbols))]
    return moving[0] if len(moving) == 1 else clamp


def node_hint(node: ir.Reduction) -> ReductionHint:
    """The hint of a lowered reduction, from the loads of its body."""
    ivars = indexing.index_vars("i", len(node.size))
    rvars = indexing.index_vars("r", len(node.reduction_size))
    if not ivars:
        return ReductionHint.INNER  # one output: nothing to be contiguous along
    loads = [e.index for e in ir.walk(node.body) if isinstance(e, ir.Load)]
    return reduction_hint(loads, ivars[-1], rvars[-1])


def split_reductions(
    lowered: ir.LoweredGraph, backend: str, hints: dict | None = None
) -> ir.LoweredGraph:
    """Split the reductions of ``lowered`` that leave a GPU idle (see [Note: split
    reductions]; ``toycomp.config.split_reductions``), and mix-order reductions
    (``config.triton.mix_order_reduction``); only for ``backend == "triton"`` (the C++ backend
    parallelises its own way).
    ``hints``: the example value of each size symbol (``size_hints``), to choose ``splits``.
    """
    if backend != "triton":
        return lowered
    mix_order, split = config.triton.mix_order_reduction, config.split_reductions
    nodes: list = []
    for node in lowered.nodes:
        is_reduction = isinstance(node, ir.Reduction)
        rows = mix_order_rows(node, lowered) if mix_order and is_reduction else 0
        if rows:
            nodes.extend(mix_order_split(node, rows))
            continue
        plan = num_splits(node, hints) if split and is_reduction else None
        nodes.extend(split_reduction(node, *plan) if plan else [node])
    if len(nodes) == len(lowered.nodes):
        return lowered
    return dataclasses.replace(lowered, nodes=tuple(_partials_after_their_rows(nodes)))


def num_splits(
    node: ir.Reduction, hints: dict | None = None
) -> tuple[int, int, ReductionHint] | None:
    """``(dim, splits, hint)``: split reduced dim ``dim`` into ``splits`` chunks; None: don't.
    A size symbol counts as its value in ``hints``, else as ``SIZE_GUESS``."""
    if node.dtype == torch.bool:
        return None
    guess = lambda size: _guess(size, hints or {})  # noqa: E731
    numel, rnumel = (guess(indexing.numel(s)) for s in (node.size, node.reduction_size))
    if numel == 0 or rnumel == 0:
        return None  # nothing to spread (an empty sum is a constant already, in lowering)
    hint = node_hint(node)
    if hint == ReductionHint.OUTER:
        programs, min_chunk = -(-numel // OUTER_XBLOCK), MIN_CHUNK_OUTER
    else:
        programs, min_chunk = numel, MIN_CHUNK_INNER
        if rnumel < INNER_MIN_RNUMEL:
            return None
    if 2 * programs > TARGET_PROGRAMS:
        return None  # enough programs already
    wanted = min(TARGET_PROGRAMS // programs, rnumel // min_chunk)
    best = None  # (how far from wanted, dim, splits): exact chunks, when a divisor is near
    for dim, size in enumerate(node.reduction_size):
        for splits in sympy.divisors(size) if indexing.is_static(size) else ():
            if wanted // 4 <= splits <= wanted and splits >= 2:
                candidate = (wanted / splits, dim, splits)
                best = min(best, candidate) if best else candidate
    if best:
        return best[1], best[2], hint
    sizes = [guess(n) for n in node.reduction_size]
    dim = sizes.index(max(sizes))  # ragged chunks of the longest dim (the outermost of ties)
    splits = min(wanted, sizes[dim])
    return (dim, splits, hint) if splits >= 2 else None


def _guess(size, hints: dict) -> int:
    """``size`` with each size symbol taken as its hint, or ``SIZE_GUESS``."""
    size = sympy.sympify(size)
    return int(size.subs({s: hints.get(s, SIZE_GUESS) for s in size.free_symbols}))


def size_hints(example_inputs: list) -> dict[sympy.Symbol, int]:
    """``{s0: 1024, ...}``: the example value of each size symbol that is a size of one of
    ``example_inputs`` (fake tensors with SymInt sizes, SymInts), as Inductor's size hints."""
    sizes, hints = SizeVars(example_inputs), {}
    for value in example_inputs:
        for n in value.shape if isinstance(value, torch.Tensor) else (value,):
            if isinstance(n, torch.SymInt):
                symbol = sizes.expr(n)
                if isinstance(symbol, sympy.Symbol):
                    hints[symbol] = int(example_value(n))
    return hints


def split_reduction(
    node: ir.Reduction, dim: int, splits: int, hint: ReductionHint
) -> list[ir.Reduction]:
    """``node`` as a partial reduction over chunks of reduced dim ``dim`` and a finishing
    reduction over the ``splits`` partials (Inductor: ``create_multilayer``). The chunks are
    ``ceil(size / splits)`` long; unless that divides exactly, rows past the end are clamped
    and dropped (see [Note: ragged splits])."""
    rows = node.reduction_size[dim]
    exact = indexing.is_static(rows) and rows % splits == 0
    chunk = sympy.sympify(rows // splits if exact else indexing.FloorDiv(rows + splits - 1, splits))
    chunk = int(chunk) if chunk.is_Integer else chunk
    n = len(node.size)
    ivars = indexing.index_vars("i", n + 1)
    rvars = indexing.index_vars("r", len(node.reduction_size))
    # OUTER: the split index is the partial's outermost dim, so the output dims stay innermost
    # and contiguous (the partial kernel is an outer reduction too); INNER: its innermost.
    if hint == ReductionHint.OUTER:
        split_var, out_vars, size = ivars[0], ivars[1:], (splits, *node.size)
    else:
        split_var, out_vars, size = ivars[n], ivars[:n], (*node.size, splits)
    mapping = dict(zip(indexing.index_vars("i", n), out_vars))
    row = split_var * chunk + rvars[dim]
    mapping[rvars[dim]] = row if exact else sympy.Min(row, rows - 1)
    rsize = node.reduction_size[:dim] + (chunk,) + node.reduction_size[dim + 1 :]
    dtype = torch.float32 if node.dtype in (torch.float16, torch.bfloat16) else node.dtype
    body = ir.substitute(node.body, mapping)
    if dtype != node.dtype:
        body = ir.Op("convert_element_type", (body,), dtype)
    if not exact:
        body = _drop_rows_past_end(body, row, rows, node.reduction_type, dtype)
    name = f"{node.name}_split"
    partial = ir.Reduction(
        name, size, rsize, node.reduction_type, dtype, body, node.origins
    )
    (r0,) = indexing.index_vars("r", 1)
    read = indexing.index_vars("i", n) + (r0,)  # the partial's element (i..., s=r0)
    if hint == ReductionHint.OUTER:
        read = (r0, *read[:n])
    index = indexing.linear_index(read, indexing.contiguous_strides(size))
    # (an fp32 body under a bf16 result: the sum of partials accumulates in fp32, then rounds)
    final = dataclasses.replace(node, reduction_size=(splits,), body=ir.Load(name, index, dtype))
    return [partial, final]


# [Note: mix-order reductions]
# LayerNorm's backward reduces one [N, M] product twice: over each row for the input's gradient
# (an INNER reduction) and over each column for the weight's and bias's gradients (OUTER). As two
# kernels, the incoming gradient and the input are read twice: 5 N*M floats move where 3 would
# do (on the H100 the fwd+bwd row took 348 us against Inductor's 301). Inductor fuses them (its
# ``MixOrderReduction``): each program of the row kernel takes ``rows`` consecutive rows, keeps
# one running column sum per column-reduction in registers across them, and stores it as a
# partial sum, partial[program, column]; a small kernel sums the N / rows partials.
# Here the split pass writes such a column reduction as that partial (``mix_order_rows`` set,
# chunks of ``rows`` rows) plus the finishing reduction, when an INNER reduction of the graph
# covers the same N rows of M <= PERSISTENT_MAX_RNUMEL columns (a persistent row: the program
# holds the whole row, so each column's sum is per program) and reads a buffer it reads. The
# scheduler then fuses the partial into the row kernel, mapping the chunk s = x // rows, row in
# chunk x % rows, column r (``ir.ColumnReduce``); if it cannot (another order of the nodes), the
# partial runs alone as an ordinary split reduction, still right. Sums of floats only: the
# per-program order of additions changes the rounding as any split does (within fp32
# tolerance); max/min and integer sums keep the ordinary split. ``rows`` follows Inductor's
# rule, about TARGET_PROGRAMS programs, clamped to [16, 128] rows, exact chunks only.
MIX_ORDER_ROWS = (16, 128)


def mix_order_rows(node: ir.Reduction, lowered: ir.LoweredGraph) -> int:
    """Rows per program if ``node`` is a column sum that can share the kernel of a row
    reduction over the same rows (see [Note: mix-order reductions]), else 0."""
    from toycomp.inductor.codegen.triton_heuristics import PERSISTENT_MAX_RNUMEL

    sizes = (indexing.numel(node.size), indexing.numel(node.reduction_size))
    if node.reduction_type != ir.ReductionType.SUM or not node.dtype.is_floating_point:
        return 0
    if not all(map(indexing.is_static, sizes)) or node_hint(node) != ReductionHint.OUTER:
        return 0
    cols, rows_total = sizes
    if not 1 < cols <= PERSISTENT_MAX_RNUMEL:
        return 0
    reads = {e.buffer for e in ir.walk(node.body) if isinstance(e, ir.Load)}
    if not any(_row_reduction_over(other, rows_total, cols, reads) for other in lowered.nodes):
        return 0
    low, high = MIX_ORDER_ROWS
    rows = min(high, max(low, 2 ** max(0, (rows_total // TARGET_PROGRAMS).bit_length() - 1)))
    while rows >= 4 and rows_total % rows:
        rows //= 2
    return rows if rows >= 4 and rows_total >= 2 * rows else 0


def _partials_after_their_rows(nodes: list) -> list:
    """``nodes`` with each mix-order partial (and its finishing sum) moved after the row
    reduction it is to share a kernel with, when that comes later and nothing in between reads
    the finishing sum: the scheduler places nodes in order, and fuses a partial into a row
    kernel that exists already."""
    nodes = list(nodes)
    for partial in [n for n in nodes if getattr(n, "mix_order_rows", 0)]:
        at = nodes.index(partial)
        final = nodes[at + 1]
        reads = {e.buffer for e in ir.walk(partial.body) if isinstance(e, ir.Load)}
        size = (partial.size[0] * partial.mix_order_rows, indexing.numel(partial.size[1:]))
        rows = [k for k, n in enumerate(nodes) if _row_reduction_over(n, *size, reads)]
        if not rows or rows[0] < at:
            continue
        between = nodes[at + 2 : rows[0] + 1]
        if any(final.name in buffer_reads(n) for n in between):
            continue
        nodes[at : rows[0] + 1] = [*between, partial, final]
    return nodes


def _row_reduction_over(other, rows: int, cols: int, reads: set[str]) -> bool:
    """``other`` reduces each of ``rows`` rows of ``cols`` elements and reads one of ``reads``."""
    if not isinstance(other, ir.Reduction) or other.mix_order_rows:
        return False
    sizes = (indexing.numel(other.size), indexing.numel(other.reduction_size))
    if sizes != (rows, cols) or node_hint(other) != ReductionHint.INNER:
        return False
    return any(isinstance(e, ir.Load) and e.buffer in reads for e in ir.walk(other.body))


def mix_order_split(node: ir.Reduction, rows: int) -> list[ir.Reduction]:
    """``node`` (a column sum over ``reduction_size``) as partial sums over chunks of ``rows``
    flattened rows, ``partial[s, i...]`` (``mix_order_rows = rows``), and their sum: the
    ordinary exact split of ``node`` with its reduced dims flattened into one."""
    total = indexing.numel(node.reduction_size)
    (r0,) = indexing.index_vars("r", 1)
    rvars = indexing.index_vars("r", len(node.reduction_size))
    flat_rows = dict(zip(rvars, indexing.unflatten_index(r0, node.reduction_size)))
    flat = dataclasses.replace(
        node, reduction_size=(total,), body=ir.substitute(node.body, flat_rows)
    )
    partial, final = split_reduction(flat, 0, total // rows, ReductionHint.OUTER)
    return [dataclasses.replace(partial, mix_order_rows=rows), final]


def _drop_rows_past_end(
    body: ir.Expr, row: sympy.Expr, rows, kind: ir.ReductionType, dtype: torch.dtype
) -> ir.Expr:
    """``where(row < rows, body, identity)``: the clamped rows past the end count as nothing."""
    index = torch.int64
    bound = ir.IndexValue(sympy.sympify(rows), index)
    inside = ir.Op("lt", (ir.IndexValue(row, index), bound), torch.bool)
    identity = ir.Constant(prims.reduction_identity(kind.value, dtype), dtype)
    return ir.Op("where", (inside, body, identity), dtype)
