"""Stage 4c (C++ backend): the loop nests of reduction kernels, over rows and over columns.

Input -> output: an ``ir.Kernel`` whose loops run over ``r`` (and the ``CppKernelCodegen`` filling
its sections) -> the C++ loops of its body. Two layouts (see [Note: row and column reductions]):

* **row** (``r`` contiguous in memory: a softmax, a LayerNorm's statistics): one ``x`` at a time,
  each ``r`` loop ``omp simd`` with an OpenMP ``reduction`` clause; ``x`` runs on all cores.
* **column** (``x`` contiguous, ``r`` strided: a sum over the batch dimension, a bias gradient):
  a tile of ``XBLOCK`` outputs at a time, the ``r`` loop outside and a vectorised loop over the
  tile inside, one accumulator array per ``Reduce``; tiles run on all cores. For
  ``x.sum(0)`` of a 64 x 48 matrix::

    for (int64_t x0 = 0; x0 < 48; x0 += 256)
    {
        const int64_t xn = std::min<int64_t>(256, 48 - x0);
        float sum_buf0[256];
        for (int64_t xi = 0; xi < xn; xi++) sum_buf0[xi] = 0.0f;
        for (int64_t r0 = 0; r0 < 64; r0 += 64)
        {
            ...  // 64 rows summed into sum_buf0_part[xi], then added to sum_buf0[xi]
        }
        #pragma omp simd
        for (int64_t xi = 0; xi < xn; xi++)
        {
            const int64_t xindex = x0 + xi;
            out_ptr0[xindex] = sum_buf0[xi];
        }
    }

NB: in PyTorch this lives in torch/_inductor/codegen/cpp.py: ``CppKernel.reduction`` and
``CppVecKernel.reduction`` (accumulators, ``reduction_prefix``/``suffix``, the
``omp declare reduction`` of ``max_propagate_nan``), the outer-dimension ("column") reductions
vectorised over the output index, and ``CascadeSumHelper`` for long float sums.
"""

from __future__ import annotations

import dataclasses

import sympy
import torch

import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.inductor.codegen.common import IndentedBuffer, compute_dtype

# [Note: row and column reductions]
# A reduction kernel runs, for each output x, its loops over r. Where the memory it reads lies
# decides the loop order. A row reduction (softmax over the last dim) reads `r + 1000*x`: for
# one x, consecutive r are consecutive floats, so the r loop is the vector loop (16 floats per
# AVX-512 instruction, an OpenMP reduction clause keeping 16 partial results) and x is the
# parallel loop. A column reduction (`x.sum(0)`, the bias and LayerNorm weight gradients) reads
# `4096*r + x`: for one x, consecutive r are 16 KB apart. Summing one column at a time then
# reads one float of every 64-byte cache line it loads, and 4096 columns reload the matrix
# from memory many times over: 127 ms for a 4096 x 4096 sum against eager's 8 ms. So a kernel
# whose reads are contiguous in x turns the nest inside out: it takes a tile of XBLOCK
# outputs, walks r in the outer loop, and in the inner loop adds row r's XBLOCK contiguous
# floats to an array of XBLOCK accumulators (one per output). Every cache line is read once,
# whole; the inner loop is the vector loop; tiles are independent, so they run on all cores.
# XBLOCK = 256 floats (1 KB per accumulator array) keeps every array of a kernel in L1 and
# still reads 1 KB runs of each row; a loop that only stores (once per x, or per (x, r)) runs
# over the same tile. Inductor vectorises such a reduction over x too, with one vector (16
# outputs) per tile and r inner (40 ms for the 4096 x 4096 sum); with the r loop outside and
# a wider tile, toycomp's reads run along rows as eager's do.
# The layout is chosen from the indices the r loops read and store that depend on both x and r
# (those depending on one only are broadcasts, cheap either way): column when more of them
# have stride 1 in x than in r, row otherwise (a tie, a transpose, stays row). A kernel whose
# loops read a buffer they store at another index (iterations not independent) stays row.
XBLOCK = 256

# [Note: summing in blocks]
# A float sum accumulated in one variable over n values has a rounding error that grows with n
# (each addition rounds to the accumulator's magnitude): over 4096 rows, 5e-4 off eager in a
# column summing to ~60, more than the 1e-5 tests allow. Eager sums in a cascade of partial
# sums; the row layout's 16 vector lanes each sum n/16 values. The column layout sums each
# block of RBLOCK rows into a partial array, then adds the partial to the accumulator: errors
# grow with RBLOCK + n/RBLOCK instead of n, at the cost of one pass over a 1 KB array per
# block. Only float sums need it: max, min and integer sums are exact in any order.
RBLOCK = 64

# When a kernel has a single row (numel == 1), parallelise its r loops instead, from this size.
PARALLEL_REDUCTION_MIN_RNUMEL = 4096

