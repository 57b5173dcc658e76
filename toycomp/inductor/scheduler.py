"""Stage 4c: scheduling, ``ir.LoweredGraph`` -> ``ir.ScheduledGraph`` (fused kernels).

Input: the buffers of a LoweredGraph, each with a body over its own index variables. Output: a
list of steps, ``Kernel``s (fused groups of buffers, rewritten over the flat variables ``x`` and
``r``) and ``ExternKernel`` calls, plus the buffers that still need memory. Example: a row
softmax lowers to three buffers and schedules to ONE kernel over ``x < 8`` rows and ``r < 1000``
columns::

    >>> import torch
    >>> from toycomp.inductor.lowering import lower
    >>> from toycomp.prims.decompositions import decompose
    >>> aten, a = torch.ops.aten, torch.randn(8, 1000)
    >>> gm = torch.fx.symbolic_trace(lambda a: aten._softmax.default(a, -1, False))
    >>> lowered = lower(decompose(gm, [a]), [a])
    >>> lowered
    input a[8, 1000] torch.float32
    buf0[8] = amax[r<[1000]](load(a, 1000*i0 + r0))
    buf1[8] = sum[r<[1000]](exp(sub(load(a, 1000*i0 + r0), load(buf0, i0))))
    buf2[8, 1000] = div(exp(sub(load(a, 1000*i0 + i1), load(buf0, i0))), load(buf1, i0))
    return TensorArg(buffer='buf2', size=(8, 1000), stride=(1000, 1), offset=0)
    >>> print(format_scheduled(schedule(lowered)))
    allocate buf2[8, 1000] torch.float32
    kernel_0(numel=8, rnumel=1000):  # ('amax', 'broadcast_in_dim', 'sub', 'exp', 'sum_1', ...)
      for r:
        amax_buf0 = amax(load(a, r + 1000*x))
      for r:
        sum_buf1 = sum(exp(sub(load(a, r + 1000*x), amax_buf0)))
      for r:
        buf2[r + 1000*x] = div(exp(sub(load(a, r + 1000*x), amax_buf0)), sum_buf1)
    return TensorArg(buffer='buf2', size=(8, 1000), stride=(1000, 1), offset=0)

Only ``buf2`` is allocated: ``buf0`` and ``buf1`` live in registers (``Local``s).

NB: in PyTorch this lives in torch/_inductor/scheduler.py (``Scheduler.fuse_nodes``,
``can_fuse``, ``score_fusion``, ``FusedSchedulerNode``) and torch/_inductor/codegen/simd.py
(the ``(numel, rnumel)`` "groups" of Triton kernels).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import sympy
import torch

from toycomp.inductor import indexing, ir
from toycomp.inductor.indexing import unflatten_index
from toycomp.inductor.ir import ExternKernel, Pointwise, Reduction

# [Note: fusion]
# A kernel is a group of buffers that share one iteration space: ``x`` in range(numel) and
# ``r`` in range(rnumel). A Pointwise of size s has group (numel(s), 1), a Reduction
# (numel(size), numel(reduction_size)). A buffer joins a kernel of group (N, M) when:
#   * it fits: a Reduction must be (N, M) (or turn a pointwise (N, 1) group into (N, M));
#     a Pointwise is "per row" if numel == N (runs once per x) or "full" if its dims split into
#     an outer prefix of product N (read from x) and an inner suffix of product M (from r);
#   * every read of a buffer computed in the same kernel is at the SAME element that kernel
#     computes at (x, r): then the load is replaced by the producer's expression, the same
#     object for every consumer (a DAG: [Note: expressions are DAGs] in loop_body.py), or by
#     the ``Local`` holding a reduction's per-row result, so nothing inside a kernel ever loads a
#     value that the kernel writes: no read-before-write is possible. A read at a different
#     index (a transpose, a broadcast of a full tensor, a per-row read of a full tensor) makes
#     the buffer go to another kernel, and its producer is stored to memory;
#   * it is related (it reads what the kernel writes, or reads the same buffers), and every
#     other kernel it depends on runs earlier (kernels run in creation order, externs between).
# Among the kernels that accept it, a buffer joins the one it reads most from, else a new one.
# A buffer is stored (and allocated) only if it is a graph output or read outside its kernel.
# Inside a kernel, statements keep the buffer order; a new Loop starts when switching between
# per-row and per-r statements, or when a statement needs a Reduce of the current loop (so one
# r-loop may hold both Stores and Reduces: a stored producer and the sum that reads it).
# One exception to one iteration space: the partial column sums that the Triton split pass
# marks (``mix_order_rows``) join the row reduction over the same rows, as ``ColumnReduce``s
# summed over each program's rows (see [Note: mix-order reductions] in split_reduction.py).
# Limitation: "full" means outer dims -> x, inner dims -> r, so a *realized* producer of a
# reduction over outer dims (sum over dim 0) is not absorbed; it runs as its own kernel.
# (Unrealized producers are inlined into the Reduction's body by lowering anyway.)
# Inductor decides similarly (can_fuse: same group sizes, no reads at other indices;
# score_fusion: shared memory), but compares memory dependencies instead of index expressions.


@dataclass
class _Entry:
    """A buffer placed in a kernel: its body over (x, r) and the flat element it computes."""

    node: Pointwise | Reduction
    over_r: bool  # False: once per x (per-row node); True: once per (x, r)
    value: ir.Expr
    position: sympy.Expr  # contiguous flat index of the element computed at (x, r)
    reads: tuple[str, ...]  # buffer_reads(node), computed once

    @property
    def result(self) -> ir.Expr:
        """What a consumer in the same kernel reads instead of loading the buffer."""
        if isinstance(self.node, Reduction):
            return ir.Local(_local_name(self.node), self.node.dtype)
        return self.value


# [Note: pending stores]
# The store of a reduction's result waits until a statement other than a Reduce comes, so that
# consecutive reductions share one pass over r (LayerNorm's weight and bias gradients read the
# incoming gradient once); safe, since no statement of a kernel loads a buffer the kernel writes
# (see [Note: fusion]).
@dataclass
class _Group:
    """A kernel being built: the buffers fused over one iteration space (numel, rnumel)."""

    numel: int
    rnumel: int
    entries: list[_Entry] = field(default_factory=list)
    rows_per_program: int = 0  # [Note: mix-order reductions] in split_reduction.py

    def writes(self) -> set[str]:
        return {e.node.name for e in self.entries}

    def reads(self) -> set[str]:
        return {b for e in self.entries for b in e.reads}

    def step(self, name: str, stored: set[str]) -> ir.Kernel:
        """The kernel: the statements in Loops ([Note: pending stores]), ``stored`` stored."""
        statements, pending = [], []  # (over_r, statement); the reductions' Stores, waiting
        for e in self.entries:
            if isinstance(e.node, Reduction):  # a Reduce now, its Store pending
                _add_reduction(e, self, stored, statements, pending)
            elif e.node.name in stored:
                statements += pending + [(e.over_r, ir.Store(e.node.name, e.position, e.value))]
                pending.clear()
        loops = _split_loops(statements + pending)
        origins = tuple(dict.fromkeys(o for e in self.entries for o in e.node.origins))
        dtypes = _buffer_dtypes(loops, self)
        return ir.Kernel(
            name, self.numel, self.rnumel, loops, dtypes, origins, self.rows_per_program
        )


@dataclass
class _OwnStep(_Group):
    """An extern call, or a scatter's second kernel: a step of its own, fused with nothing."""

    node: ExternKernel | ir.Scatter | None = None
    ordered: bool = True  # a scatter's adds in the source's order ([Note: a scatter is ...])

    def writes(self) -> set[str]:
        if isinstance(self.node, ExternKernel):
            return {self.node.name, *self.node.buffers()}
        return {self.node.name}

    def reads(self) -> set[str]:
        if isinstance(self.node, ExternKernel):
            return set(buffer_reads(self.node))
        # the scatter writes into its init's copy, which must therefore be stored (see the Note)
        return {self.node.name, *_loads(*self.node.indirect, self.node.value)}

    def step(self, name: str, stored: set[str]) -> ir.Kernel | ExternKernel:
        """The extern call, or the scatter's kernel (named ``name``)."""
        if isinstance(self.node, ExternKernel):
            return self.node
        return _scatter_kernel(name, self.node, self.ordered)


