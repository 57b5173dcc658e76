"""Stage 4c (C++ backend): the loop nests of reduction kernels, over rows and over columns.

Input -> output: an ``ir.Kernel`` whose loops run over ``r`` (and the ``CppKernelCodegen`` filling
its sections) -> the C++ loops of its body, in the layout cpp_layout.py chose for it (see
[Note: row and column reductions]):

* **row** (``r`` contiguous in memory: a softmax, a LayerNorm's statistics): one ``x`` at a time,
  each ``r`` loop ``omp simd`` with an OpenMP ``reduction`` clause; ``x`` runs on all cores.
  An ``r`` divided by multiples of one extent (BatchNorm's sums over N, H, W) runs over planes,
  ``for r0: for r1`` (see [Note: reductions over planes] in cpp_layout.py). A loop that calls
  ``toycomp_expf`` over 1000 floats runs as two, over 992 and 8 (see [Note: a vector tail]).
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

import re

import torch

import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.inductor.codegen.common import IndentedBuffer, compute_dtype
from toycomp.inductor.codegen.cpp_utils import braced
from toycomp.inductor.opt.cpp_layout import independent_iterations, plane_loops

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
# outputs) per tile and r inner (13-20 ms for the 4096 x 4096 sum on one core); with r outside
# and a wider tile, toycomp's reads run along rows as eager's do (5-6 ms).
# cpp_layout.py chooses the layout from the indices that the r loops read and store and that
# depend on x and r (those on one only are broadcasts, cheap either way): column when more
# of them have stride 1 in x than in r, else row (a tie, a transpose, stays row). A kernel whose
# loops read a buffer they store at another index (iterations not independent) stays row.
XBLOCK = 256

# [Note: summing in blocks]
# A float sum accumulated in one variable over n values has a rounding error that grows with n
# (each addition rounds to the accumulator's magnitude): over 4096 rows, 5e-4 off eager in a
# column summing to ~60, more than the 1e-5 tests allow. Eager sums in a cascade of partial
# sums; the row layout's 16 vector lanes each sum n/16 values. The column layout sums each
# block of RBLOCK rows into a partial array, then adds the partial to the accumulator: errors
# grow with RBLOCK + n/RBLOCK instead of n, at the cost of one pass over a 1 KB array per
# block. The partials add up in double (one addition per RBLOCK rows), rounded to float once at
# the end, so that a column of ten million rows sums as well as eager's cascade does (1.7e-6
# relative off in float, eager 1.3e-7). Only float sums need it: max, min and integer sums are
# exact in any order.
RBLOCK = 64

# [Note: a cascade for long rows]
# The row layout's vector lanes each sum n/16 values in one float: over 8.4M values (a whole
# tensor's sum) each lane adds half a million, and the sum drifts (1.7e-6 relative, eager
# 5.6e-8); a variance over 33.5M, 4e-4 (eager 3e-8). Eager sums in a cascade of partial sums.
# So a float sum over a row longer than CASCADE_BLOCK runs in blocks: each block of
# CASCADE_BLOCK values is summed in float as before (by the vector lanes: 256 values a lane),
# and the block sums are added in double, once a block; the result is rounded to float once,
# at the end. The error then grows with the block size, not with n: no worse than eager's on
# the long sums tests measure, at one double addition per 4096 values. Shorter rows (softmax,
# LayerNorm) keep the single loop. Integer sums, max and min are exact in any order.
CASCADE_BLOCK = 1024

# When a kernel has a single row (numel == 1), parallelise its r loops instead, from this size.
PARALLEL_REDUCTION_MIN_RNUMEL = 4096

# Reduce -> (OpenMP reduction identifier, how the accumulator combines with a value)
REDUCTIONS = {
    ir.ReductionType.SUM: ("+", "{acc} + {value}"),
    ir.ReductionType.MAX: ("max_nan", "max_propagate_nan({acc}, {value})"),
    ir.ReductionType.MIN: ("min_nan", "min_propagate_nan({acc}, {value})"),
}


# --- the row layout -----------------------------------------------------------------------------
def reduce_row(cg, red: ir.Reduce, value: str) -> None:
    """One scalar accumulator per x, declared before the r loop, named in its reduction clause."""
    acc, dtype, identity = _accumulator(cg, red)
    cg.prefix.writeline(f"{cg.ctype(dtype)} {acc} = {identity};")
    clause, combine = REDUCTIONS[red.reduction_type]
    target = acc
    if red.reduction_type == ir.ReductionType.SUM and dtype.is_floating_point and _long_row(cg):
        target = f"{acc}_block"  # see [Note: a cascade for long rows]
        cg.row_sums.append((cg.ctype(dtype), acc))
    cg.stores.writeline(f"{target} = {combine.format(acc=target, value=_value(cg, red, value))};")
    cg.loop_reductions.append(f"{clause}:{target}")
    if clause != "+":
        cg.declared_reductions.add((clause, dtype))


def codegen_row_loop(cg, body: IndentedBuffer, loop: ir.Loop) -> None:
    """One r loop of the row layout: ``omp simd`` with its reduction clauses, or, in a kernel
    of one row (``parallel_r``), ``omp parallel for`` over r; over planes ``r0``, ``r1`` when
    ``cg.rplane`` is set (see [Note: reductions over planes] in cpp_layout.py)."""
    k, parallel_r = cg.kernel, None
    if indexing.known_equal(k.numel, 1) and not k.scatters():  # a scatter's r runs in order
        parallel_r = cg.parallel_if(k.rnumel, PARALLEL_REDUCTION_MIN_RNUMEL)
    body.splice(cg.prefix)
    clauses = "".join(f" reduction({c})" for c in cg.loop_reductions)
    simd = f"#pragma omp simd{clauses}" if clauses or independent_iterations(loop) else None
    if cg.row_sums:
        _cascade_row_loop(cg, body, simd, parallel_r)
    elif cg.rplane is not None:  # the planes (on the cores, for one row), each one vectorised
        parallel = None if parallel_r is None else f"#pragma omp parallel for{clauses}{parallel_r}"
        sections = IndentedBuffer()
        sections.writelines([*cg.loads.lines, *cg.compute.lines, *cg.stores.lines])
        body.splice(plane_loops("r", cg.kernel.rnumel, cg.rplane, sections, parallel, simd))
    else:
        pragma = simd
        if parallel_r is not None:
            pragma = f"#pragma omp parallel for{' simd' if clauses else ''}{clauses}{parallel_r}"
        rnumel = cg.print_index(cg.kernel.rnumel)
        split = _vector_tail_split(cg, pragma)  # see [Note: a vector tail]
        ranges = [("0", rnumel)] if split is None else [("0", split), (split, rnumel)]
        for start, end in ranges:
            if pragma is not None:
                body.writeline(pragma)
            body.writeline(f"for (int64_t rindex = {start}; rindex < {end}; rindex++)")
            braced(body, cg.loads, cg.compute, cg.stores)
    body.splice(cg.suffix)


def _long_row(cg) -> bool:
    """A row loop long enough for the cascade (see [Note: a cascade for long rows])."""
    rnumel = cg.kernel.rnumel
    return cg.rplane is None and not (isinstance(rnumel, int) and rnumel <= CASCADE_BLOCK)


def _cascade_row_loop(cg, body: IndentedBuffer, simd: str, parallel_r: str | None) -> None:
    """The r loop in blocks of CASCADE_BLOCK: float sums per block, added up in double."""
    rnumel = cg.print_index(cg.kernel.rnumel)
    sums = [f"{acc}_cascade" for _, acc in cg.row_sums]
    body.writelines([f"double {s} = 0;" for s in sums])
    if parallel_r is not None:  # the blocks on the cores; the other reductions as before
        others = [c for c in cg.loop_reductions if not c.endswith("_block")]
        clauses = "".join(f" reduction({c})" for c in [*others, *(f"+:{s}" for s in sums)])
        body.writeline(f"#pragma omp parallel for{clauses}{parallel_r}")
    body.writeline(f"for (int64_t r0 = 0; r0 < {rnumel}; r0 += {CASCADE_BLOCK})")
    blocks = [f"{ctype} {acc}_block = 0;" for ctype, acc in cg.row_sums]
    loop = [f"const int64_t r1 = std::min<int64_t>(r0 + {CASCADE_BLOCK}, {rnumel});", simd,
            "for (int64_t rindex = r0; rindex < r1; rindex++)", "{"]  # fmt: skip
    inner = ["    " + line for line in [*cg.loads.lines, *cg.compute.lines, *cg.stores.lines]]
    adds = [f"{acc}_cascade += {acc}_block;" for _, acc in cg.row_sums]
    braced(body, blocks, loop, inner, ["}"], adds)
    body.writelines([f"{acc} = {acc}_cascade;" for _, acc in cg.row_sums])


# [Note: a vector tail]
# GCC vectorises an `omp simd` loop of 1000 iterations as 62 vector iterations of 16 floats and
# a tail of 8 iterations, and it vectorises the tail too (8 floats, then 4), except when the
# loop calls a SIMD function (toycomp_expf, see [Note: vectorised libm] in cpp.py): GCC 12 runs
# that tail one element at a time, and each element is a call of the 16-lane function. A
# softmax over rows of 1000 then spends a sixth of its time on the last 8 floats of each row.
# So a row loop that calls one, over a fixed length that is no multiple of 16 (the widest
# vector), is written as two loops: one over the multiple of 16 (992), with no tail, and one
# over the rest (8), which GCC vectorises on its own with a narrower vector. Each element is
# still computed once, by the same code; only a reduction's order changes (the tail's partial
# sum is added to the body's, not element by element), as any other vector width would change it.
VECTOR_WIDTH = 16  # floats in the widest vector (AVX-512); a multiple of the narrower ones


def _vector_tail_split(cg, pragma: str | None) -> str | None:
    """Where to split a row loop in two (see [Note: a vector tail]), or None."""
    rnumel = cg.kernel.rnumel  # an int, or a sympy expression of the sizes
    if pragma is None or not pragma.startswith("#pragma omp simd") or not isinstance(rnumel, int):
        return None
    if rnumel < VECTOR_WIDTH or rnumel % VECTOR_WIDTH == 0:
        return None
    if not any(re.search(r"\btoycomp_\w+\(", line) for line in cg.compute.lines):
        return None
    return str(rnumel // VECTOR_WIDTH * VECTOR_WIDTH)


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
    cg.accumulators.append((red.name, ctype, acc, identity, combine))


def codegen_column_body(cg, parallel: str | None) -> IndentedBuffer:
    """The whole function body of a column-layout kernel: a loop over tiles of XBLOCK outputs
    (on all cores when ``parallel`` is not None), each running every loop of the kernel."""
    if parallel is not None and _split_rows(cg.kernel):
        return _codegen_split_rows(cg)
    tile = IndentedBuffer()
    for loop in cg.kernel.loops:
        _codegen_column_loop(cg, loop)
        if loop.over_r:
            _column_r_loop(cg, tile)
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


def _codegen_column_loop(cg, loop: ir.Loop) -> None:
    cg.new_sections()
    cg.partial_sums, cg.accumulators = [], []
    cg.codegen_loop(loop)


def _column_r_loop(cg, tile: IndentedBuffer, blocks: str | None = None) -> None:
    """``for r { for xi in tile {...} }``. With float sums, or when ``blocks`` gives the
    ``omp for`` pragma that shares them out, r runs in blocks of RBLOCK."""
    tile.splice(cg.prefix)
    rnumel = cg.print_index(cg.kernel.rnumel)
    if not cg.partial_sums and blocks is None:
        tile.writeline(f"for (int64_t rindex = 0; rindex < {rnumel}; rindex++)")
        tile.writeline("{")
        with tile.indent():
            _tile_loop(cg, tile)
        tile.writeline("}")
        return
    for _, acc, _ in cg.partial_sums:  # the blocks' sums add up in double: [Note: summing in
        tile.writeline(f"double {acc}_cascade[{XBLOCK}];")  # blocks]
        tile.writeline(f"for (int64_t xi = 0; xi < xn; xi++) {acc}_cascade[xi] = 0;")
    if blocks is not None:
        tile.writeline(blocks)
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
        if cg.partial_sums:
            tile.writeline("#pragma omp simd")
            tile.writeline("for (int64_t xi = 0; xi < xn; xi++)")
            braced(tile, [f"{a}_cascade[xi] += {a}_part[xi];" for _, a, _ in cg.partial_sums])
    tile.writeline("}")
    if cg.partial_sums:
        tile.writeline("for (int64_t xi = 0; xi < xn; xi++)")
        braced(tile, [f"{a}[xi] = {a}_cascade[xi];" for _, a, _ in cg.partial_sums])


# [Note: a column reduction with few outputs]
# Tiles run on all cores, but a reduction of a single tile (at most XBLOCK outputs: the bias
# gradient of 64 channels over a million rows) would run on one. Then the threads share out the
# blocks of RBLOCK rows instead: each thread reduces its blocks into accumulator arrays of its
# own, and the threads' arrays are then combined into `<acc>_total`, one thread after the
# other in thread order (an `ordered` loop of one iteration per thread), so that a float sum
# has the same bits on every run with the same number of threads (a `critical` section would
# add them in the order the threads arrive). Only the simplest such kernel does this: one r
# loop of reductions, then the stores of their results (`x.sum(0)`, `x.amax(0)`, bias grads).
def _split_rows(kernel: ir.Kernel) -> bool:
    """A static single-tile column reduction with enough rows to share: see [Note: a column
    reduction with few outputs]."""
    if not (indexing.is_static(kernel.numel) and indexing.is_static(kernel.rnumel)):
        return False
    if kernel.numel > XBLOCK or kernel.rnumel < PARALLEL_REDUCTION_MIN_RNUMEL:
        return False
    kinds = [(loop.over_r, {type(s) for s in loop.body}) for loop in kernel.loops]
    return kinds == [(True, {ir.Reduce}), (False, {ir.Store})]


def _codegen_split_rows(cg) -> IndentedBuffer:
    code = IndentedBuffer()
    code.writelines(["const int64_t x0 = 0;", f"const int64_t xn = {cg.kernel.numel};"])
    reduce_loop, store_loop = cg.kernel.loops
    _codegen_column_loop(cg, reduce_loop)
    region = IndentedBuffer()
    _column_r_loop(cg, region, blocks="#pragma omp for schedule(static)")
    combines = []
    for name, ctype, acc, identity, combine in cg.accumulators:
        total = f"{acc}_total[xi]"
        code.writeline(f"{ctype} {acc}_total[{XBLOCK}];")
        code.writeline(f"for (int64_t xi = 0; xi < xn; xi++) {total} = {identity};")
        combines.append(f"{total} = {combine.format(acc=total, value=f'{acc}[xi]')};")
        cg.locals[name] = total
    region.writeline("#pragma omp for ordered schedule(static, 1)")
    region.writeline("for (int thread = 0; thread < omp_get_num_threads(); thread++)")
    ordered = ["#pragma omp ordered", "for (int64_t xi = 0; xi < xn; xi++)", "{"]
    braced(region, ordered, ["    " + line for line in combines], ["}"])
    code.writeline("#pragma omp parallel")
    braced(code, region)
    cg.new_sections()
    cg.codegen_loop(store_loop)
    _tile_loop(cg, code)
    return code


def _tile_loop(cg, out: IndentedBuffer) -> None:
    """The vector loop over the tile's outputs, running the current sections."""
    out.writeline("#pragma omp simd")
    out.writeline("for (int64_t xi = 0; xi < xn; xi++)")
    braced(out, ["const int64_t xindex = x0 + xi;"], cg.loads, cg.compute, cg.stores)


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
