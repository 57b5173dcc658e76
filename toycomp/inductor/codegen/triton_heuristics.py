"""Stage 4c (Triton backend), launch heuristics: block sizes and the index dtype of a kernel.

Input -> output: an ``ir.Kernel`` -> its launch parameters (``XBLOCK``, ``RBLOCK``, ``num_warps``)
and whether its indices need 64 bits, decided at compile time for static sizes and, for
symbolic ones, by the wrapper at each call (``reduction_blocks``, ``INDEX_INT64``)::

    >>> from toycomp.inductor.indexing import x
    >>> loop = ir.Loop(False, (ir.Store("buf0", x, ir.Load("a", x, torch.float32)),))
    >>> kernel = ir.Kernel("kernel_0", 1000, 1, (loop,), (("a", torch.float32),
    ...                    ("buf0", torch.float32)), ())
    >>> block_sizes(kernel), index_dtype(kernel, block_sizes(kernel), is_reduction=False)
    ({'XBLOCK': 1024, 'num_warps': 4}, False)
    >>> reduction_blocks(128, 37)  # a reduction over a symbolic rnumel, this call: 128 x 37
    {'XBLOCK': 64, 'RBLOCK': 64, 'num_warps': 8}
    >>> reduction_blocks(8192, 4096)  # the longest persistent rows: one a program
    {'XBLOCK': 1, 'RBLOCK': 4096, 'num_warps': 8}
    >>> reduction_blocks(128, 100_000)  # too long a row for registers: the looped variant
    {'XBLOCK': 1, 'RBLOCK': 1024, 'num_warps': 2}
    >>> reduction_blocks(4096, 128, outer=True)  # a column sum's partials: a wide, short tile
    {'XBLOCK': 64, 'RBLOCK': 8, 'num_warps': 4}
    >>> candidate_configs(kernel)  # what CUDA autotunes among: 1000 floats, not worth timing
    [{'XBLOCK': 1024, 'num_warps': 4}]

NB: in PyTorch this lives in torch/_inductor/runtime/triton_heuristics.py (block sizes,
autotuning configs, the grid) and torch/_inductor/codegen/simd.py (``index_dtype``,
``can_use_32bit_indexing``).
"""

from __future__ import annotations

import math

import sympy
import torch

from toycomp.inductor import indexing, ir
from toycomp.inductor.codegen.common import IndexPrinter
from toycomp.inductor.opt.split_reduction import OUTER_XBLOCK, ReductionHint, reduction_hint

# [Note: Triton block sizes]
# One fixed config per kernel, the one generated code names and the interpreter runs (on CUDA
# autotuning may launch another candidate instead: see [Note: autotuning candidates]):
# * pointwise: XBLOCK = 1024 (fewer for small numel) over a 1-D grid of cdiv(numel, XBLOCK);
#   on CUDA XBLOCK = 512 with 4 warps instead (see [Note: four floats a thread]);
# * rnumel <= PERSISTENT_MAX_RNUMEL: a "persistent" reduction, the whole row in registers:
#   RBLOCK = next_power_of_2(rnumel), XBLOCK rows per program so that XBLOCK * RBLOCK stays
#   near BLOCK_ELEMENTS (CUDA_BLOCK_ELEMENTS on CUDA: see [Note: rows per program on CUDA]),
#   16 elements a thread. A softmax over 1000 columns is one pass: load, max, exp, sum, store;
# * longer rows: a looped reduction, XBLOCK = 1 row per program, RBLOCK = LOOPED_RBLOCK columns
#   per step, accumulating in an [XBLOCK, RBLOCK] tensor reduced along axis 1 after the loop;
#   every Loop of the kernel (stores after a reduction too) loops over r again;
# * an OUTER reduction (loads contiguous along x: a column sum) takes a tile wide in x and
#   short in r, [OUTER_XBLOCK, OUTER_TILE // OUTER_XBLOCK] = [64, 8], looped over r (see [Note:
#   outer reductions] in split_reduction.py). Its few outputs are spread over more programs
#   by the split_reduction pass, which runs before scheduling.
# A reduction is persistent (no loop over r) exactly when RBLOCK >= rnumel.
POINTWISE_XBLOCK = 1024
CUDA_POINTWISE_XBLOCK = 512
PERSISTENT_MAX_RNUMEL = 4096
LOOPED_RBLOCK = 1024
BLOCK_ELEMENTS = 4096
CUDA_BLOCK_ELEMENTS = 2048
OUTER_TILE = 512  # elements of an outer reduction's tile (Inductor's 64 x 8)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))