# [Note: a scatter is a buffer written twice]
# ``scatter_add(a, 0, idx, src)`` is a copy of ``a`` into which each element of ``src`` is added
# at a position read from ``idx``. Lowering makes one ``ir.Scatter`` node, which defines its
# buffer like any other, and the scheduler gives it two steps: its ``init`` (the copy of ``a``)
# as an ordinary Pointwise buffer, fused like any other, always stored; then a kernel of its own
# (never fused: no other buffer joins it) whose Store at an indirect index writes (or adds to)
# that buffer. Buffers that read the result depend on the scatter's kernel, which is the
# buffer's last writer, so they run after it and never fuse into the copy. The wrapper and
# memory planning see a buffer allocated before its first kernel and written again by the
# second: it is never freed or reused between them (it is read later), and no kernel with an
# indirect index writes in place over a buffer it reads (memory_planning.py). The order: dim
# ``dim`` of the source (the one along which two elements may hit the same target) runs over
# r, in order, and the other dims over x, in parallel; so on the CPU every element's sum is
# added in the order of the source, the same on every run (Inductor's C++ backend uses atomic
# adds instead). Triton adds with ``tl.atomic_add``, and every element is its own x, as in
# Inductor: an embedding's gradient over r would be one program per column looping over every
# token (1.8 ms of a GPT step's 6.9 ms backward on an H200; Inductor's was not among its twelve
# slowest kernels). Under
# ``torch.use_deterministic_algorithms`` Triton too takes the ordered form.
def _scatter_kernel(name: str, node: ir.Scatter, ordered: bool = True) -> ir.Kernel:
    """The second step of a scatter (see the Note): its Store over (x, r), or over x alone."""
    size, dim = node.src_size, node.dim
    ivars = indexing.index_vars("i", len(size))
    if not ordered:
        mapping = dict(zip(ivars, unflatten_index(indexing.x, size)))
        return _scatter_store(name, node, mapping, indexing.numel(size), None)
    others = tuple(n for k, n in enumerate(size) if k != dim)
    outer = iter(unflatten_index(indexing.x, others))
    mapping = {v: indexing.r if k == dim else next(outer) for k, v in enumerate(ivars)}
    return _scatter_store(name, node, mapping, indexing.numel(others), size[dim])