# Reduce -> (OpenMP reduction identifier, how the accumulator combines with a value)
REDUCTIONS = {
    ir.ReductionType.SUM: ("+", "{acc} + {value}"),
    ir.ReductionType.MAX: ("max_nan", "max_propagate_nan({acc}, {value})"),
    ir.ReductionType.MIN: ("min_nan", "min_propagate_nan({acc}, {value})"),
}


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


# --- choosing the layout ------------------------------------------------------------------------
def use_column_layout(kernel: ir.Kernel) -> bool:
    """True when ``kernel`` reduces (or stores) over columns: see [Note: row and column
    reductions]."""
    if indexing.known_equal(kernel.numel, 1) or indexing.known_equal(kernel.rnumel, 1):
        return False
    if not all(independent_iterations(loop) for loop in kernel.loops):
        return False
    r_statements = [s for loop in kernel.loops if loop.over_r for s in loop.body]
    return _reads_columns(r_statements)


def _reads_columns(statements: list[ir.Store | ir.Reduce]) -> bool:
    """More of the indices that ``statements`` (of r loops) load and store have stride 1 in x
    than in r; those depending on x or r only (broadcasts) are cheap either way, not counted."""
    indices = {}
    for stmt in statements:
        if isinstance(stmt, ir.Store):
            indices[stmt.index] = None
        indices.update((e.index, None) for e in ir.walk(stmt.value) if isinstance(e, ir.Load))
    x_contiguous = r_contiguous = 0
    for index in indices:
        x_stride, r_stride = _stride(index, indexing.x), _stride(index, indexing.r)
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
    for group in groups:
        if _reads_columns([statements[i][1] for i in group if statements[i][0]]):
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
    free = step.free_symbols
    return step if indexing.x not in free and indexing.r not in free else None


def independent_iterations(loop: ir.Loop) -> bool:
    """No buffer is both stored and loaded at another index in ``loop``: ``omp simd`` is safe."""
    stores = {(s.buffer, s.index) for s in loop.body if isinstance(s, ir.Store)}
    stored = {buffer for buffer, _ in stores}
    for e in ir.walk(*(stmt.value for stmt in loop.body)):
        if isinstance(e, ir.Load) and e.buffer in stored and (e.buffer, e.index) not in stores:
            return False
    return True


# --- the row layout -----------------------------------------------------------------------------
def reduce_row(cg, red: ir.Reduce, value: str) -> None:
    """One scalar accumulator per x, declared before the r loop, named in its reduction clause."""
    acc, dtype, identity = _accumulator(cg, red)
    cg.prefix.writeline(f"{cg.ctype(dtype)} {acc} = {identity};")
    clause, combine = REDUCTIONS[red.reduction_type]
    cg.stores.writeline(f"{acc} = {combine.format(acc=acc, value=_value(cg, red, value))};")
    cg.loop_reductions.append(f"{clause}:{acc}")
    if clause != "+":
        cg.declared_reductions.add((clause, dtype))


def codegen_row_loop(cg, body: IndentedBuffer, loop: ir.Loop, parallel_r: str | None) -> None:
    """One r loop of the row layout: ``omp simd`` with its reduction clauses, or, in a kernel
    of one row (``parallel_r``), ``omp parallel for`` over r."""
    body.splice(cg.prefix)
    clauses = "".join(f" reduction({c})" for c in cg.loop_reductions)
    if parallel_r is not None:
        simd = " simd" if clauses else ""
        body.writeline(f"#pragma omp parallel for{simd}{clauses}{parallel_r}")
    elif clauses or independent_iterations(loop):
        body.writeline(f"#pragma omp simd{clauses}")
    rnumel = cg.print_index(cg.kernel.rnumel)
    body.writeline(f"for (int64_t rindex = 0; rindex < {rnumel}; rindex++)")
    _braced(body, cg.loads, cg.compute, cg.stores)
    body.splice(cg.suffix)


def declare_reduction(cg, clause: str, dtype: torch.dtype) -> str:
    """``#pragma omp declare reduction(max_nan : float : ...)``: OpenMP's max drops NaN."""
    fn = "max_propagate_nan" if clause == "max_nan" else "min_propagate_nan"
    name = "amax" if clause == "max_nan" else "amin"
    init = cg.constant(reduction_identity(name, dtype), dtype)
    return (
        f"#pragma omp declare reduction({clause} : {cg.ctype(dtype)} : "
        f"omp_out = {fn}(omp_out, omp_in)) initializer(omp_priv = {init})"
    )