# [Note: Triton with dynamic shapes]
# A kernel whose sizes are symbols takes them as arguments (``s0``, then ``xnumel`` and
# ``rnumel`` computed from them by the wrapper) and its grid, ``cdiv(xnumel, XBLOCK)``, is
# computed at each call. Block sizes that would depend on a symbolic size are chosen without
# it: a pointwise kernel takes XBLOCK = 1024 (512 on CUDA), a persistent reduction (static rnumel)
# takes BLOCK_ELEMENTS // RBLOCK rows per program. A reduction over a symbolic rnumel is generated
# twice in one module, persistent (``kernel_0``) and looped (``kernel_0_looped``): the wrapper takes
# the first when this call's rnumel <= RBLOCK, with XBLOCK and RBLOCK chosen by ``reduction_blocks``
# from the call's sizes by the static rule, so a dynamic softmax reads its row once, as the static
# one does. Triton compiles one variant per distinct block size (a power of 2); the source and
# toycomp's cache entry stay one. Whether indices need 64 bits is also decided per call
# (see [Note: 32-bit indices with symbolic sizes]).
#
# [Note: four floats a thread]
# A pointwise kernel on the GPU is bound by memory: what matters is how its loads are issued. With
# XBLOCK = 512 and 4 warps each thread owns 4 consecutive floats, one 16-byte load and one 16-byte
# store, the shape of eager's own vectorized elementwise kernels (128 threads x 4). On the H100
# (medians of 9 rounds, the configs taking turns) it ran sin²+cos² on 16M floats at 0.90 of the
# copy-bandwidth floor and bias + GELU on 8192 x 4096 at 0.955, against 0.884 and 0.942 with XBLOCK
# = 1024 (8 floats a thread, two loads): as fast as a ``copy_`` of the same bytes. 8 warps over 512
# (2 floats a thread) ran at 0.82 and 0.90. Triton's interpreter keeps XBLOCK = 1024: it runs each
# program in Python, so twice the programs took twice the time (1.3 s -> 3.3 s for 1M floats).
def block_sizes(kernel: ir.Kernel, cuda: bool = False) -> dict[str, int]:
    """``XBLOCK`` (and ``RBLOCK`` for reductions) plus ``num_warps`` for ``kernel``, launched
    on CUDA if ``cuda`` (else by the interpreter); empty for a reduction over a symbolic
    rnumel (``reduction_blocks`` picks them at each call)."""
    static_numel = indexing.is_static(kernel.numel)
    if not any(loop.over_r for loop in kernel.loops):
        xblock = CUDA_POINTWISE_XBLOCK if cuda else POINTWISE_XBLOCK
        if static_numel:
            xblock = min(xblock, next_power_of_2(kernel.numel))
        per_warp = 32 * 4 if cuda else 256  # four floats a thread on the GPU (see the Note)
        return {"XBLOCK": xblock, "num_warps": min(4, max(1, xblock // per_warp))}
    if not indexing.is_static(kernel.rnumel):
        return {}
    outer = kernel_hint(kernel) == ReductionHint.OUTER and not kernel.rows_per_program
    blocks = reduction_blocks(kernel.numel if static_numel else None, kernel.rnumel, outer, cuda)
    if kernel.rows_per_program:  # RSPLIT rows a program, XBLOCK a step ([Note: mix-order
        rows = kernel.rows_per_program  # reductions] in split_reduction.py)
        blocks = {**_reduction_meta(min(blocks["XBLOCK"], rows), blocks["RBLOCK"]), "RSPLIT": rows}
    return blocks


def kernel_hint(kernel: ir.Kernel) -> ReductionHint:
    """INNER or OUTER, from the loads of the kernel's loops over r (see [Note: outer
    reductions] in split_reduction.py)."""
    values = [s.value for loop in kernel.loops if loop.over_r for s in loop.body]
    loads = [e.index for e in ir.walk(*values) if isinstance(e, ir.Load)]
    return reduction_hint(loads, indexing.x, indexing.r)


# [Note: rows per program on CUDA]
# A persistent row is loaded once and kept in registers; how many rows a program holds trades
# the work each program has against how many programs fill the GPU. On the H100 (toycomp's
# softmax and layer_norm forward kernels, 15-20 (XBLOCK, num_warps) pairs each taking turns with
# Inductor's autotuned kernel) blocks of 2048 elements at 16 a thread were as fast as 4096 or
# faster: softmax 75648 x 197 (ViT's attention) 46.4 -> 45.3 us, 8192 x 512 16.0 -> 15.5,
# layer_norm 8192 x 2048 49.4 -> 48.6; 8192 x 1000 and x 768 moved within noise (27.4, 22.1 ->
# 22.6 us; 17.9 against 18.1 on 6304 rows) and rows of 4096 keep one a program. The interpreter
# keeps 4096: it runs each program in Python, so half the rows a program is twice the programs.
def reduction_blocks(numel: int | None, rnumel: int, outer: bool = False, cuda: bool = False
                     ) -> dict[str, int]:  # fmt: skip
    """Block sizes of a reduction of ``numel`` rows (None: unknown) of ``rnumel`` elements,
    ``outer``: contiguous along the rows (a column sum), launched on CUDA if ``cuda``; for a
    symbolic rnumel the generated wrapper calls it before each launch (see [Note: Triton with
    dynamic shapes])."""
    if outer:
        xblock = OUTER_XBLOCK if numel is None else min(OUTER_XBLOCK, next_power_of_2(numel))
        rblock = min(next_power_of_2(rnumel), max(1, OUTER_TILE // xblock))
        return _reduction_meta(xblock, rblock, per_warp=128)
    if rnumel <= PERSISTENT_MAX_RNUMEL:
        rblock = next_power_of_2(rnumel)
        xblock = max(1, (CUDA_BLOCK_ELEMENTS if cuda else BLOCK_ELEMENTS) // rblock)
        if numel is not None:
            xblock = min(next_power_of_2(numel), xblock)
    else:
        rblock, xblock = LOOPED_RBLOCK, 1
    return _reduction_meta(xblock, rblock)


def _reduction_meta(xblock: int, rblock: int, per_warp: int = 512) -> dict[str, int]:
    return {
        "XBLOCK": xblock,
        "RBLOCK": rblock,
        "num_warps": min(8, max(1, xblock * rblock // per_warp)),
    }


# [Note: autotuning candidates]
# On CUDA with static sizes, autotune.py times a few configs per kernel on its first launch and
# keeps the fastest (see [Note: autotuning] there). These are the candidates, per kernel kind,
# as Inductor's pointwise / persistent_reduction / reduction lists are; the first is always
# block_sizes' fixed config, the only one the interpreter (and a symbolic size) ever uses:
# * pointwise: XBLOCK 256 to 2048 with four or eight floats a thread, and Inductor's (512, 8
#   warps);
# * persistent reduction: the same RBLOCK (the whole row), fewer or more rows per program
#   (XBLOCK / 2, * 2 up to BLOCK_ELEMENTS, 1) or half / twice the warps: a long row may prefer
#   more threads on it;
# * looped reduction: RBLOCK 512 to 2048 per step, with 1 to 8 warps;
# * outer reduction: tiles as wide and short as today's [64, 8] or squarer: [32, 16], [64, 16].
# A candidate never needs other source: it keeps the kernel persistent or looped as it was (a
# reduction is persistent exactly when RBLOCK >= rnumel), clips XBLOCK and RBLOCK to the sizes,
# gives each thread at least one element, and is dropped if its larger blocks would need 64-bit
# indices where the fixed config has 32-bit ones. A kernel over fewer than AUTOTUNE_MIN_ELEMENTS
# keeps its fixed config: its time is the launch's, and each candidate costs a Triton compile.
POINTWISE_CANDIDATES = ((1024, 4), (512, 8), (2048, 8), (256, 2))  # (XBLOCK, num_warps)
LOOPED_CANDIDATES = ((2048, 4), (512, 1), (1024, 4), (2048, 8))  # (RBLOCK, num_warps)
OUTER_CANDIDATES = ((32, 16, 4), (128, 4, 4), (64, 16, 8), (128, 8, 8))  # (X, R, warps)
MAX_CANDIDATES = 6
AUTOTUNE_MIN_ELEMENTS = 2**16


def candidate_configs(
    kernel: ir.Kernel, fixed: dict | None = None, int64: bool | list | None = None
) -> list[dict[str, int]]:
    """The launch configs autotuning times for ``kernel`` on CUDA, ``block_sizes(kernel)``
    first; only that one when a size is symbolic, none for a symbolic rnumel (see [Note:
    autotuning candidates]). ``fixed`` and ``int64``: ``block_sizes`` and ``index_dtype``
    when the caller has them already."""
    fixed = block_sizes(kernel) if fixed is None else fixed
    sizes = (kernel.numel, kernel.rnumel)
    if not fixed or kernel.size_symbols() or not all(map(indexing.is_static, sizes)):
        return [fixed] if fixed else []
    if kernel.rows_per_program:  # (its grid follows RSPLIT, which is part of the graph)
        return [fixed]
    if kernel.numel * kernel.rnumel < AUTOTUNE_MIN_ELEMENTS:
        return [fixed]
    if "RBLOCK" not in fixed:
        shapes = [(x, 1, w) for x, w in POINTWISE_CANDIDATES]
    elif kernel_hint(kernel) == ReductionHint.OUTER:
        shapes = list(OUTER_CANDIDATES)
    elif fixed["RBLOCK"] >= kernel.rnumel:
        shapes = _persistent_shapes(fixed)
    else:
        shapes = [(1, r, w) for r, w in LOOPED_CANDIDATES]
    configs = [fixed]
    for xblock, rblock, warps in shapes:
        config = _clipped(kernel, fixed, xblock, rblock, warps)
        if config not in configs and _same_kind(kernel, fixed, config):
            configs.append(config)
    return _index_width_kept(kernel, fixed, configs[:MAX_CANDIDATES], int64)


def _persistent_shapes(fixed: dict[str, int]) -> list[tuple[int, int, int]]:
    x, r, w = fixed["XBLOCK"], fixed["RBLOCK"], fixed["num_warps"]
    rows = [n for n in (x // 2, x * 2, 1) if n and n * r <= BLOCK_ELEMENTS]
    other_rows = [(n, r, _reduction_meta(n, r)["num_warps"]) for n in rows]
    return [(x, r, max(1, w // 2)), (x, r, min(16, w * 2)), *other_rows]


def _clipped(kernel: ir.Kernel, fixed: dict, xblock: int, rblock: int, warps: int) -> dict:
    """One candidate with its blocks no larger than the sizes need, as ``fixed``'s keys."""
    xblock = min(xblock, next_power_of_2(kernel.numel))
    rblock = min(rblock, next_power_of_2(kernel.rnumel))
    warps = min(warps, max(1, xblock * rblock // 32))  # 32 threads a warp, >= 1 element each
    values = {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": warps}
    return {key: values[key] for key in fixed}


def _same_kind(kernel: ir.Kernel, fixed: dict, config: dict) -> bool:
    """Persistent (RBLOCK >= rnumel) exactly when ``fixed`` is: the source is one."""
    if "RBLOCK" not in fixed:
        return True
    return (config["RBLOCK"] >= kernel.rnumel) == (fixed["RBLOCK"] >= kernel.rnumel)


def _index_width_kept(kernel: ir.Kernel, fixed: dict, configs: list[dict], int64) -> list[dict]:
    """``configs`` less those whose larger blocks would need 64-bit indices when ``fixed``
    does not (indices only grow with the blocks, so one check with the largest decides)."""
    is_reduction = "RBLOCK" in fixed
    largest = {key: max(c[key] for c in configs) for key in fixed if key != "num_warps"}
    if all(largest[key] <= fixed[key] for key in largest):
        return configs
    if index_dtype(kernel, fixed, is_reduction) if int64 is None else int64:
        return configs
    if not index_dtype(kernel, largest, is_reduction):
        return configs
    return [c for c in configs if all(c[k] <= fixed[k] for k in largest)]


def index_dtype(kernel: ir.Kernel, blocks: dict, is_reduction: bool) -> bool | list:
    """Some index may leave int32's range (the masked lanes of the last block included):
    True, False, or, with symbolic sizes, the largest index magnitudes the kernel may
    compute, as expressions in the sizes: the wrapper decides at each call (see [Note:
    32-bit indices with symbolic sizes])."""
    k, b = kernel, blocks
    xblock = b.get("XBLOCK", BLOCK_ELEMENTS)  # (none: chosen per call, at most these)
    rblock = b.get("RBLOCK", max(LOOPED_RBLOCK, PERSISTENT_MAX_RNUMEL))
    rnumel = k.rnumel if not indexing.is_static(k.rnumel) else max(k.rnumel, 1)
    ranges = {
        indexing.x: k.numel + xblock,
        indexing.r: rnumel + (rblock if is_reduction else 1),
    }
    indices = [
        e.index
        for loop in k.loops
        for stmt in loop.body
        for e in (*ir.walk(stmt.value), stmt)
        if isinstance(e, (ir.Load, ir.IndexValue, ir.Store))
        and not any(map(indexing.is_scalar_symbol, sympy.sympify(e.index).free_symbols))
    ]  # (a float f0 made from the sizes is a value, not an index)
    largest: list = []
    for index in indices:
        index = sympy.sympify(index)
        bounds = indexing.index_bounds(index, ranges)
        if bounds is None:
            return True
        if all(indexing.is_static(v) for v in bounds):
            if max(-bounds[0], bounds[1]) >= 2**31 - 1:
                return True
            continue
        parts = [e for e in sympy.preorder_traversal(index) if e.is_Add or e.is_Mul]
        for part in [index, *parts]:
            magnitudes = _magnitudes(indexing.index_bounds(part, ranges))
            if magnitudes is None:
                return True
            largest += magnitudes
    return _largest(largest) or False


# [Note: 32-bit indices with symbolic sizes]
# 64-bit index arithmetic is slower on a GPU (a 64-bit division by a size, in ``x % s1``, is
# several times a 32-bit one), so kernels use int32 indices unless an index may leave its
# range. With static sizes that is decided here. With symbolic sizes the bound is an expression
# (``4*s0 + 1023``, the masked lanes of the last block and every sub-expression included), so
# the kernel takes ``INDEX_INT64: tl.constexpr`` and the wrapper passes ``max(...) >= 2**31 -
# 1`` evaluated on the call's sizes: Triton compiles the 64-bit variant only if some call needs
# it, and the source stays one.
def _magnitudes(bounds) -> list | None:
    """What bounds ``|index|`` (one or two expressions), or None if unknown."""
    if bounds is None:
        return None
    lo, hi = bounds
    if indexing.known_nonnegative(lo):
        return [hi]
    return [hi, -lo] if indexing.known_nonnegative(-lo) and indexing.known_nonnegative(hi) else None


def _largest(candidates: list) -> list:
    """``candidates`` without those another one is known to be at least as large as."""
    kept: list = []
    for c in dict.fromkeys(sympy.expand(c) for c in candidates):
        if any(indexing.known_nonnegative(k - c) for k in kept):
            continue
        kept = [k for k in kept if not indexing.known_nonnegative(c - k)] + [c]
    return kept


def index_dtype_arg(largest: list) -> str:
    """The wrapper's ``INDEX_INT64=...`` argument for a kernel with symbolic index bounds."""
    text = ", ".join(python_size(c) for c in largest)
    return f"INDEX_INT64={f'max({text})' if len(largest) > 1 else text} >= {2**31 - 1}"


def python_size(size) -> str:
    """A size as the wrapper's Python source: ``1000``, ``4*s0``."""
    return str(size) if indexing.is_static(size) else IndexPrinter().doprint(size)


# [Note: eviction policy]
# A reduction streams its input through the GPU's L2 cache: each element read once, along the
# reduced range. Marking such loads `evict_first` tells the cache to drop these lines first,
# keeping room for what is read again (a weight every row reads, the partial sums of a split
# reduction, a buffer the next loop of the kernel re-reads). Inductor marks the loads of
# looped reductions the same way (TritonKernel.load). Measured on an H100 with the L2 cleared
# between calls (triton.testing.do_bench), the 4096 x 4096 column sum took 33 us instead of
# 37 us (Inductor 35 us).
# Past the L2 cache, a load read once is better marked `evict_last`, on CUDA. Measured on the
# H100 (50 MB of L2; 7-9 rounds, the variants taking turns, do_bench clearing the L2 before
# each call as the kernel before it would leave it full): the row load of a persistent
# reduction so marked ran softmax and layer_norm forward on 8192 x 4096 (128 MB in) in 92.9
# and 92.8 us instead of 95.6 and 95.5 (Inductor 94.5 and 93.4, whose fastest config for
# these rows is a one-step loop whose load is `evict_last` too), and the loads of pointwise
# kernels ran sin²+cos² on 16M-64M floats and bias + GELU on 8192-16384 x 4096 0.8-1.4%
# faster. Smaller ones went the other way: sin²+cos² on 4M floats (16 MB in) 14.4 -> 16.5 us,
# the row softmax of 8192 x 1000 (33 MB) 25.0 -> 26.9 us. A likely reason: the hint keeps the
# input's lines and evicts the output's, which must then be written back to memory during the
# kernel, not after it; past the L2 they would be anyway. So the hint goes on exactly when the
# kernel's iteration space, in 4-byte elements, is larger than the GPU's L2 cache (static
# sizes only). With the hint, 16 warps on a persistent row of 4096 were 0.6 us slower than 8.
# `evict_first` was 1-3% slower in both kinds of kernel (but for one run of the 16M-float
# sin²+cos², 3% faster). The interpreter ignores hints, so its kernels (those the notebooks
# show) are generated without them.
L2_BYTES = 50 * 2**20  # the H100's L2 cache: the size when no GPU is there to ask


def past_l2(kernel: ir.Kernel) -> bool:
    """Whether ``kernel`` iterates over more 4-byte elements than the GPU's L2 cache holds."""
    elements = kernel.numel * kernel.rnumel
    if not indexing.is_static(elements):
        return False
    l2 = L2_BYTES
    if torch.cuda.is_available():
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return int(elements) * 4 > l2


def eviction_policy(index: sympy.Expr, looped_r: bool, persistent: bool, loaded_again: bool,
                    cuda_past_l2: bool = False) -> str | None:  # fmt: skip
    """The eviction hint of a load (None: the default): in a looped reduction, ``evict_first``
    for a load that streams through the loop over r (``looped_r``) and that no later loop
    reads (``loaded_again``), its index moving with both r and x (not a weight ``w[r]`` that
    every row reads, nor a per-row value); on CUDA past the L2 cache (``cuda_past_l2``),
    ``evict_last`` for the row of a ``persistent`` reduction and for a pointwise kernel's loads
    that move with x.

    >>> from toycomp.inductor.indexing import r, x
    >>> eviction_policy(r + 1024 * x, True, False, False), eviction_policy(r, True, False, False)
    ('evict_first', None)
    >>> eviction_policy(r + 4096 * x, False, True, False, cuda_past_l2=True)
    'evict_last'
    """
    free = sympy.sympify(index).free_symbols
    if not looped_r and cuda_past_l2:  # a pointwise kernel, or a persistent reduction's row
        moves = {indexing.x, indexing.r} <= free if persistent else indexing.x in free
        return "evict_last" if moves else None
    if not {indexing.x, indexing.r} <= free:
        return None
    return "evict_first" if looped_r and not loaded_again else None