def _scatter_store(name: str, node: ir.Scatter, mapping: dict, numel, rnumel) -> ir.Kernel:
    """The kernel storing the scatter's values at ``mapping``'s (x, r) element; over x alone
    where ``rnumel`` is None."""
    ranges = {indexing.x: numel} if rnumel is None else {indexing.x: numel, indexing.r: rnumel}
    value = ir.substitute(node.value, mapping)
    indirect = tuple(ir.substitute(v, mapping) for v in node.indirect)
    index = indexing.substitute(node.index, tuple(mapping.items()), tuple(ranges.items()))
    store = ir.Store(node.name, index, value, indirect, node.accumulate)
    loads = ir.walk(value, *indirect)
    dtypes = {e.buffer: e.dtype for e in loads if isinstance(e, ir.Load)} | {node.name: node.dtype}
    loops = (ir.Loop(over_r=rnumel is not None, body=(store,)),)
    return ir.Kernel(name, numel, 1 if rnumel is None else rnumel, loops, tuple(dtypes.items()),
                     node.origins)


def _loads(*exprs: ir.Expr) -> list[str]:
    return list(dict.fromkeys(e.buffer for e in ir.walk(*exprs) if isinstance(e, ir.Load)))


def schedule(lowered: ir.LoweredGraph, target: str = "cpp") -> ir.ScheduledGraph:
    """Fuse the buffers of ``lowered`` into kernels, run in order (see [Note: fusion]), for
    ``target``, "cpp" or "triton" (a scatter's form: [Note: a scatter is a buffer written twice])."""
    groups: list[_Group] = []
    for node in _live_nodes(lowered):
        _place(node, groups)
    ordered = target != "triton" or torch.are_deterministic_algorithms_enabled()
    for group in groups:
        if isinstance(group, _OwnStep):
            group.ordered = ordered
    stored = _stored_buffers(groups, lowered.outputs)
    steps: list[ir.Kernel | ExternKernel] = []
    for group in groups:  # kernels are numbered in order; extern calls run between them
        name = f"kernel_{sum(isinstance(s, ir.Kernel) for s in steps)}"
        steps.append(group.step(name, stored))
    allocations = [_allocation(e.node) for g in groups for e in g.entries if e.node.name in stored]
    return ir.ScheduledGraph(
        lowered.inputs, tuple(allocations), tuple(steps), lowered.outputs, lowered.device,
        lowered.constants, lowered.output_strides, lowered.scalars,
    )  # fmt: skip


