"""The glue: ``toycomp.compile`` and the ``torch.compile(backend="toycomp")`` entry point.

Input -> output: a Python function or ``nn.Module`` -> a callable with the same results and
gradients. The pipeline is a flat list of named stage calls; every stage's result is kept in a
``CompiledEntry`` so that ``toycomp.explain`` can show it::

    capture    fn          -> torch-level graphs + guards + resume functions capture/convert_frame.py
    aot        each graph  -> joint / forward / backward ATen graphs       aot/aot_autograd.py
    decompose  ATen graph  -> prims graph (+ extern calls, fallbacks)      prims/decompositions.py
    lower      prims graph -> loop IR buffers                              inductor/lowering.py
    schedule   loop IR     -> fused kernels                                inductor/scheduler.py
    compile    kernels     -> C++ / Triton source, compiled and cached     inductor/wrapper.py

    >>> import torch, toycomp
    >>> f = toycomp.compile(lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2)
    >>> f(torch.zeros(3))
    tensor([1., 1., 1.])
    >>> len(f.entries), f.entries[0].graphs[0].compiled.kernels[0].backend
    (1, 'cpp')

With ``capture="bytecode"`` (the default) capture runs on fake tensors and calls
``GraphCompiler`` on each graph it makes: stages 2-4 also run on the fakes, and the compiled
code runs on the real inputs. ``capture="tracer"`` is the naive run-once tracer of notebook 01
(capture/tracer.py), with its own guarded cache below (``OptimizedFunction``, ``build``).

NB: in PyTorch this glue is torch/_dynamo/eval_frame.py (the guarded cache of compiled frames),
torch/_functorch/aot_autograd.py (aot_module_simplified) and torch/_inductor/compile_fx.py
(compile_fx, compile_fx_inner).
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx

from toycomp._torch_compat import tree_flatten
from toycomp._torch_compat import fake_on_device
from toycomp.capture.captured_graph import CapturedGraph
from toycomp.capture.convert_frame import CompileContext
from toycomp.capture.tracer import capture
from toycomp.aot.aot_autograd import aot_function
from toycomp.aot.partitioners import default_partition, min_cut_rematerialization_partition
from toycomp.aot.runtime_wrappers import AOTOutput
from toycomp.prims.decompositions import decompose, fallbacks
from toycomp.inductor.ir import LoweredGraph, ScheduledGraph
from toycomp.inductor.lowering import lower
from toycomp.inductor.scheduler import schedule
from toycomp.inductor.wrapper import BACKENDS, CompiledGraph, compile_graph

# How AOT splits the joint graph: "min_cut" saves less and recomputes cheap pointwise work in the
# backward (TorchInductor's choice); "default" saves every forward value the backward reads.
PARTITIONS = {"default": default_partition, "min_cut": min_cut_rematerialization_partition}
# Stage 1: "bytecode" interprets fn's bytecode (a small Dynamo: partial graphs, resume
# functions, replayed side effects); "tracer" runs fn once under a TorchFunctionMode (the
# naive version that notebook 01 starts from).
CAPTURES = ("bytecode", "tracer")
DEFAULT_CAPTURE = "bytecode"
# Like Dynamo's cache_size_limit: past this many graphs for one function, run it eagerly.
RECOMPILE_LIMIT = 8


def resolve_backend(backend: str | None, example_inputs: Sequence[Any]) -> str:
    """``None`` picks Triton for CUDA tensors and C++ for CPU tensors (DESIGN.md)."""
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"toycomp: unknown backend {backend!r}; choose one of {BACKENDS}")
        return backend
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
    return "triton" if on_cuda else "cpp"


@dataclass
class GraphArtefacts:
    """What stages 3 and 4 made of one ATen graph (the forward or the backward)."""

    name: str
    aten: torch.fx.GraphModule
    prims: torch.fx.GraphModule
    fallbacks: list[str]
    lowered: LoweredGraph
    scheduled: ScheduledGraph
    compiled: CompiledGraph


def inductor_compiler(
    backend: str | None, name: str, record: list[GraphArtefacts]
) -> Callable[[torch.fx.GraphModule, list[torch.Tensor]], CompiledGraph]:
    """An AOT compiler (``compiler(gm, example_inputs) -> callable``) running stages 3 and 4."""

    def compiler(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> CompiledGraph:
        prims_gm = decompose(gm, example_inputs)
        lowered = lower(prims_gm, example_inputs)
        scheduled = schedule(lowered)
        compiled = compile_graph(scheduled, resolve_backend(backend, example_inputs))
        record.append(
            GraphArtefacts(name, gm, prims_gm, fallbacks(prims_gm), lowered, scheduled, compiled)
        )
        return compiled

    return compiler


def compile_stages_2_to_4(
    gm: torch.fx.GraphModule, example_inputs: list, backend: str | None, partition: str
) -> tuple[AOTOutput, list[GraphArtefacts]]:
    """AOT (joint graph, partition) with stages 3-4 as its forward and backward compilers."""
    graphs: list[GraphArtefacts] = []
    aot = aot_function(
        gm,
        list(example_inputs),
        fw_compiler=inductor_compiler(backend, "forward", graphs),
        bw_compiler=inductor_compiler(backend, "backward", graphs),
        partition_fn=PARTITIONS[partition],
    )
    return aot, graphs


@dataclass
class CompiledEntry:
    """One compiled version of a function, valid while its guards hold.

    ``eager_reason`` says why the graph runs eagerly instead (AOT refused a construct, e.g.
    ``resize_`` of an input); ``first_outputs`` holds, in a 1-tuple, the capture run's result
    when that run has to stand for the first call ([Note: the capture run cannot be undone]).
    """

    captured: CapturedGraph
    aot: AOTOutput | None
    graphs: list[GraphArtefacts] = field(default_factory=list)
    eager_reason: str | None = None
    first_outputs: tuple | None = field(default=None, repr=False)

    def run(self, flat_inputs: list[torch.Tensor]) -> Any:
        return self.captured.unflatten_outputs(self.aot(*flat_inputs))

    def take_first_outputs(self) -> tuple | None:
        """``first_outputs``, once (then the entry holds no tensors of that call)."""
        outputs, self.first_outputs = self.first_outputs, None
        return outputs


def check_choices(backend: str | None, partition: str, capture: str = DEFAULT_CAPTURE) -> None:
    """Reject unknown backend / partition names when compile() is called, not at the first call."""
    resolve_backend(backend, ())
    if capture not in CAPTURES:
        raise ValueError(f"toycomp: unknown capture {capture!r}; choose one of {CAPTURES}")
    if partition not in PARTITIONS:
        choices = list(PARTITIONS)
        raise ValueError(f"toycomp: unknown partition {partition!r}; choose one of {choices}")


def build(
    fn: Callable, args: tuple, kwargs: dict, backend: str | None, partition: str = "min_cut"
) -> CompiledEntry:
    """Run every stage once on these example inputs (a graph break stops after capture).

    An entry's ``eager_reason`` is set when AOT refuses the graph (NotImplementedError: an
    unsupported construct); ``first_outputs`` when the capture run stands for this call.
    """
    before = {id(t): _undoable_state(t) for t in tree_flatten((args, kwargs))[0]
              if isinstance(t, torch.Tensor)}  # fmt: skip
    captured = capture(fn, *args, **kwargs)
    if captured.graph_break is not None:
        return CompiledEntry(captured, None)  # capture already undid fn's side effects
    examples, first_outputs = captured.example_inputs, None
    # [Note: the capture run cannot be undone]
    # Capturing ran fn for real; we undo its in-place writes and RNG draws so that the compiled
    # code, which runs this same call next, applies them exactly once. Undo restores values
    # only. An in-place op under autograd on an input (x.mul_(2) on x = a * 1) also gave it a
    # new autograd history, and t_ / unsqueeze_ / resize_ changed its shape or storage: none
    # of that can be put back, and running the compiled code (or fn) again would apply it
    # twice. Then the capture run *is* this call (it ran eagerly, once): its outputs are
    # returned, and the compiled code (or fn, eagerly) runs from the next call on.
    if any(_undoable_state(t) != before[id(t)] for t in examples if id(t) in before):
        first_outputs, captured.side_effects = (captured.example_outputs,), None
    else:
        captured.undo_side_effects()
    # [Note: entries hold metadata, not tensors] The example tensors belong to the caller:
    # a cached entry must not keep them (or the first call's outputs) alive.
    captured.example_inputs, captured.example_outputs = [], None
    try:
        aot, graphs = compile_stages_2_to_4(captured.gm, examples, backend, partition)
    except NotImplementedError as e:  # an unsupported construct: the graph runs eagerly
        return CompiledEntry(captured, None, eager_reason=str(e), first_outputs=first_outputs)
    return CompiledEntry(captured, aot, graphs, first_outputs=first_outputs)


def _undoable_state(t: torch.Tensor) -> tuple:
    """What undoing the capture run cannot restore: autograd history, metadata, storage."""
    storage = t.untyped_storage().data_ptr()
    return t.grad_fn, t.shape, t.stride(), t.storage_offset(), storage


@dataclass
class FrameGraph:
    """One graph from the bytecode capture, where ``CompiledEntry.captured`` expects a
    ``CapturedGraph``: the torch-level graph (its guards belong to the frame; see explain)."""

    gm: torch.fx.GraphModule
    guards: tuple = ()
    graph_break: Any = None


class GraphCompiler:
    """The bytecode capture's backend: stages 2-4 on each captured graph, on fake tensors.

    ``compile_frame`` calls it with a torch-level graph and fake example inputs (capture never
    touches the user's data); AOT traces the joint graph under the same fake mode, stages 3-4
    read shapes, strides and dtypes from the fakes, and the compiled code it returns then runs
    on the real inputs. A graph AOT refuses (NotImplementedError) runs as captured, with a
    warning, and is kept in ``eager``.
    """

    def __init__(self, backend: str | None, partition: str, name: str = "fn") -> None:
        self.backend, self.partition, self.name = backend, partition, name
        self.entries: list[CompiledEntry] = []  # compiled by stages 2-4
        self.eager: list[CompiledEntry] = []  # refused by AOT: they run as captured
        self.log: list[CompiledEntry] = []  # both, in compile order

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        on_meta = any(t.device.type == "meta" for t in example_inputs)
        if on_meta:  # toycomp.explain on meta inputs: compile as for CPU tensors, run nothing
            example_inputs = [fake_on_device(t, torch.device("cpu")) for t in example_inputs]
        try:
            aot, graphs = compile_stages_2_to_4(gm, example_inputs, self.backend, self.partition)
        except NotImplementedError as e:  # an unsupported construct: the graph runs eagerly
            self.eager.append(CompiledEntry(FrameGraph(gm), None, eager_reason=str(e)))
            self.log.append(self.eager[-1])
            warnings.warn(f"toycomp: a graph of {self.name} runs eagerly ({e})", stacklevel=2)
            return gm.forward
        self.entries.append(CompiledEntry(FrameGraph(gm), aot, graphs))
        self.log.append(self.entries[-1])
        if on_meta:
            return gm.forward  # (generated kernels cannot run on meta tensors)
        return aot

    @property
    def compile_count(self) -> int:
        return len(self.entries) + len(self.eager)


def frame_target(fn: Callable) -> Callable:
    """What the bytecode capture interprets: a module's ``forward``, or ``fn`` itself."""
    return fn.forward if isinstance(fn, torch.nn.Module) else fn


class OptimizedFunction:
    """What ``toycomp.compile(fn)`` returns: a guarded cache of compiled versions of ``fn``.

    Each call takes the first entry whose guards hold, or captures and compiles a new one; past
    ``RECOMPILE_LIMIT`` entries, or at a graph break, ``fn`` runs eagerly from then on.

    NB: Dynamo's counterpart is what ``torch.compile(fn)`` returns (torch/_dynamo/eval_frame.py:
    the wrapper ``_TorchDynamoContext.__call__`` makes, ``OptimizedModule`` for an nn.Module),
    whose cache is the list of ``CacheEntry``s (guards + compiled code) kept on ``fn``'s code
    object, capped by ``torch._dynamo.config.cache_size_limit``. (The ``CompiledFunction`` of
    toycomp/aot/runtime_wrappers.py is another thing: AOTAutograd's ``autograd.Function``.)
    """

    def __init__(
        self,
        fn: Callable,
        backend: str | None,
        partition: str = "min_cut",
        capture: str = DEFAULT_CAPTURE,
    ) -> None:
        self.fn = fn
        self.backend = backend
        self.partition = partition
        self.capture = capture
        self.entries: list[CompiledEntry] = []
        self._eager_reason: str | None = None  # set once toycomp gave up on fn
        self.frame: Callable | None = None  # capture="bytecode": compile_frame's callable
        if capture == "bytecode":
            name = getattr(fn, "__qualname__", type(fn).__name__)
            self.compiler = GraphCompiler(backend, partition, name)
            self.entries = self.compiler.entries
            self.context = CompileContext(self.compiler, RECOMPILE_LIMIT)
            self.frame = self.context.frame_for(frame_target(fn))

    @property
    def compile_count(self) -> int:
        """How many graphs went through stages 2-4 (Dynamo: ``frame_count`` of compiled code)."""
        return self.compiler.compile_count if self.frame is not None else len(self.entries)

    @property
    def eager_reason(self) -> str | None:
        """Why (part of) ``fn`` runs eagerly: toycomp gave up on it, or AOT refused a graph."""
        if self.frame is None:
            return self._eager_reason
        reasons = [e.eager_reason for e in self.compiler.eager]
        reasons += [r.break_reason for r in self.context.log
                    if r.break_reason and r.break_reason.startswith("frame skipped")]  # fmt: skip
        return "; ".join(reasons) or None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.frame is not None:
            return self.frame(*args, **kwargs)
        if self._eager_reason is not None:
            return self.fn(*args, **kwargs)
        for entry in self.entries:
            flat_inputs = entry.captured.guarded_inputs(args, kwargs)  # None: a guard failed
            if flat_inputs is not None:
                return entry.run(flat_inputs)
        return self._recompile(args, kwargs)

    def _recompile(self, args: tuple, kwargs: dict) -> Any:
        if len(self.entries) >= RECOMPILE_LIMIT:
            return self._give_up(f"more than {RECOMPILE_LIMIT} recompilations", args, kwargs)
        entry = build(self.fn, args, kwargs, self.backend, self.partition)
        if entry.captured.graph_break is not None:
            return self._give_up(f"graph break: {entry.captured.graph_break}", args, kwargs)
        first_outputs = entry.take_first_outputs()
        if entry.eager_reason is not None:
            return self._give_up(entry.eager_reason, args, kwargs, first_outputs)
        self.entries.append(entry)
        if first_outputs is not None:
            return first_outputs[0]
        return entry.run(entry.captured.flatten_inputs(*args, **kwargs))

    def _give_up(
        self, reason: str, args: tuple, kwargs: dict, first_outputs: tuple | None = None
    ) -> Any:
        """Run ``fn`` eagerly from now on (this call too, unless capture already ran it)."""
        self._eager_reason = reason
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        warnings.warn(f"toycomp: running {name} eagerly ({reason})", stacklevel=3)
        if first_outputs is not None:
            return first_outputs[0]
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        graphs = f"{len(self.entries)} graphs"
        state = f"eager: {self.eager_reason}" if self.eager_reason else graphs
        return f"<toycomp.compile of {name} ({state})>"


def compile(  # noqa: A001 (torch.compile's name)
    fn: Callable,
    backend: str | None = None,
    partition: str = "min_cut",
    capture: str | None = None,
) -> OptimizedFunction:
    """Compile ``fn`` (a function or ``nn.Module``) with toycomp's whole pipeline.

    Args:
        fn: what to compile; it is traced on the first call's inputs.
        backend: ``"cpp"``, ``"triton"`` or ``None`` (Triton for CUDA tensors, C++ for CPU ones;
            Triton on CPU tensors runs through Triton's interpreter).
        partition: ``"min_cut"`` (save little for the backward, recompute cheap pointwise ops)
            or ``"default"`` (save every forward value the backward reads).
        capture: ``"bytecode"`` (interpret ``fn``'s bytecode on fake tensors: graph breaks
            give partial graphs and resume functions, Python side effects are replayed) or
            ``"tracer"`` (run ``fn`` once under a TorchFunctionMode); ``None``: the default,
            ``DEFAULT_CAPTURE``.

    Returns:
        A callable with the same results and gradients as ``fn``. A new call whose inputs break
        a guard (other shape, dtype, device, requires_grad, Python value) recompiles; a
        construct the tracer cannot handle makes ``fn`` run eagerly, with a warning.
    """
    capture = capture or DEFAULT_CAPTURE
    check_choices(backend, partition, capture)
    return OptimizedFunction(fn, backend, partition, capture)


def toycomp_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
    """``torch.compile(fn, backend="toycomp")``: Dynamo captured ``gm``, toycomp does stages 2-4."""
    for node in gm.graph.nodes:  # AOT treats get_attr tensors as constants (no gradient)
        value = operator.attrgetter(node.target)(gm) if node.op == "get_attr" else None
        if isinstance(value, torch.Tensor) and value.requires_grad:
            raise NotImplementedError(
                f"toycomp backend: Dynamo kept {node.target} as an attribute that requires grad; "
                "toycomp needs parameters as graph inputs (torch._dynamo.config."
                "inline_inbuilt_nn_modules=True, the default)"
            )
    aot, _ = compile_stages_2_to_4(gm, example_inputs, None, "min_cut")
    return lambda *args: aot(*args)