# --- the column layout --------------------------------------------------------------------------
def reduce_column(cg, red: ir.Reduce, value: str) -> None:
    """An array of XBLOCK accumulators, one per output of the tile; a float sum adds into a
    partial array per block of RBLOCK rows (see [Note: summing in blocks])."""
    acc, dtype, identity = _accumulator(cg, red)
    ctype = cg.ctype(dtype)
    cg.prefix.writeline(f"{ctype} {acc}[{XBLOCK}];")
    cg.prefix.writeline(f"for (int64_t xi = 0; xi < xn; xi++) {acc}[xi] = {identity};")
    target = f"{acc}[xi]"
    if red.reduction_type == ir.ReductionType.SUM and dtype.is_floating_point:
        target = f"{acc}_part[xi]"
        cg.partial_sums.append((ctype, acc, identity))
    combine = REDUCTIONS[red.reduction_type][1]
    cg.stores.writeline(f"{target} = {combine.format(acc=target, value=_value(cg, red, value))};")
    cg.locals[red.name] = f"{acc}[xi]"  # later loops read this output's element of the array


def codegen_column_body(cg, parallel: str | None) -> IndentedBuffer:
    """The whole function body of a column-layout kernel: a loop over tiles of XBLOCK outputs
    (on all cores when ``parallel`` is not None), each running every loop of the kernel."""
    tile = IndentedBuffer()
    for loop in cg.kernel.loops:
        cg.new_sections()
        cg.partial_sums = []
        cg.codegen_loop(loop)
        if loop.over_r:
            _column_r_loop(cg, tile, loop)
        else:
            _tile_loop(cg, tile)
    code = IndentedBuffer()
    if parallel is not None:
        code.writeline(f"#pragma omp parallel for{parallel}")
    numel = cg.print_index(cg.kernel.numel)
    code.writeline(f"for (int64_t x0 = 0; x0 < {numel}; x0 += {XBLOCK})")
    code.writeline("{")
    with code.indent():
        code.writeline(f"const int64_t xn = std::min<int64_t>({XBLOCK}, {numel} - x0);")
        code.splice(tile)
    code.writeline("}")
    return code


def _column_r_loop(cg, tile: IndentedBuffer, loop: ir.Loop) -> None:
    """``for r { for xi in tile {...} }``; with float sums, r runs in blocks of RBLOCK."""
    tile.splice(cg.prefix)
    rnumel = cg.print_index(cg.kernel.rnumel)
    if not cg.partial_sums:
        tile.writeline(f"for (int64_t rindex = 0; rindex < {rnumel}; rindex++)")
        tile.writeline("{")
        with tile.indent():
            _tile_loop(cg, tile)
        tile.writeline("}")
        return
    tile.writeline(f"for (int64_t r0 = 0; r0 < {rnumel}; r0 += {RBLOCK})")
    tile.writeline("{")
    with tile.indent():
        for ctype, acc, identity in cg.partial_sums:
            tile.writeline(f"{ctype} {acc}_part[{XBLOCK}];")
            tile.writeline(f"for (int64_t xi = 0; xi < xn; xi++) {acc}_part[xi] = {identity};")
        tile.writeline(f"const int64_t r1 = std::min<int64_t>(r0 + {RBLOCK}, {rnumel});")
        tile.writeline("for (int64_t rindex = r0; rindex < r1; rindex++)")
        tile.writeline("{")
        with tile.indent():
            _tile_loop(cg, tile)
        tile.writeline("}")
        tile.writeline("#pragma omp simd")
        tile.writeline("for (int64_t xi = 0; xi < xn; xi++)")
        adds = [f"{acc}[xi] = {acc}[xi] + {acc}_part[xi];" for _, acc, _ in cg.partial_sums]
        _braced(tile, adds)
    tile.writeline("}")


def _tile_loop(cg, out: IndentedBuffer) -> None:
    """The vector loop over the tile's outputs, running the current sections."""
    out.writeline("#pragma omp simd")
    out.writeline("for (int64_t xi = 0; xi < xn; xi++)")
    _braced(out, ["const int64_t xindex = x0 + xi;"], cg.loads, cg.compute, cg.stores)


# --- shared -------------------------------------------------------------------------------------
def _accumulator(cg, red: ir.Reduce) -> tuple[str, torch.dtype, str]:
    """The accumulator's name, its dtype (fp16/bf16 accumulate in float) and its start."""
    dtype = compute_dtype(red.dtype)
    identity = reduction_identity(red.reduction_type.value, dtype)
    return cg.locals[red.name], dtype, cg.constant(identity, dtype)


def reduction_identity(name: str, dtype: torch.dtype) -> ir.Number:
    """``prims.reduction_identity``, and for bool (which has no ``iinfo``): amax starts at
    False, amin at True."""
    if dtype == torch.bool and name != "sum":
        return name == "amin"
    return prims.reduction_identity(name, dtype)


def _value(cg, red: ir.Reduce, value: str) -> str:
    if compute_dtype(red.value.dtype) != compute_dtype(red.dtype):
        return cg.cast(value, red.value.dtype, red.dtype)
    return value


def _braced(out: IndentedBuffer, *sections) -> None:
    """``{``, the sections' lines (IndentedBuffers or lists of lines) indented, ``}``."""
    out.writeline("{")
    with out.indent():
        for section in sections:
            out.writelines(section.lines if isinstance(section, IndentedBuffer) else section)
    out.writeline("}")