def _add_own_step(node: ExternKernel | ir.Scatter, groups: list[_Group]) -> None:
    """A step fused with nothing; a scatter's copy first, placed as any other buffer."""
    if isinstance(node, ir.Scatter):  # its copy first ([Note: a scatter is a buffer written twice])
        _place(Pointwise(node.name, node.size, node.dtype, node.init, node.origins), groups)
    groups.append(_OwnStep(0, 0, node=node))


def buffer_reads(node: Pointwise | Reduction | ExternKernel) -> list[str]:
    """The buffers a lowered node reads, in first-use order."""
    if isinstance(node, (ExternKernel, ir.Scatter)):  # arguments, or a scatter's two bodies
        return _own_step_reads(node)
    return list(dict.fromkeys(e.buffer for e in ir.walk(node.body) if isinstance(e, ir.Load)))


def _own_step_reads(node: ExternKernel | ir.Scatter) -> list[str]:
    if isinstance(node, ir.Scatter):
        return _loads(*node.bodies())
    args = list(_flatten((node.args, [v for _, v in node.kwargs])))
    return list(dict.fromkeys(a.buffer for a in args if isinstance(a, ir.TensorArg)))


# --- grouping ------------------------------------------------------------------------------------
def _place(node: Pointwise | Reduction | ExternKernel | ir.Scatter, groups: list[_Group]) -> None:
    """Add ``node`` to the most related kernel that can take it, or to a new one."""
    if isinstance(node, (ExternKernel, ir.Scatter)):  # a step of its own
        return _add_own_step(node, groups)
    owner = {buf: k for k, g in enumerate(groups) for buf in g.writes()}
    reads = buffer_reads(node)
    first = max((owner[b] for b in reads if b in owner), default=0)  # the latest producer
    candidates = []  # (reads of what the kernel computes, reads in common, k): best last
    for k in range(first, len(groups)):
        deps = sum(owner.get(b) == k for b in reads)
        shared = len(groups[k].reads() & set(reads))
        if not isinstance(groups[k], _OwnStep) and deps + shared > 0:
            candidates.append((deps, shared, k))
    for _, _, k in sorted(candidates, reverse=True):
        if _fuse_into(groups, k, node):
            return
    group = _Group(*_node_group(node))  # a kernel of its own
    groups.append(dataclasses.replace(group, entries=[_make_entry(node, group, {})]))


def _node_group(node: Pointwise | Reduction) -> tuple[int, int]:
    rnumel = indexing.numel(node.reduction_size) if isinstance(node, Reduction) else 1
    return indexing.numel(node.size), rnumel


def _fuse_into(groups: list[_Group], k: int, node: Pointwise | Reduction) -> bool:
    """Add ``node`` to ``groups[k]`` (a new group in its place), if the fusion rules allow."""
    group = groups[k]
    numel, rnumel = _node_group(node)
    if isinstance(node, Pointwise) or _same_group((numel, rnumel), (group.numel, group.rnumel)):
        nodes, new = [node], dataclasses.replace(group, entries=list(group.entries))
    elif indexing.known_equal(group.rnumel, 1):  # a reduction makes it a reduction kernel
        nodes, new = [e.node for e in group.entries] + [node], _Group(numel, rnumel)
    elif _mixes_into(group, node):
        new = dataclasses.replace(group, entries=list(group.entries))
        nodes, new.rows_per_program = [node], node.mix_order_rows
    else:
        return False
    for n in nodes:
        entry = _make_entry(n, new, {e.node.name: e for e in new.entries})
        if entry is None:
            return False
        new.entries.append(entry)
    groups[k] = new
    return True


def _mixes_into(group: _Group, node: Reduction) -> bool:
    """``node``, the partial of a column sum over chunks of rows, fits ``group``, a row
    reduction over the same rows (see [Note: mix-order reductions] in split_reduction.py)."""
    rows = node.mix_order_rows
    if not rows or group.rows_per_program not in (0, rows):
        return False
    if not all(map(indexing.is_static, (group.numel, group.rnumel, *node.size))):
        return False
    if not any(isinstance(e.node, Reduction) for e in group.entries):
        return False
    programs, cols = node.size[0], indexing.numel(node.size[1:])
    return (group.numel, group.rnumel) == (programs * rows, cols)


