"""AOTAutograd's entry point: a callable on flat tensors -> ATen-level joint / forward / backward.

Input IR: any ``fn(*flat_tensors) -> Tensor | tuple[Tensor, ...]``, e.g. the torch-level
``GraphModule`` from toycomp/capture/ or a plain function, plus real example tensors.

Output IR: ``torch.fx.GraphModule``s whose ``call_function`` targets are ATen ``OpOverload``s
(``torch.ops.aten.sin.default``...), every node carrying ``meta["val"]`` (a meta tensor with the
node's shape, dtype and stride): the *joint* graph, then the *forward* and *backward* graphs
split from it (toycomp/aot/partitioners.py), wrapped in an ``AOTOutput`` that runs them
(toycomp/aot/runtime_wrappers.py). ``f(x) = sin(x)`` with ``x.requires_grad``:

    >>> import torch
    >>> joint = trace_joint(torch.sin, [torch.randn(3, requires_grad=True)])
    >>> print(joint.code.strip())       # forward outputs, then one gradient per primal
    def forward(self, primals_1, tangents_1):
        sin = torch.ops.aten.sin.default(primals_1)
        cos = torch.ops.aten.cos.default(primals_1);  primals_1 = None
        mul = torch.ops.aten.mul.Tensor(tangents_1, cos);  tangents_1 = cos = None
        return (sin, mul)

This module does the tracing: run ``fn``, then ``torch.autograd.grad``, under the
``FunctionalRecorder`` of toycomp/aot/functionalize.py, which records ATen ops into a
``TensorTracker`` and rewrites in-place ones into out-of-place ones; then ``aot_function``
partitions the joint graph, compiles both halves and wraps them.

NB: in PyTorch this lives in torch/_functorch/aot_autograd.py (``aot_function``),
torch/_functorch/_aot_autograd/ (``create_joint`` in traced_function_transforms.py, output alias
analysis in collect_metadata_analysis.py, the autograd.Function and runtime wrappers in
runtime_wrappers.py) and torch/_functorch/partitioners.py (``default_partition``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

import toycomp.config as config
from toycomp._torch_compat import LayoutsSeen, cudnn_and_mkldnn_disabled, fake_mode_of
from toycomp.aot.functional_utils import storage_key
from toycomp.aot.functionalize import FunctionalRecorder
from toycomp.aot.tensor_tracker import TensorTracker
from toycomp.aot.partitioners import default_partition
from toycomp.symbolic_shapes import free_symbols, is_symbolic
from toycomp.aot.runtime_wrappers import (
    AOTOutput,
    _requires_grad,
    offset_sensitive_inputs,
    output_alias_info,
    run_graph,
)

__all__ = ["aot_function", "trace_forward", "trace_joint"]

aten = torch.ops.aten
Compiler = Callable[[fx.GraphModule, list], Callable[[list], Sequence]]


# -- tracing ---------------------------------------------------------------------------------
def _as_tuple(outs: Any) -> tuple[torch.Tensor, ...]:
    """The outputs as a tuple: tensors, or sizes (Dynamo's graphs may return a SymInt)."""
    outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
    return tuple(o if isinstance(o, torch.Tensor) else _size(o, f"output {i}")
                 for i, o in enumerate(outs))  # fmt: skip


def _clone_input(x: Any, requires_grad: bool) -> Any:
    """A private copy of an input (its strides if dense): tracing never mutates the user's data."""
    if not isinstance(x, torch.Tensor):
        return _size(x, "an input")
    return x.detach().clone().requires_grad_(requires_grad)  # [Note: inputs traced dense]


def _size(x: Any, what: str) -> Any:
    """A size (an int or a SymInt) as it is; anything else is refused, naming ``what`` it is."""
    if is_symbolic(x) or type(x) is int:
        return x
    raise TypeError(f"toycomp.aot: {what} is a {type(x).__name__}, not a tensor or a size")


# [Note: inputs traced dense] ``x.clone()`` (``preserve_format``) keeps the strides of a dense
# input (one whose elements fill a block of memory: contiguous, transposed, channels-last...) and
# gives any other (a slice with gaps, an expand) a dense layout, contiguous or channels-last as
# ``torch.empty_like`` chooses; the runtime copies such inputs into that layout on every call.

# [Note: mutated inputs that require grad] In eager, ``x.mul_(2)`` on an input that is not a
# leaf (``a * 1``) is recorded by autograd, and the caller's tensor gets a new history. We
# differentiate with respect to leaf primals, which autograd refuses to mutate, so ``fn``
# gets ``primal.clone()`` (``passed`` in ``_trace``, made before recording starts: nothing
# enters the graph, and its backward passes the gradient through). Like PyTorch's
# ``maybe_to_fresh_input`` (torch/_functorch/_aot_autograd/graph_capture_wrappers.py).


@dataclasses.dataclass(frozen=True)
class _Mutation:
    """An input that ``fn`` mutated: the node of its new value, and whether autograd saw it."""

    index: int
    node: fx.Node
    requires_grad: bool  # recorded by autograd (not under no_grad): the new value has a tangent


def _input_mutations(tracker: TensorTracker, passed: list, grad_fns: list, inputs: Sequence):
    """A ``_Mutation`` for every input the traced function mutated.

    ``grad_fns`` holds each passed tensor's ``grad_fn`` before ``fn`` ran: a mutation that
    autograd recorded replaced it; one under ``torch.no_grad()`` (clamping a parameter) did not.
    """
    mutations = []
    for i, (p, placeholder) in enumerate(zip(passed, tracker.placeholders)):
        if not isinstance(p, torch.Tensor):
            continue  # a size
        node = tracker.read(p, f"the input-mutation epilogue (input {i})")
        if node is placeholder:
            continue
        _check_replayable(i, p, inputs)  # only values change, and no other input sees them
        mutations.append(_Mutation(i, node, p.requires_grad and p.grad_fn is not grad_fns[i]))
    return mutations


def _check_replayable(i: int, mutated: torch.Tensor, inputs: Sequence) -> None:
    """Refuse a mutation of input ``i`` that the epilogue could not replay with ``copy_``."""
    if mutated.shape != inputs[i].shape or mutated.stride() != inputs[i].stride():
        raise NotImplementedError(
            f"toycomp.aot: input {i} changes its shape or strides in place (resize_, t_, "
            "unsqueeze_...); toycomp replays only mutations of an input's values"
        )
    key = storage_key(inputs[i])
    for j, other in enumerate(inputs):
        if j != i and key is not None and storage_key(other) == key:
            raise NotImplementedError(f"toycomp.aot: mutated input {i} aliases input {j}")


@dataclasses.dataclass
class _Trace:
    gm: fx.GraphModule
    values: dict[str, torch.Tensor]  # real value of every node, by node name

    def examples(self, gm: fx.GraphModule) -> list[torch.Tensor]:
        """The real values of ``gm``'s inputs (for a size computed in the graph, its SymInt)."""
        return [self.values.get(n.name, n.meta.get("val"))
                for n in gm.graph.nodes if n.op == "placeholder"]  # fmt: skip


# [Note: the joint function] Like PyTorch's create_joint: grads of the forward outputs that
# require grad (user outputs, and new values of inputs that autograd saw being mutated)
# w.r.t. the primals that require grad, with one tangent per such output.
def _trace_backward(recorder: FunctionalRecorder, primals: list, outs: list, diff: list) -> list:
    """Record the backward: a gradient node (or None) per primal ([Note: the joint function])."""
    tangents = [torch.ones_like(outs[i], memory_format=torch.contiguous_format) for i in diff]
    for k, t in enumerate(tangents):
        recorder.tracker.placeholder(f"tangents_{k + 1}", t)
    wrt = [p for p in primals if _requires_grad(p)]
    grads = [None] * len(wrt)
    if diff:
        with recorder:
            grads = torch.autograd.grad([outs[i] for i in diff], wrt, tangents, allow_unused=True)
    grads = {id(p): g for p, g in zip(wrt, grads)}  # (None for a primal that needs none)
    return [recorder.tracker.read(grads.get(id(p)), "gradient") for p in primals]


# [Note: cudnn off while tracing] Composite ops pick a backend while we trace
# (batch_norm -> cudnn_batch_norm on CUDA), and cudnn's batch norm hides its running-stat
# mutation and needs a workspace output; so do mkldnn's RNNs on CPU, whose workspace is
# empty under no_grad (as in CompiledFunction.forward). With cudnn and mkldnn off we record
# native ops, which run on every device; convolutions still pick a backend at run time.
def _trace(fn: Callable, inputs: Sequence[torch.Tensor], joint: bool) -> _Trace:
    tracker = TensorTracker()
    recorder = FunctionalRecorder(tracker)
    grad_mode = joint and torch.is_grad_enabled()  # (off: the graph may turn it on itself)
    with cudnn_and_mkldnn_disabled(), torch.enable_grad() if joint else torch.no_grad():
        primals = [_clone_input(x, joint and _requires_grad(x)) for x in inputs]
        passed = [p.clone() if _requires_grad(p) else p for p in primals]
        grad_fns = [getattr(p, "grad_fn", None) for p in passed]
        for i, p in enumerate(passed):
            tracker.placeholder(f"primals_{i + 1}", p)
        with recorder, torch.set_grad_enabled(grad_mode):
            outs = _as_tuple(fn(*passed))
        out_nodes = [tracker.read(o, f"output {i}") for i, o in enumerate(outs)]
        mutations = _input_mutations(tracker, passed, grad_fns, inputs) if tracker.rebound else []
        fwd_values = [*outs, *[passed[m.index] for m in mutations]]
        diff_outputs = [i for i, o in enumerate(outs) if joint and _requires_grad(o)]
        diff_outputs += [len(outs) + k for k, m in enumerate(mutations) if m.requires_grad]
        grad_nodes = _trace_backward(recorder, primals, fwd_values, diff_outputs) if joint else []
        if tracker.rebound and _input_mutations(tracker, passed, grad_fns, inputs) != mutations:
            raise NotImplementedError("toycomp.aot: the backward mutates an input")
    tracker.graph.output((*out_nodes, *[m.node for m in mutations], *grad_nodes))
    tracker.graph.eliminate_dead_code()
    if free_symbols(list(inputs)):  # dynamic shapes: [Note: sizes in the recorded graph]
        tracker.bind_symbols()
    tracker.graph.lint()
    gm = fx.GraphModule(tracker.constants, tracker.graph)
    gm.meta.update(
        num_fwd_outputs=len(outs) + len(mutations),
        num_user_outputs=len(outs),
        mutated_inputs=[m.index for m in mutations],
        diff_outputs=diff_outputs,
        requires_grad=[_requires_grad(p) for p in primals],
        grad_inputs=[i for i, g in enumerate(grad_nodes) if g is not None],
        output_alias_info=output_alias_info(outs, passed),
    )
    return _Trace(gm, {node.name: value for node, value in tracker.values.items()})


def trace_joint(fn: Callable, inputs: Sequence[torch.Tensor]) -> fx.GraphModule:
    """Record ``fn``'s forward and backward as one ATen graph (the joint graph).

    Args:
        fn: callable on flat tensors returning a tensor or a tuple/list of tensors.
        inputs: real example tensors; those with ``requires_grad`` get gradients.

    Returns:
        ``joint(primals_1.., tangents_1..)`` returning ``(outputs..., mutated input values...,
        gradient per primal or None...)``; ``gm.meta`` holds ``num_fwd_outputs`` and friends.
    """
    return _trace(fn, inputs, joint=True).gm


def trace_forward(fn: Callable, inputs: Sequence[torch.Tensor]) -> fx.GraphModule:
    """Record ``fn``'s forward only (grad mode off): ``(primals..) -> (outputs.., mutated..)``."""
    return _trace(fn, inputs, joint=False).gm


# [Note: tracing on fake tensors] Given the capture's fake tensors (shapes, strides, dtypes,
# no data), the joint trace runs under their FakeTensorMode: no computation on real data and
# no random numbers drawn. The compilers then get fake example inputs.

# [Note: aot_function's arguments]
# ``fn`` is a callable on flat tensors returning a tensor or a tuple/list of tensors;
# ``example_inputs`` are real or fake tensors ([Note: tracing on fake tensors]).
# ``fw_compiler(gm, example_inputs)`` returns a callable on a list of inputs (``run_graph``,
# the default, runs the GraphModule as it is), ``bw_compiler`` the same for the backward
# (default: ``fw_compiler``); ``partition_fn(joint)`` returns ``(forward, backward, saved value
# names)``, the saved tensors before the saved sizes (as PyTorch's partitioners order them). The
# result is an ``AOTOutput`` whose ``joint`` and ``backward`` are ``None`` when nothing needs a
# gradient.

# [Note: a graph that enables grad] A graph that turns grad mode on itself (``with
# torch.enable_grad():`` in a function called under ``no_grad``, a call of
# ``torch._C._set_grad_enabled(True)`` in the graph) may return outputs that require grad
# whatever the caller's mode: it is traced jointly, starting in the caller's mode, as eager
# would run it.

# What aot_function copies from the traced graph's meta into AOTOutput.
_RUNTIME_METADATA = ("num_fwd_outputs", "num_user_outputs", "mutated_inputs", "requires_grad",
                     "diff_outputs", "grad_inputs", "output_alias_info")  # fmt: skip


def aot_function(
    fn: Callable,
    example_inputs: Sequence[torch.Tensor],
    fw_compiler: Compiler = run_graph,
    bw_compiler: Compiler | None = None,
    partition_fn: Callable = default_partition,
) -> AOTOutput:
    """Trace, partition, compile and wrap ``fn`` ([Note: aot_function's arguments])."""
    bw_compiler = bw_compiler or fw_compiler
    enables_grad = isinstance(fn, fx.GraphModule) and any(  # [Note: a graph that enables grad]
        n.target is torch._C._set_grad_enabled and n.args[0] is True for n in fn.graph.nodes)
    joint = (torch.is_grad_enabled() or enables_grad) and any(map(_requires_grad, example_inputs))
    with fake_mode_of(example_inputs) or contextlib.nullcontext():
        trace = _trace(fn, example_inputs, joint=joint)
    forward, backward, saved = partition_fn(trace.gm) if joint else (trace.gm, None, [])
    return AOTOutput(
        joint=trace.gm if joint else None,
        forward=forward,
        backward=backward,
        saved_values=saved,
        compiled_forward=fw_compiler(forward, trace.examples(forward)),
        compiled_backward=bw_compiler(backward, trace.examples(backward)) if joint else None,
        offset_sensitive=offset_sensitive_inputs(trace.gm, len(example_inputs)),
        enables_grad=enables_grad,
        inputs_seen=LayoutsSeen() if config.fast_guards else None,
        **{name: trace.gm.meta[name] for name in _RUNTIME_METADATA},
    )
