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

Capture runs on fake tensors and calls ``GraphCompiler`` on each graph it makes: stages 2-4
also run on the fakes, and the compiled code runs on the real inputs.

NB: in PyTorch this glue is torch/_dynamo/eval_frame.py (the guarded cache of compiled frames),
torch/_functorch/aot_autograd.py (aot_module_simplified) and torch/_inductor/compile_fx.py
(compile_fx, compile_fx_inner).
"""

from __future__ import annotations

import contextlib
import functools
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx

import toycomp.config as config
from toycomp._logging import log, log_enabled
from toycomp._torch_compat import fake_on_device, is_fake
from toycomp.capture.convert_frame import RECOMPILE_LIMIT, CompileContext, warn_user
from toycomp.aot.aot_autograd import aot_function
from toycomp.aot.partitioners import default_partition, min_cut_rematerialization_partition
from toycomp.aot.runtime_wrappers import AOTOutput
from toycomp.prims.decompositions import decompose, fallbacks
from toycomp.inductor.opt import async_compile, autotune
from toycomp.inductor.opt.cudagraphs import CUDAGraphMode, check_mode
from toycomp.inductor.ir import LoweredGraph, ScheduledGraph
from toycomp.inductor.lowering import lower
from toycomp.inductor.scheduler import schedule
from toycomp.inductor.opt.split_reduction import size_hints, split_reductions
from toycomp.inductor.wrapper import BACKENDS, CompiledGraph, compile_graph
from toycomp.symbolic_shapes import is_symbolic

# How AOT splits the joint graph: "min_cut" saves less and recomputes cheap pointwise work in the
# backward (TorchInductor's choice); "default" saves every forward value the backward reads.
PARTITIONS = {"default": default_partition, "min_cut": min_cut_rematerialization_partition}


# [Note: the backend follows the device]
# ``backend=None`` picks Triton for CUDA tensors and C++ for CPU tensors (DESIGN.md), judging by
# the inputs' device or by ``device``, the one the lowered graph computes on: a graph of Python
# numbers may make a CUDA tensor (GradScaler's lazily made ``torch.full((), 65536.0,
# device="cuda")``).
def resolve_backend(backend: str | None, example_inputs: Sequence[Any],
                    device: torch.device | None = None) -> str:
    """The code generator: ``backend``, or for ``None`` the device's (see the Note above)."""
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"toycomp: unknown backend {backend!r}; choose one of {BACKENDS}")
        return backend
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
    return "triton" if on_cuda or (device is not None and device.type == "cuda") else "cpp"


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