def _is_column_partial(node, numel, rnumel) -> bool:
    """``node`` is a mix-order partial placed in a (numel, rnumel) row kernel."""
    return isinstance(node, Reduction) and not _same_group(_node_group(node), (numel, rnumel))


def _make_entry(node, group: _Group, fused: dict[str, _Entry]) -> _Entry | None:
    """``node`` over (x, r), loads of ``fused`` buffers replaced; None if it does not fit."""
    ranges = ((indexing.x, group.numel), (indexing.r, group.rnumel))
    ivars = indexing.index_vars("i", len(node.size))
    try:
        mapping, over_r = _index_mapping(node, ivars, group.numel, group.rnumel)
        value = ir.map_expr(node.body, lambda e: _rewrite(e, mapping, ranges, fused, group))
    except _NotFusable:
        return None
    own = indexing.linear_index(ivars, indexing.contiguous_strides(node.size))
    position = indexing.substitute(own, mapping, ranges)  # where (x, r)'s element is stored
    return _Entry(node, over_r, value, position, tuple(buffer_reads(node)))


class _NotFusable(Exception):
    pass


def _rewrite(e: ir.Expr, mapping, ranges, fused: dict, group: _Group) -> ir.Expr | None:
    """A load or index moved to the kernel's (x, r); a load of a ``fused`` buffer replaced."""
    if not isinstance(e, (ir.Load, ir.IndexValue)):
        return None
    e = dataclasses.replace(e, index=indexing.substitute(e.index, mapping, ranges))
    if isinstance(e, ir.Load) and e.buffer in fused:  # computed in this kernel
        return _fused_read(fused[e.buffer], e.index, group)
    return e


def _fused_read(producer: _Entry, index: sympy.Expr, group: _Group) -> ir.Expr:
    """What replaces a load of ``producer``'s buffer at ``index``, in ``group``'s kernel."""
    if sympy.expand(index - producer.position) != 0:
        raise _NotFusable  # another element than the one computed at (x, r)
    if _is_column_partial(producer.node, group.numel, group.rnumel):
        raise _NotFusable  # (known only after the program's last row)
    return producer.result


def _index_mapping(node, ivars: tuple, numel: int, rnumel: int) -> tuple[tuple, bool]:
    """``node``'s index variables in terms of (x, r), and whether it runs per (x, r) or per x."""
    if isinstance(node, Reduction):  # (split_reduction.py's mix-order partials too)
        return _reduction_mapping(node, ivars, numel, rnumel)
    if indexing.known_equal(indexing.numel(node.size), numel):  # per row
        return tuple(zip(ivars, unflatten_index(indexing.x, node.size))), False
    return _full_mapping(node, ivars, numel, rnumel)


def _reduction_mapping(node: Reduction, ivars: tuple, numel, rnumel) -> tuple[tuple, bool]:
    """A Reduction fits only its own group: its dims follow x, its reduced dims r."""
    if node.mix_order_rows and _is_column_partial(node, numel, rnumel):
        return _column_partial_mapping(node, ivars), True
    if not _same_group(_node_group(node), (numel, rnumel)):
        raise _NotFusable
    rvars = indexing.index_vars("r", len(node.reduction_size))
    index = unflatten_index(indexing.x, node.size)
    index += unflatten_index(indexing.r, node.reduction_size)
    return tuple(zip(ivars + rvars, index)), True


def _full_mapping(node: Pointwise, ivars: tuple, numel, rnumel) -> tuple[tuple, bool]:
    """A Pointwise run once per (x, r): its outer dims follow x, its inner ones r."""
    for k in range(len(node.size) + 1):
        outer, inner = node.size[:k], node.size[k:]
        split = (indexing.numel(outer), indexing.numel(inner))
        if indexing.known_less(1, rnumel) and _same_group(split, (numel, rnumel)):
            index = unflatten_index(indexing.x, outer) + unflatten_index(indexing.r, inner)
            return tuple(zip(ivars, index)), True
    raise _NotFusable


def _column_partial_mapping(node: Reduction, ivars: list) -> tuple:
    """A mix-order partial in its row kernel: the chunk follows x // rows, and so on."""
    rows, (r0,) = node.mix_order_rows, indexing.index_vars("r", 1)
    index = (indexing.FloorDiv(indexing.x, rows), indexing.modular(indexing.x, rows))
    index += unflatten_index(indexing.r, node.size[1:])
    return tuple(zip((ivars[0], r0, *ivars[1:]), index))


