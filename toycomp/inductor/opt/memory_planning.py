"""Stage 4e, memory: which buffers the wrapper allocates, reuses, or lets an extern write into.

Input -> output: a ``ScheduledGraph`` and the step after which each intermediate buffer is dead
-> a ``MemoryPlan``: per step, the lines the wrapper writes before it (``AllocateLine``,
``ReuseLine``) and the buffers it deletes after it (``FreeIfNotReusedLine``), plus the extern
matmuls that write into a planned buffer through their ``out=`` variant. For ``gelu(a @ w +
b)`` the forward of a training step keeps ``a @ w + b`` for the backward; the matmul result
``buf0`` is dead once the kernel has read it, so the kernel writes the GELU over it (it reads
``buf0[x]`` where it writes ``buf1[x]``) and keeps ``a @ w + b`` in ``buf4``::

    buf0 = empty_strided((16, 64), (64, 1), dtype=torch.float32, device=device)
    buf0 = aten.mm.out(primals_1, reinterpret_tensor(primals_2, ...), out=buf0)
    buf0 = check_extern(buf0, (16, 64), (64, 1), torch.float32, 'buf0')
    buf1 = buf0  # reuse in place
    buf4 = empty_strided((16, 64), (64, 1), dtype=torch.float32, device=device)
    kernel_0(buf0.data_ptr(), primals_3.data_ptr(), buf1.data_ptr(), buf4.data_ptr())
    del buf0

Three (16, 64) buffers became two: the peak of the step is one buffer lower, as Inductor's.

NB: in PyTorch this lives in torch/_inductor/codegen/wrapper.py (``AllocateLine``,
``ReuseLine``, ``FreeIfNotReusedLine``, ``PythonWrapperCodegen.can_reuse``), the in-place
decision in torch/_inductor/scheduler.py (``SchedulerNode.decide_inplace_update``) and the
``out=`` calls in torch/_inductor/ir.py (``ExternKernelOut``); the pool-based planner that
Inductor can use instead is torch/_inductor/codegen/memory_planning.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from toycomp.inductor import indexing, ir

__all__ = [
    "AllocateLine", "FreeIfNotReusedLine", "MemoryPlan", "ReuseLine", "last_uses", "plan_memory"
]

# [Note: memory planning]
# Every intermediate buffer lives from the step that first writes it to the step that last
# reads it (``last_uses``); after that, ``del bufN`` hands its memory back to PyTorch's
# allocator. The plan does better in four ways, each only where it is safe:
#
# 1. Reuse. A later allocation with the same dtype and the same number of elements (both
#    contiguous; with dynamic shapes, the same size expression: ``4*s0`` equals ``4*s0``, never
#    "probably") takes the dead buffer instead of calling ``empty_strided``: ``buf7 = buf3;
#    del buf3  # reuse`` (``reinterpret_tensor`` when the shapes differ).
#    The dead buffer's ``del`` is then skipped (Inductor's FreeIfNotReusedLine). The values
#    left in it are garbage to the new owner, which is no different from ``empty_strided``.
# 2. In place. A pointwise kernel may write an output over an input that dies in that kernel,
#    when it reads that input only at the very index where it writes the output: each element
#    is loaded (the loads section of the generated loop) before it is stored (the stores
#    section), and no other iteration touches it. The MLP's GELU kernel writes ``addmm`` over
#    the matmul it reads: one (batch, hidden) buffer fewer at the step's peak. Not on CUDA:
#    on the lent H100 the GPT step's GELU-backward kernel (16384 x 1536) took 0.27 ms writing
#    over its input and 0.14 ms writing a fresh buffer, and the caching allocator already
#    hands a freed block to the next allocation of its size, so in place would buy memory
#    with time there.
# 3. ``out=``. An extern matmul (``aten.mm``, ``aten.bmm``) whose result is contiguous writes
#    into a planned buffer through its out variant, so its result can be reused and reuse an
#    earlier dead buffer too; ``check_extern`` still checks what the call returned.
# 4. Inputs. ``call(args)`` empties ``args`` after unpacking it and deletes each input after
#    its last use. That frees nothing while the caller holds the tensor (a parameter, the
#    user's input), but the AOT backward hands over the activations the forward saved
#    (``CompiledGraph.call_boxed``, after clearing the autograd node's saved tensors): the
#    MLP's saved ``addmm`` is freed before its weight gradients are allocated, as eager's
#    autograd frees a node's saved tensors once the node has run. Inputs are never reused.
#
# A buffer is never given away when something may still see its memory:
# - a graph input (the caller's), a constant or a graph output (it outlives the call);
# - a buffer the wrapper did not allocate itself: an extern's result may be a view of its
#   argument or share storage with other results (``aten.split``), only planned buffers are
#   known to own their storage alone;
# - a buffer passed to an extern other than a matmul: a fallback may return a view of it
#   (``reinterpret_tensor`` makes the same storage reachable under the result's name), so its
#   memory may be live after its own name's last use;
# - a buffer still read by a later step: it is dead only after its last use, and a donor for
#   an extern call or a non-in-place kernel must be dead BEFORE that step starts.
OUT_VARIANTS = {"aten.mm.default": "aten.mm.out", "aten.bmm.default": "aten.bmm.out"}


@dataclass(frozen=True)
class Layout:
    """What a planned buffer is: size, stride, dtype (all on the graph's device)."""

    size: tuple
    stride: tuple
    dtype: object

    def key(self) -> tuple:
        """Buffers with equal keys can take each other's memory: dtype and element count (the
        storage size of a contiguous buffer, ``4*s0`` with dynamic shapes)."""
        return (self.dtype, sympy.expand(sympy.Mul(*map(sympy.sympify, self.size))))

    def plannable(self) -> bool:
        """Contiguous (so its storage holds exactly its elements) and not empty."""
        return _is_contiguous(self.size, self.stride) and self.key()[1] != 0


@dataclass(frozen=True)
class AllocateLine:
    """``bufN = empty_strided(...)``: fresh memory."""

    name: str
    layout: Layout

    def codegen(self, render_tuple) -> str:
        size, stride = render_tuple(self.layout.size), render_tuple(self.layout.stride)
        args = f"{size}, {stride}, dtype={self.layout.dtype}, device=device"
        return f"{self.name} = empty_strided({args})"


@dataclass(frozen=True)
class ReuseLine:
    """``bufN = bufM``: take the memory of the dead ``bufM``. In place, ``bufM`` is still read
    by the step it dies in, so its ``del`` stays after that step."""

    name: str
    layout: Layout
    donor: str
    donor_layout: Layout
    in_place: bool = False

    def codegen(self, render_tuple) -> str:
        value = self.donor
        if (self.layout.size, self.layout.stride) != (
            self.donor_layout.size,
            self.donor_layout.stride,
        ):
            size, stride = render_tuple(self.layout.size), render_tuple(self.layout.stride)
            value = f"reinterpret_tensor({self.donor}, {size}, {stride}, 0)"
        if self.in_place:
            return f"{self.name} = {value}  # reuse in place"
        return f"{self.name} = {value}; del {self.donor}  # reuse"


@dataclass(frozen=True)
class FreeIfNotReusedLine:
    """``del bufN, bufM`` after the last step that uses them, less those a ``ReuseLine`` takes
    later (their ``del`` is written there)."""

    names: tuple[str, ...]

    def codegen(self) -> str:
        return f"del {', '.join(self.names)}"


@dataclass
class MemoryPlan:
    """Per step ``i``: ``before[i]`` (allocations and reuses), ``after[i]`` (frees), and the
    extern steps that write into their planned buffer (``out_variants``: name -> out op)."""

    before: list[list[AllocateLine | ReuseLine]]
    after: list[FreeIfNotReusedLine | None]
    out_variants: dict[str, str] = field(default_factory=dict)

    def reuses(self) -> list[ReuseLine]:
        return [line for lines in self.before for line in lines if isinstance(line, ReuseLine)]


def last_uses(graph: ir.ScheduledGraph, keep: set[str]) -> dict[str, int]:
    """Step index after which each buffer is dead: its last read or write by a kernel, or its
    last mention by an extern call. Outputs and the names in ``keep`` are never dead (a
    ``del`` of a constant would make it a local of ``call``)."""
    keep = keep | {o.buffer for o in graph.outputs if isinstance(o, ir.TensorArg)}
    last: dict[str, int] = {}
    for i, step in enumerate(graph.steps):
        if isinstance(step, ir.Kernel):
            used = [*step.reads(), *step.writes()]
        else:
            used = [step.name, *step.buffers(), *_tensor_args((step.args, step.kwargs))]
        for name in used:
            last[name] = i
    return {b: i for b, i in last.items() if b not in keep}


def plan_memory(
    graph: ir.ScheduledGraph, last_use: dict[str, int], reuse: bool = True, in_place: bool = True
) -> MemoryPlan:
    """The memory plan of ``graph`` (see [Note: memory planning]).

    Args:
        graph: the scheduler's result.
        last_use: step index after which each intermediate buffer is dead (inputs, constants
            and outputs absent).
        reuse: False gives the unplanned wrapper (allocate everything, ``del`` at last use).
        in_place: whether kernels may write over an input dying in them (point 2 of the Note).
    """
    planner = _Planner(graph, last_use, reuse, in_place)
    before = [planner.allocate_for(i, step) for i, step in enumerate(graph.steps)]
    after = [[d for d in names if d not in planner.taken] for names in planner.dying]
    frees = [FreeIfNotReusedLine(tuple(names)) if names else None for names in after]
    return MemoryPlan(before, frees, planner.out_variants)


class _Planner:
    """Walks the steps in order, keeping a pool of dead buffers (by ``Layout.key()``)."""

    def __init__(
        self, graph: ir.ScheduledGraph, last_use: dict[str, int], reuse: bool, in_place: bool
    ) -> None:
        steps = graph.steps
        self.out_variants = {s.name: OUT_VARIANTS[s.kernel] for s in steps if _writes_out(s)}
        if not reuse:
            self.out_variants = {}
        self.layouts = {a.name: Layout(a.size, a.stride, a.dtype) for a in graph.allocations}
        for s in steps:
            if s.name in self.out_variants:
                self.layouts[s.name] = Layout(s.size, s.stride, s.dtype)
        self.donors = {n for n, lay in self.layouts.items() if lay.plannable()} & set(last_use)
        self.donors = self.donors if reuse else set()
        self.donors -= _maybe_aliased(graph)
        self.dying: list[list[str]] = [[] for _ in steps]
        for name, i in last_use.items():
            self.dying[i].append(name)
        # Outputs must stay base tensors (a view made inside an autograd.Function cannot be
        # modified in place by the caller): they take a donor only as it is, never reinterpreted.
        self.outputs = {o.buffer for o in graph.outputs if isinstance(o, ir.TensorArg)}
        self.views: set[str] = set()  # planned buffers that are reinterpret_tensor views
        self.pool: dict[tuple, list[str]] = {}
        self.taken: set[str] = set()  # reused from the pool: their del is in the ReuseLine
        self.unallocated = {a.name for a in graph.allocations}
        self.in_place = in_place

    def allocate_for(self, i: int, step) -> list[AllocateLine | ReuseLine]:
        """The lines before step ``i``; then the buffers dying in it join the pool."""
        new = []
        if isinstance(step, ir.Kernel):
            new = [n for n in step.writes() if n in self.unallocated]
            self.unallocated -= set(new)
        elif step.name in self.out_variants:
            new = [step.name]
        dying = [d for d in self.dying[i] if d in self.donors]
        lines = [self.allocate(name, step, dying) for name in new]
        for d in dying:  # (less those taken in place by allocate)
            self.pool.setdefault(self.layouts[d].key(), []).append(d)
        return lines

    def allocate(self, name: str, step, dying: list[str]) -> AllocateLine | ReuseLine:
        """In place over a buffer dying in this kernel, else the most recently freed dead
        buffer of the pool, else fresh memory."""
        layout = self.layouts[name]
        if not layout.plannable():
            return AllocateLine(name, layout)
        if isinstance(step, ir.Kernel) and self.in_place:
            fits = [d for d in dying if self.fits(d, name)]
            donor = inplace_donor(step, name, fits, self.layouts)
            if donor is not None:
                dying.remove(donor)  # its memory is name's now: not into the pool
                return self.reuse(name, donor, in_place=True)
        free = [d for d in self.pool.get(layout.key(), []) if self.fits(d, name)]
        if free:
            self.pool[layout.key()].remove(free[-1])
            self.taken.add(free[-1])
            return self.reuse(name, free[-1], in_place=False)
        return AllocateLine(name, layout)

    def fits(self, donor: str, name: str) -> bool:
        if self.layouts[donor].key() != self.layouts[name].key():
            return False
        same = self.layouts[donor] == self.layouts[name] and donor not in self.views
        return same or name not in self.outputs

    def reuse(self, name: str, donor: str, in_place: bool) -> ReuseLine:
        line = ReuseLine(name, self.layouts[name], donor, self.layouts[donor], in_place)
        if donor in self.views or self.layouts[donor] != self.layouts[name]:
            self.views.add(name)
        return line


def inplace_donor(kernel: ir.Kernel, name: str, dying: list[str], layouts) -> str | None:
    """A buffer among ``dying`` (dead after ``kernel``) that ``kernel`` may overwrite with
    ``name``: the kernel is pointwise (one loop, no reduction), stores ``name`` once, and
    loads the donor only at that store's index (so at the same address: both buffers start at
    offset 0 of one storage and have one dtype). See [Note: memory planning], point 2."""
    if kernel.rnumel != 1 or len(kernel.loops) != 1 or kernel.loops[0].over_r:
        return None
    body = kernel.loops[0].body
    stores = [s for s in body if isinstance(s, ir.Store) and s.buffer == name]
    if len(stores) != 1 or any(not isinstance(s, ir.Store) for s in body):
        return None
    loads = [e for e in ir.walk(*(s.value for s in body)) if isinstance(e, ir.Load)]
    if any(e.indirect for e in loads) or kernel.scatters():
        return None  # an indirect index may read any element: never in place
    for donor in dying:
        if donor in kernel.writes() or layouts[donor].key() != layouts[name].key():
            continue
        indices = {e.index for e in loads if e.buffer == donor}
        if indices == {stores[0].index}:
            return donor
    return None


def _writes_out(step) -> bool:
    """An extern matmul whose result is contiguous: it can write into a planned buffer."""
    if not isinstance(step, ir.ExternKernel) or step.kernel not in OUT_VARIANTS or step.outputs:
        return False
    return _is_contiguous(step.size, step.stride)


def _is_contiguous(size, stride) -> bool:
    expected = indexing.contiguous_strides(tuple(size))
    return all(indexing.known_equal(s, e) for s, e in zip(stride, expected))


def _maybe_aliased(graph: ir.ScheduledGraph) -> set[str]:
    """Buffers passed to an extern that may return a view of them (any but a matmul)."""
    seen: set[str] = set()
    for step in graph.steps:
        if isinstance(step, ir.ExternKernel) and step.kernel not in OUT_VARIANTS:
            seen.update(_tensor_args((step.args, step.kwargs)))
    return seen


def _tensor_args(value) -> list[str]:
    if isinstance(value, ir.TensorArg):
        return [value.buffer]
    if isinstance(value, (list, tuple)):
        return [b for v in value for b in _tensor_args(v)]
    return []