def inductor_compiler(backend: str | None, name: str, record: list[GraphArtefacts],
                      cudagraphs: CUDAGraphMode | None = None, opaque: bool = False) -> Callable:
    """An AOT compiler (``compiler(gm, example_inputs) -> callable``) running stages 3 and 4."""

    def compiler(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> CompiledGraph:
        prims_gm = decompose(gm, example_inputs)
        lowered = lower(prims_gm, example_inputs)
        target = resolve_backend(backend, example_inputs, lowered.device)
        if config.split_reductions or config.triton.mix_order_reduction:  # inductor/opt/
            lowered = split_reductions(lowered, target, size_hints(example_inputs))
        scheduled = schedule(lowered, target)
        compiled = compile_graph(scheduled, target)
        if opaque:  # (the backward runs from autograd, outside the forward's disabled call)
            compiled.fn = torch.compiler.disable(compiled.fn)
        record.append(
            GraphArtefacts(name, gm, prims_gm, fallbacks(prims_gm), lowered, scheduled, compiled)
        )
        return cudagraphs.wrap(compiled, scheduled, name) if cudagraphs else compiled

    return compiler


def compile_stages_2_to_4(gm: torch.fx.GraphModule, example_inputs: list, backend: str | None,
                          partition: str, cudagraphs: CUDAGraphMode | None = None,
                          opaque: bool = False) -> tuple[AOTOutput, list[GraphArtefacts]]:
    """AOT (joint graph, partition) with stages 3-4 as its forward and backward compilers."""
    graphs: list[GraphArtefacts] = []
    if config.triton.compile_workers:  # on CUDA, Triton's compile workers start (inductor/opt/)
        async_compile.start_triton_workers(example_inputs, backend)
    fw_compiler = inductor_compiler(backend, "forward", graphs, cudagraphs, opaque)
    bw_compiler = inductor_compiler(backend, "backward", graphs, cudagraphs, opaque)
    aot = aot_function(gm, list(example_inputs), fw_compiler=fw_compiler,
                       bw_compiler=bw_compiler, partition_fn=PARTITIONS[partition])
    if log_enabled("aot_graphs") or log_enabled("output_code") or any(g.fallbacks for g in graphs):
        log_artefacts(graphs)
    return aot, graphs


def log_artefacts(graphs: list[GraphArtefacts]) -> None:
    """TOYCOMP_LOGS (toycomp/_logging.py): the ATen graphs, the generated code, the fallbacks."""
    for g in graphs:
        if log_enabled("aot_graphs"):
            log("aot_graphs", "AOT %s GRAPH:\n%s", g.name.upper(), g.aten.code.strip())
        if log_enabled("output_code"):
            kernels = "\n\n".join(k.source.strip() for k in g.compiled.kernels)
            log("output_code", "OUTPUT CODE of the %s graph (%s):\n%s\n\n%s", g.name,
                         g.compiled.backend, kernels, g.compiled.wrapper_source.strip())
        if g.fallbacks:
            log("fallbacks", "the %s graph calls eager PyTorch for %s (no "
                         "decomposition or lowering)", g.name, ", ".join(sorted(set(g.fallbacks))))


@dataclass
class CompiledEntry:
    """One graph the capture made, and what stages 2-4 made of it.

    ``gm`` is the torch-level graph (its guards belong to the frame that called it: see
    ``toycomp.explain``); ``eager_reason`` says why it runs as captured instead of compiled
    (AOT refused a construct, e.g. ``resize_`` of an input).
    """

    gm: torch.fx.GraphModule
    aot: AOTOutput | None
    graphs: list[GraphArtefacts] = field(default_factory=list)
    eager_reason: str | None = None


def check_choices(backend: str | None, partition: str) -> None:
    """Reject unknown backend / partition names when compile() is called, not at the first call."""
    resolve_backend(backend, ())
    if partition not in PARTITIONS:
        choices = list(PARTITIONS)
        raise ValueError(f"toycomp: unknown partition {partition!r}; choose one of {choices}")


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
        self.cudagraphs: CUDAGraphMode | None = None  # made where config.triton.cudagraphs is on
        self.entries: list[CompiledEntry] = []  # compiled by stages 2-4
        self.eager: list[CompiledEntry] = []  # refused by AOT: they run as captured
        self.log: list[CompiledEntry] = []  # both, in compile order

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        if any(t.device.type == "meta" for t in tensors):  # toycomp.explain on meta inputs
            return self.compile_for_meta(gm, example_inputs)
        if any(t.layout != torch.strided for t in tensors):  # sparse inputs: run as captured
            return self.run_eagerly(gm, _layout_error(tensors))
        try:
            cudagraphs = self.cudagraph_mode() if config.triton.cudagraphs else None
            with autotune.requested(True) if config.max_autotune else contextlib.nullcontext():
                aot, graphs = compile_stages_2_to_4(gm, example_inputs, self.backend,
                                                    self.partition, cudagraphs)
        except NotImplementedError as e:  # an unsupported construct: the graph runs eagerly
            return self.run_eagerly(gm, e)
        self.entries.append(CompiledEntry(gm, aot, graphs))
        self.log.append(self.entries[-1])
        ops = sorted({op for g in graphs for op in g.fallbacks})
        if ops:  # visible: these ops run as calls to eager PyTorch (explain lists them too)
            self.warn_fallbacks(ops)
        return aot

    def compile_for_meta(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """Meta inputs (``toycomp.explain``): compiled as for CPU tensors, run as captured
        (generated kernels cannot run on meta tensors)."""
        self(gm, on_cpu(example_inputs))
        return gm.forward

    def cudagraph_mode(self) -> CUDAGraphMode:
        """One CUDAGraphMode for this function, made where config.triton.cudagraphs is on."""
        if self.cudagraphs is None:
            self.cudagraphs = CUDAGraphMode(self.name)
        return self.cudagraphs

    def run_eagerly(self, gm: torch.fx.GraphModule, e: NotImplementedError) -> Callable:
        """A graph AOT refused runs as captured, with a warning, kept in ``eager``."""
        self.eager.append(CompiledEntry(gm, None, eager_reason=str(e)))
        self.log.append(self.eager[-1])
        warn_user(f"toycomp: a graph of {self.name} runs eagerly ({e})")
        return gm.forward

    def warn_fallbacks(self, ops: list[str]) -> None:
        warn_user(f"toycomp: a graph of {self.name} calls eager PyTorch for "
                  f"{', '.join(ops)} (no decomposition or lowering)")

    @property
    def compile_count(self) -> int:
        return len(self.entries) + len(self.eager)


def on_cpu(example_inputs: list) -> list:
    return [fake_on_device(t, torch.device("cpu")) if isinstance(t, torch.Tensor) else t
            for t in example_inputs]  # fmt: skip


def _layout_error(tensors: list[torch.Tensor]) -> NotImplementedError:
    """Stages 2-4 index dense memory through strides: a sparse (or other non-strided) tensor
    input makes the graph run as captured instead, with the warning that names its layout."""
    layout = next(t.layout for t in tensors if t.layout != torch.strided)
    return NotImplementedError(f"an input of layout {layout} (toycomp compiles strided tensors "
                               "only)")  # fmt: skip


def frame_target(fn: Callable) -> Callable:
    """What the bytecode capture interprets: a module's ``forward``, ``fn`` itself, or, for a
    callable with no bytecode (``torch.sin``, a C function), a Python function that calls it."""
    if isinstance(fn, torch.nn.Module):
        return fn.forward
    if callable(fn) and not hasattr(fn, "__code__") and not hasattr(fn, "__func__"):
        return functools.wraps(fn)(lambda *args, **kwargs: fn(*args, **kwargs))
    return fn


class OptimizedFunction:
    """What ``toycomp.compile(fn)`` returns: ``fn`` with its bytecode capture and compilers.

    Calls go to ``frame``, the guarded cache of ``fn``'s compiled versions
    (toycomp/capture/convert_frame.py); ``compiler`` runs stages 2-4 on every graph captured.

    NB: Dynamo's counterpart is what ``torch.compile(fn)`` returns (torch/_dynamo/eval_frame.py:
    the wrapper ``_TorchDynamoContext.__call__`` makes, ``OptimizedModule`` for an nn.Module),
    whose cache is the list of ``CacheEntry``s (guards + compiled code) kept on ``fn``'s code
    object, capped by ``torch._dynamo.config.cache_size_limit``. (The ``CompiledFunction`` of
    toycomp/aot/runtime_wrappers.py is another thing: AOTAutograd's ``autograd.Function``.)
    """

    def __init__(self, fn: Callable, backend: str | None, partition: str = "min_cut",
                 dynamic: bool | None = None, options: dict[str, Any] | None = None) -> None:
        self.fn = fn
        self.options = options or {}  # flags of toycomp.config for this function's calls
        name = getattr(fn, "__qualname__", type(fn).__name__)
        self.compiler = GraphCompiler(backend, partition, name)
        self.entries = self.compiler.entries
        self.context = CompileContext(self.compiler, RECOMPILE_LIMIT, dynamic)
        self.frame = self.context.frame_for(frame_target(fn))

    @property
    def compile_count(self) -> int:
        """How many graphs went through stages 2-4 (Dynamo: ``frame_count`` of compiled code)."""
        return self.compiler.compile_count

    @property
    def eager_reason(self) -> str | None:
        """Why (part of) ``fn`` runs eagerly: a frame was skipped, or AOT refused a graph."""
        reasons = [e.eager_reason for e in self.compiler.eager]
        reasons += [r.break_reason for r in self.context.log
                    if r.break_reason and r.break_reason.startswith("frame skipped")]  # fmt: skip
        return "; ".join(reasons) or None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.options:
            return self.frame(*args, **kwargs)
        with config.patch(self.options):  # flags are read while compiling: patched in each call
            return self.frame(*args, **kwargs)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        graphs = f"{len(self.entries)} graphs"
        state = f"eager: {self.eager_reason}" if self.eager_reason else graphs
        return f"<toycomp.compile of {name} ({state})>"


# [Note: compile's arguments]
# ``fn``'s bytecode is interpreted on fake tensors at its first call (graph breaks give partial
# graphs and resume functions; Python side effects are replayed on every call); inputs that
# break a guard recompile; a construct capture cannot handle is a graph break (or runs the
# frame eagerly), reported by ``toycomp.explain``. ``backend=None`` picks Triton for CUDA
# tensors, C++ for CPU ones (Triton on CPU tensors runs through Triton's interpreter).
# ``partition="min_cut"`` saves little for the backward and recomputes cheap pointwise ops;
# ``"default"`` saves every forward value the backward reads. ``dynamic`` is
# ``torch.compile``'s: ``None`` makes a size a symbol after a recompile caused by its change;
# ``True``: every size (but 0 and 1) from the start; ``False``: none but
# ``toycomp.mark_dynamic(x, dim)``'s. ``options`` are flags of ``toycomp.config`` for this
# function only, as ``torch.compile``'s ``options=`` (``toycomp.config.teach`` turns every
# optimisation off), applied while it runs, since flags are read while compiling.
#
# [Note: compile modes]
# ``mode="reduce-overhead"`` replays each compiled graph on CUDA as a CUDA graph after a warm-up
# call (toycomp/inductor/opt/cudagraphs.py: static shapes only; a graph it cannot apply to runs
# as compiled, with a warning); ``"max-autotune"`` times a few launch configs of each Triton
# kernel on CUDA at its first call and keeps the fastest (toycomp/inductor/opt/autotune.py).
# Each mode is the flag it sets, under the function's ``options`` (which may override it).
MODE_OPTIONS = {
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune": {"max_autotune": True},
}


def compile(fn: Callable, backend: str | None = None, partition: str = "min_cut",  # noqa: A001
            dynamic: bool | None = None, mode: str | None = None,
            options: dict[str, Any] | None = None) -> OptimizedFunction:
    """Compile ``fn`` (a function or ``nn.Module``) with toycomp's whole pipeline.

    Args:
        fn: what to compile (at its first call).
        backend: ``"cpp"``, ``"triton"`` or ``None`` (the inputs' device decides).
        partition: ``"min_cut"`` or ``"default"``: what the backward recomputes or reads.
        dynamic: ``None``, ``True`` or ``False``: which sizes are symbols, as ``torch.compile``.
        mode: ``None``, ``"default"``, ``"reduce-overhead"`` or ``"max-autotune"``.
        options: flags of ``toycomp.config`` for this function only.

    Returns:
        A callable with the same results, gradients and Python side effects as ``fn`` (see
        [Note: compile's arguments] and [Note: compile modes]).
    """
    check_choices(backend, partition)
    if mode is not None:
        check_mode(mode)
    if dynamic not in (None, True, False):
        raise ValueError(f"toycomp: dynamic must be None, True or False, not {dynamic!r}")
    options = {**MODE_OPTIONS.get(mode, {}), **config.check_options(options)}
    return OptimizedFunction(fn, backend, partition, dynamic, options)


def toycomp_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[torch.Tensor],
    backend: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable:
    """``torch.compile(fn, backend="toycomp")``: Dynamo captured ``gm``, toycomp does stages 2-4.

    ``backend`` picks the code generator as in ``toycomp.compile`` (pass it with
    ``functools.partial(toycomp_backend, backend="triton")``); ``torch.compile``'s ``options=``
    arrive as ``options`` (flags of ``toycomp.config``). Graphs with symbolic sizes
    (``dynamic=True``, automatic dynamic shapes) are compiled once for every size."""
    for node in gm.graph.nodes:  # AOT treats get_attr tensors as constants (no gradient)
        value = operator.attrgetter(node.target)(gm) if node.op == "get_attr" else None
        if isinstance(value, torch.Tensor) and value.requires_grad:
            raise NotImplementedError(
                f"toycomp backend: Dynamo kept {node.target} as an attribute that requires grad; "
                "toycomp needs parameters as graph inputs (torch._dynamo.config."
                "inline_inbuilt_nn_modules=True, the default)"
            )
    _check_one_hot_classes(gm)
    examples = dynamo_examples(gm, example_inputs)
    try:
        with config.patch(config.check_options(options)):
            aot, graphs = compile_stages_2_to_4(gm, examples, backend, "min_cut", opaque=True)
    except (NotImplementedError, RuntimeError) as e:  # as in GraphCompiler.__call__: as captured
        # (a RuntimeError only for a size read from the data: Dynamo's capture_scalar_outputs
        # and capture_dynamic_output_shape_ops give graphs with such sizes)
        data_dependent = type(e).__name__ == "GuardOnDataDependentSymNode"  # (a private class)
        if not isinstance(e, NotImplementedError) and not data_dependent:
            raise
        warn_user(f"toycomp: a graph Dynamo captured runs eagerly ({e})")
        return torch.compiler.disable(gm.forward)
    ops = sorted({op for g in graphs for op in g.fallbacks})
    if ops:  # visible, as toycomp.compile's (GraphCompiler.warn_fallbacks)
        warn_user(f"toycomp: a graph Dynamo captured calls eager PyTorch for {', '.join(ops)} "
                  "(no decomposition or lowering)")
    # [Note: the compiled callable is opaque to Dynamo]
    # Dynamo calls what a backend returns from the code it generates, and sees every Python
    # frame run inside. Left visible, toycomp's wrapper and runtime checks would be traced in
    # turn (from a resume function, say, under autocast), as if they were user code: with
    # SymInt strides that the checks compare, or worse. Inductor's callable is wrapped the
    # same way (torch/_dynamo/backends/common.py: ``disable(cg)``).
    return torch.compiler.disable(lambda *args: aot(*args))


def _check_one_hot_classes(gm: torch.fx.GraphModule) -> None:
    """Each ``F.one_hot(classes, n)`` of Dynamo's graph reads ``check_one_hot(classes, n)``, as
    toycomp's own capture writes it: traced on fake tensors (dynamic sizes), ATen's one_hot skips
    eager's range check ([Note: checks that raise as eager does] in prims/decomp_table.py)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.nn.functional.one_hot:
            continue
        n = node.kwargs.get("num_classes", node.args[1] if len(node.args) > 1 else -1)
        if isinstance(n, int) and n < 0:  # read from the data: AOT refuses it (data-dependent)
            continue
        with gm.graph.inserting_before(node):
            check = gm.graph.call_function(torch.ops.toycomp.check_one_hot.default,
                                           (node.args[0], n))  # fmt: skip
        node.args, changed = (check, *node.args[1:]), True
    if changed:
        gm.recompile()


def dynamo_examples(gm: torch.fx.GraphModule, example_inputs: list) -> list:
    """What stages 2-4 trace a Dynamo graph on: Dynamo's own fake tensors
    (``meta["example_value"]``), as ``aot_module_simplified`` does, so that compiling never
    computes on the user's data (tracing a transformer's step on the real tensors took seconds)
    and a graph with symbolic sizes (``dynamic=True``, automatic dynamic shapes) keeps its
    symbols, which the real tensors have lost. Where a placeholder has no fake value, the real
    example tensors, as they are."""
    fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if any(is_symbolic(x) for x in example_inputs) or (len(fakes) == len(example_inputs) and all(
            is_fake(f) if isinstance(x, torch.Tensor) else is_symbolic(f) or f == x
            for f, x in zip(fakes, example_inputs))):  # fmt: skip
        return fakes
    return example_inputs