def _same_group(a: tuple, b: tuple) -> bool:
    """Equal (numel, rnumel) for every value of the size symbols (``4*s0`` is never ``s1``)."""
    return all(indexing.known_equal(m, n) for m, n in zip(a, b))



# --- which buffers survive -----------------------------------------------------------------------
def _live_nodes(lowered: ir.LoweredGraph) -> list:
    """The nodes some output depends on (dead buffers are dropped)."""
    live = {o.buffer for o in lowered.outputs if isinstance(o, ir.TensorArg)}
    kept = []
    for node in reversed(lowered.nodes):
        defined = node.buffers() if isinstance(node, ExternKernel) else (node.name,)
        if any(name in live for name in defined):
            kept.append(node)
            live.update(buffer_reads(node))
    return kept[::-1]


def _stored_buffers(groups: list[_Group], outputs) -> set[str]:
    """Buffers that must be in memory: graph outputs and buffers read by another step."""
    stored = {o.buffer for o in outputs if isinstance(o, ir.TensorArg)}
    computed_in = {e.node.name: k for k, g in enumerate(groups) for e in g.entries}
    for k, group in enumerate(groups):
        stored.update(b for b in group.reads() if computed_in.get(b, k) != k)
    return stored


def _allocation(node: Pointwise | Reduction) -> ir.AllocatedBuffer:
    stride = indexing.contiguous_strides(node.size)
    return ir.AllocatedBuffer(node.name, node.size, stride, node.dtype)


# --- kernels (``_Group.step`` writes the statements, in the order [Note: pending stores] gives) --
def _add_reduction(e: _Entry, group: _Group, stored: set[str], statements, pending) -> None:
    """A Reduce (or a mix-order ColumnReduce); its Store waits ([Note: pending stores])."""
    if _is_column_partial(e.node, group.numel, group.rnumel):
        statements.append((True, _column_reduce(e)))
        return
    local = ir.Local(_local_name(e.node), e.node.dtype)
    statements.append((True, ir.Reduce(local.name, e.node.reduction_type, e.value, local.dtype)))
    if e.node.name in stored:
        pending.append((False, ir.Store(e.node.name, e.position, local)))


def _column_reduce(e: _Entry) -> ir.ColumnReduce:
    kind, dtype = e.node.reduction_type, e.node.dtype
    return ir.ColumnReduce(e.node.name, e.position, kind, e.value, dtype)


def _split_loops(statements) -> tuple[ir.Loop, ...]:
    """Statements share a Loop unless over_r changes or one reads a Reduce of that Loop."""
    loops: list[ir.Loop] = []
    for over_r, stmt in statements:
        if loops and loops[-1].over_r == over_r and not _reads_reduce(stmt.value, loops[-1]):
            loops[-1] = ir.Loop(over_r, (*loops[-1].body, stmt))
        else:
            loops.append(ir.Loop(over_r, (stmt,)))
    return tuple(loops)


def _reads_reduce(value: ir.Expr, loop: ir.Loop) -> bool:
    """Does ``value`` read the result (a ``Local``) of one of ``loop``'s Reduces?"""
    reduced = {s.name for s in loop.body if isinstance(s, ir.Reduce)}
    return any(isinstance(e, ir.Local) and e.name in reduced for e in ir.walk(value))


def _buffer_dtypes(loops, group: _Group) -> tuple:
    dtypes = {e.node.name: e.node.dtype for e in group.entries}
    loads = ir.walk(*(s.value for loop in loops for s in loop.body))
    found = {e.buffer: e.dtype for e in loads if isinstance(e, ir.Load)}
    stores = [s for loop in loops for s in loop.body if not isinstance(s, ir.Reduce)]
    found.update({s.buffer: dtypes[s.buffer] for s in stores})
    return tuple(found.items())


def _local_name(node: Reduction) -> str:
    return f"{node.reduction_type.value}_{node.name}"  # "amax_buf0"


def _flatten(obj):
    if isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _flatten(o)
    else:
        yield obj


def format_scheduled(scheduled: ir.ScheduledGraph) -> str:
    """The steps of ``scheduled`` as readable pseudo-code (deterministic: fit for notebooks): the
    same text as ``repr(scheduled)``, each ``Kernel`` printing its ``Loop``s and statements."""
    return repr(scheduled)
