"""Stage 4, optional: ``mode="reduce-overhead"``: a ``CompiledGraph`` replayed as one CUDA graph.

Input -> output: a ``CompiledGraph`` (wrapper.py: ``call(args)`` that checks inputs, allocates
and launches kernel by kernel) and its ``ScheduledGraph`` -> a callable with the same interface
(``__call__(inputs)``, ``call_boxed(args)``, ``fresh_outputs``) whose calls, after a warm-up,
are one ``torch.cuda.CUDAGraph.replay()``: one launch of the whole graph instead of a Python
wrapper launching kernels one by one. For a training step::

    f = toycomp.compile(step, mode="reduce-overhead")
    f(x, y)   # call 1, warm-up: the graphs run as compiled (Triton compiles, cuBLAS allocates)
    f(x2, y2) # call 2: each graph is captured once on static inputs, then replayed
    f(x3, y3) # later calls: inputs copied into the static ones (parameters: nothing), replay,
              # outputs cloned out of the graph's memory pool

Graphs this cannot apply to run as compiled, with one warning per reason (see the Note):
not on CUDA, symbolic sizes, random ops, inputs on another device, a non-tensor input that
changes between calls, a capture that fails.

NB: in PyTorch this lives in torch/_inductor/cudagraph_trees.py (``cudagraphify_impl``,
``CUDAWarmupNode``, ``CUDAGraphNode``: a tree of graphs sharing one memory pool) and
torch/_inductor/cudagraph_utils.py (the reasons for skipping, ``check_for_mutation``...);
``torch.cuda.graphs.make_graphed_callables`` is the same idea without a compiler.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from toycomp._torch_compat import clear_cublas_workspaces
from toycomp.inductor import indexing, ir
from toycomp.inductor.runtime import _may_overlap, resolve_extern
from toycomp.inductor.wrapper import CompiledGraph
from toycomp.tensor_utils import same_strides

__all__ = ["MODES", "CUDAGraphMode", "CUDAGraphRunner", "check_mode", "skip_reasons"]

MODES = (None, "default", "reduce-overhead", "max-autotune")

# [Note: CUDA graphs]
# A small training step is bound by the host: the GPU finishes each kernel before Python has
# launched the next. A CUDA graph records the launches of one call (kernels, cuBLAS calls,
# copies) with their arguments, pointers included, and replays them all with one launch. So a
# replay reads and writes the same addresses as the capture did; everything else follows:
# * Warm-up: the first call runs as compiled on a side stream (PyTorch's advice: cuBLAS
#   workspaces and Triton's compiled kernels must exist before a capture). Call 2 captures
#   (``torch.cuda.graph``: the graph gets a private memory pool for its buffers), then replays.
# * Static inputs: an input whose address was the same in calls 1 and 2 (a parameter, a
#   buffer) is captured in place: later calls with it copy nothing and see its new values
#   (an optimizer's in-place update). The others get a static tensor of the same size, strides
#   and dtype (``empty_strided``), into which each call copies its input (``static.copy_(x)``).
#   An in-place input whose address changes later is not copied into (that would overwrite
#   the user's tensor): the graph is captured again with that input copied. An input whose
#   size, strides or dtype differ runs the compiled graph, whose ``check_input`` raises.
# * Outputs live in the graph's pool, and the next replay overwrites them: we CLONE each
#   output buffer's storage after the replay (outputs that share a buffer share the clone,
#   and keep their views). That costs one copy of every output per call, saved activations
#   included (a training step's forward copies what the backward reads): memory traffic and
#   one allocation per output. Inductor does not copy: it hands out the pool memory itself and
#   checks later accesses, raising when a replay has overwritten an output still in use
#   (cudagraph_trees.py: ``check_memory_pool``, "accessing tensor output of CUDAGraphs that
#   has been overwritten"), and its tree shares one pool between the forward and backward. An
#   output that is a view of an input is rebuilt as a view of this call's input (not cloned).
#   The wrapper never writes into its inputs on CUDA (no in-place reuse there:
#   memory_planning.py), so capturing parameters in place is safe.
# * cuBLAS's workspace: a matmul reads and writes a scratch buffer that cuBLAS allocates once
#   per stream and keeps. Had the warm-up made it, the graph would keep its address while the
#   buffer belongs to cuBLAS's cache, which anyone may clear (Inductor's CUDA graphs do before
#   each recording; so does ``torch.cuda.graph``'s ``empty_cache`` after them): a later replay
#   would read freed memory (an illegal address) or scribble on a tensor reallocated there
#   (silently wrong). So each capture clears the cache first and after (as Inductor does):
#   the capture's matmuls allocate a workspace in the graph's own pool, which lives as long
#   as the graph.
# * Refused, with one warning per reason: CPU graphs; symbolic sizes (one graph per size would
#   be needed: Inductor records one per distinct size); inputs on another device (a CPU scalar
#   would be captured as a constant); a non-tensor input that changes (it was baked in); a
#   failed capture (a CPU sync inside the graph); and random ops. ATen's CUDA generator is in
#   fact graph-safe (each replay advances its Philox offset by what the capture consumed), but
#   we have not tested that our replayed streams match the compiled graph's own, so graphs
#   that draw random numbers (dropout's bernoulli, rand_like) are refused, visibly.
# Each graph gets its own pool (more memory than Inductor's shared one; simpler to reason
# about: no replay can overwrite another graph's buffers).
def check_mode(mode: str | None) -> None:
    """Reject an unknown ``mode`` when ``toycomp.compile`` is called."""
    if mode not in MODES:
        raise ValueError(f"toycomp: unknown mode {mode!r}; choose one of {MODES}")


def skip_reasons(compiled: CompiledGraph, scheduled: ir.ScheduledGraph) -> list[str]:
    """Why this graph cannot be a CUDA graph, known at compile time (PyTorch:
    cudagraph_utils.py's ``check_lowering_disable_cudagraph``)."""
    reasons = []
    if compiled.device.type != "cuda":
        reasons.append(f"the graph runs on {compiled.device.type}, not CUDA")
    sizes = [v for b in scheduled.inputs for v in getattr(b, "size", ()) + getattr(b, "stride", ())]
    if any(isinstance(b, ir.SizeInput) for b in scheduled.inputs) or not all(
        indexing.is_static(v) for v in sizes
    ):
        reasons.append("symbolic sizes (a dynamic graph)")
    others = {str(b.device) for b in scheduled.inputs if getattr(b, "device", None) is not None}
    if others:
        reasons.append(f"inputs on {', '.join(sorted(others))}")
    random = [s.kernel for s in scheduled.steps
              if isinstance(s, ir.ExternKernel) and _is_random(s.kernel)]  # fmt: skip
    if random:
        reasons.append(f"random ops ({', '.join(random)})")
    return reasons


def _is_random(kernel: str) -> bool:
    tags = getattr(resolve_extern(kernel), "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


class CUDAGraphMode:
    """``mode="reduce-overhead"`` for one compiled function: wraps each of its ``CompiledGraph``s
    and warns once per reason a graph cannot be CUDA-graphed."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.warned: set[str] = set()

    def wrap(self, compiled: CompiledGraph, scheduled: ir.ScheduledGraph, name: str) -> Any:
        if not scheduled.steps:  # no kernel, no extern call (views of inputs): nothing to replay
            return compiled
        reasons = skip_reasons(compiled, scheduled)
        if reasons:
            self.warn(name, "; ".join(reasons))
            return compiled
        return CUDAGraphRunner(compiled, name, self)

    def warn(self, name: str, reason: str) -> None:
        if reason not in self.warned:
            self.warned.add(reason)
            warnings.warn(
                f"toycomp: mode='reduce-overhead': no CUDA graph for the {name} graph of "
                f"{self.owner} ({reason}); it runs as compiled",
                stacklevel=3,
            )


_capture_streams: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream for warm-ups and captures on ``device`` (as ``torch.cuda.graph``'s)."""
    if device not in _capture_streams:
        _capture_streams[device] = torch.cuda.Stream(device)
    return _capture_streams[device]


class CUDAGraphRunner:
    """A ``CompiledGraph`` that, after one warm-up call, replays a CUDA graph (see the Note).

    Same interface as ``CompiledGraph``: ``__call__(inputs)``, ``call_boxed(args)`` (clears
    ``args``), ``fresh_outputs``; ``compiled`` is the graph it runs, ``captures`` counts
    captures (2 after an in-place input moved), ``skipped`` says why it runs as compiled."""

    def __init__(self, compiled: CompiledGraph, name: str, mode: CUDAGraphMode) -> None:
        self.compiled, self.name, self.mode = compiled, name, mode
        self.device = compiled.device
        self.fresh_outputs = compiled.fresh_outputs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warmup_ptrs: list[int | None] | None = None
        self.warmup_layouts: list[tuple] = []
        self.in_place: set[int] = set()  # inputs captured at their own address
        self.static_inputs: list[Any] = []
        self.sources: list[tuple] = []  # per output: where each call's value comes from
        self.captures = 0
        self.skipped: str | None = None

    def __call__(self, inputs: list) -> list:
        return self.call_boxed(list(inputs))

    def __repr__(self) -> str:
        state = f"skipped: {self.skipped}" if self.skipped else f"{self.captures} capture(s)"
        return f"CUDAGraphRunner({self.name}, {state})\n{self.compiled!r}"

    def call_boxed(self, args: list) -> list:
        if self.skipped is not None:
            return self.compiled.call_boxed(args)
        if self.warmup_ptrs is None:
            return self.warm_up(args)
        if self.graph is None:
            if [_layout(x) for x in args] != self.warmup_layouts:  # (check_input's error)
                return self.compiled.call_boxed(args)
            self.in_place = {i for i, (x, p) in enumerate(zip(args, self.warmup_ptrs))
                             if isinstance(x, torch.Tensor) and x.data_ptr() == p}  # fmt: skip
            return self.record(args)
        return self.replay_or_fall_back(args)

    def skip(self, reason: str, args: list) -> list:
        self.skipped, self.graph, self.static_inputs, self.sources = reason, None, [], []
        self.mode.warn(self.name, reason)
        return self.compiled.call_boxed(args)

    def warm_up(self, args: list) -> list:
        """Call 1: run as compiled on the capture stream; remember the inputs' addresses."""
        self.warmup_ptrs = [_ptr(x) for x in args]
        self.warmup_layouts = [_layout(x) for x in args]
        return self.run_on_side_stream(args)

    def run_on_side_stream(self, args: list) -> list:
        stream, current = capture_stream(self.device), torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            outputs = self.compiled.call_boxed(args)
        current.wait_stream(stream)
        return outputs

    def capture(self, static_inputs: list) -> list:
        """Record one call on ``static_inputs`` into ``self.graph`` (nothing runs); its outputs
        are the buffers of the graph's pool that each replay writes."""
        self.graph = torch.cuda.CUDAGraph()
        clear_cublas_workspaces()  # (see the Note: cuBLAS's workspace)
        try:
            with torch.cuda.device(self.device):
                with torch.cuda.graph(self.graph, stream=capture_stream(self.device)):
                    return self.compiled.call_boxed(list(static_inputs))
        finally:  # the next matmul outside the capture must not use the graph's workspace
            clear_cublas_workspaces()

    def record(self, args: list) -> list:
        """Capture the graph on static inputs (``self.in_place`` ones are ``args``' own), then
        replay it for this call."""
        if any(isinstance(x, torch.Tensor) and _may_overlap(x) for x in args):
            return self.skip("an input with overlapping elements (an expanded view)", args)
        self.static_inputs = [_static_input(x, i in self.in_place) for i, x in enumerate(args)]
        try:
            captured = self.capture(self.static_inputs)
        except Exception as e:  # e.g. a CPU synchronisation inside the graph
            return self.skip(f"the capture failed: {type(e).__name__}: {e}", args)
        self.captures += 1
        self.sources = [self.output_source(o, captured) for o in captured]
        del captured  # (the pool keeps the buffers; ``sources`` keeps views of them)
        self.copy_inputs(args)  # the static inputs were made for these args: copies only
        return self.replay(args)

    def replay(self, args: list) -> list:
        """Replay the graph on the static inputs (already filled) and hand out its outputs."""
        self.graph.replay()
        outputs = self.outputs(args)
        args.clear()
        return outputs

    def copy_inputs(self, args: list) -> str | None:
        """Copy this call's inputs into the static ones; or say why the replay cannot run:
        ``"rerecord"`` (an in-place input moved), ``"layout"``, ``"number"``."""
        if len(args) != len(self.static_inputs):
            return "layout"
        for i, (x, static) in enumerate(zip(args, self.static_inputs)):
            if not isinstance(static, torch.Tensor):
                if type(x) is not type(static) or x != static:
                    return "number"
                continue
            if not _same_layout(x, static):
                return "layout"
            if x.data_ptr() == static.data_ptr() and x.stride() == static.stride():
                continue  # a parameter at its address, or an empty tensor: nothing to copy
            if i in self.in_place:  # never copy into the user's own tensor
                return "rerecord"
            static.copy_(x)
        return None

    def replay_or_fall_back(self, args: list) -> list:
        action = self.copy_inputs(args)
        if action == "rerecord":  # capture again, copying the inputs that moved
            self.in_place = {i for i in self.in_place
                             if args[i].data_ptr() == self.static_inputs[i].data_ptr()}  # fmt: skip
            return self.record(args)
        if action == "number":
            return self.skip("a non-tensor input changed since the capture", args)
        if action == "layout":  # not what the graph was compiled for: check_input raises
            return self.compiled.call_boxed(args)
        return self.replay(args)

    def output_source(self, out: Any, captured: list) -> tuple:
        """Where each later call's output comes from: a number, a view of an input (rebuilt
        on this call's input), or a buffer in the graph's pool (cloned out after each replay)."""
        if not isinstance(out, torch.Tensor):
            return ("value", out)
        key = out.untyped_storage().data_ptr()
        for i, static in enumerate(self.static_inputs):
            if isinstance(static, torch.Tensor) and static.numel() and key and (
                static.untyped_storage().data_ptr() == key
            ):
                return ("input", i, out.data_ptr() - static.data_ptr(), out)
        alone = sum(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() == key
                    for o in captured)  # fmt: skip
        if alone == 1 and _clone_keeps_layout(out):
            return ("clone", out)  # one op: the common case of a whole buffer returned once
        return ("pool", out, key)

    def outputs(self, args: list) -> list:
        """This replay's outputs, out of the pool (see the Note: outputs are cloned)."""
        clones: dict[int, torch.UntypedStorage] = {}
        result = []
        for source in self.sources:
            if source[0] == "value":
                result.append(source[1])
            elif source[0] == "clone":
                result.append(source[1].clone())
            elif source[0] == "input":
                _, i, delta, like = source
                storage = args[i].untyped_storage()
                result.append(_view(storage, args[i].data_ptr() + delta - storage.data_ptr(), like))
            else:
                _, like, key = source
                if key not in clones:
                    clones[key] = like.untyped_storage().clone()
                result.append(_view(clones[key], like.storage_offset() * like.element_size(), like))
        return result


def _ptr(x: Any) -> int | None:
    return x.data_ptr() if isinstance(x, torch.Tensor) else None


def _layout(x: Any) -> tuple:
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.device)
    return (type(x), x)


def _same_layout(x: Any, static: torch.Tensor) -> bool:
    if not isinstance(x, torch.Tensor) or x.dtype != static.dtype or x.device != static.device:
        return False
    return same_strides(static, x)


def _clone_keeps_layout(t: torch.Tensor) -> bool:
    """``t.clone()`` copies exactly ``t``'s storage, with its strides: ``t`` fills its storage
    densely, without gaps or overlaps (``clone`` keeps the strides of such tensors only)."""
    whole = t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.itemsize
    return whole and t.numel() > 0 and torch.empty_like(t).stride() == t.stride()


def _static_input(x: Any, in_place: bool) -> Any:
    """The tensor a capture reads input ``x`` from: ``x`` itself, or a new one laid out alike."""
    if not isinstance(x, torch.Tensor) or in_place:
        return x
    static = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
    return static.copy_(x)  # valid values: a capture runs nothing, but a CPU stand-in does


def _view(storage: torch.UntypedStorage, byte_offset: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor on ``storage`` with ``like``'s dtype, size and strides, at ``byte_offset``."""
    out = torch.empty(0, dtype=like.dtype, device=like.device)
    return out.set_(storage, byte_offset // like.element_size(), like.size(), like.stride())
