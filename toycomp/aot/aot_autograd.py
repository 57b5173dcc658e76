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

import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from toycomp._torch_compat import cudnn_and_mkldnn_disabled
from toycomp.aot.functional_utils import copy_like, is_dense, storage_key
from toycomp.aot.functionalize import FunctionalRecorder
from toycomp.aot.tensor_tracker import TensorTracker
from toycomp.aot.partitioners import default_partition
from toycomp.aot.runtime_wrappers import (
    AOTOutput,
    offset_sensitive_inputs,
    output_alias_info,
    run_graph,
)

__all__ = ["aot_function", "trace_forward", "trace_joint"]

aten = torch.ops.aten
Compiler = Callable[[fx.GraphModule, list], Callable[[list], Sequence]]


# -- tracing ---------------------------------------------------------------------------------
def _as_tuple(outs: Any) -> tuple[torch.Tensor, ...]:
    outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
    for i, out in enumerate(outs):
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"toycomp.aot: output {i} is a {type(out).__name__}, not a Tensor")
    return outs


def _clone_input(x: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A private copy of an input (same strides), so tracing never mutates the user's data."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"toycomp.aot: inputs must be tensors, got {type(x).__name__}")
    dense = is_dense(x)
    clone = copy_like(x, x) if dense else x.detach().clone(memory_format=torch.contiguous_format)
    return clone.requires_grad_(requires_grad and (clone.is_floating_point() or clone.is_complex()))


def _input_mutations(tracker: TensorTracker, primals: list, inputs: Sequence) -> list:
    """(input index, final value node) for every input the traced function mutated."""
    mutations = []
    for i, (p, placeholder) in enumerate(zip(primals, tracker.placeholders)):
        node = tracker.read(p, f"the input-mutation epilogue (input {i})")
        if node is placeholder:
            continue
        if p.requires_grad or p.shape != inputs[i].shape:
            raise NotImplementedError(
                f"toycomp.aot: input {i} is mutated in a way toycomp cannot replay (the new "
                "value requires grad, or its shape changed)"
            )
        key = storage_key(inputs[i])
        for j, other in enumerate(inputs):
            if j != i and key is not None and storage_key(other) == key:
                raise NotImplementedError(f"toycomp.aot: mutated input {i} aliases input {j}")
        mutations.append((i, node))
    return mutations


@dataclasses.dataclass
class _Trace:
    gm: fx.GraphModule
    values: dict[str, torch.Tensor]  # real value of every node, by node name

    def examples(self, gm: fx.GraphModule) -> list[torch.Tensor]:
        """The real values of ``gm``'s placeholders (the compilers' example inputs)."""
        return [self.values[n.name] for n in gm.graph.nodes if n.op == "placeholder"]


def _trace(fn: Callable, inputs: Sequence[torch.Tensor], joint: bool) -> _Trace:
    # [Note: cudnn off while tracing] Composite ops pick a backend while we trace
    # (batch_norm -> cudnn_batch_norm on CUDA), and cudnn's batch norm hides its running-stat
    # mutation and needs a workspace output; so do mkldnn's RNNs on CPU, whose workspace is
    # empty under no_grad (as in CompiledFunction.forward). With cudnn and mkldnn off we record
    # native ops, which run on every device; convolutions still pick a backend at run time.
    with cudnn_and_mkldnn_disabled():
        return _trace_inner(fn, inputs, joint)


def _trace_backward(
    recorder: FunctionalRecorder, primals: list, outs: tuple, diff: list
) -> list:
    """Record the backward: a gradient node (or None) per primal.

    [Note: the joint function] Like PyTorch's create_joint: grads of the outputs that require
    grad w.r.t. the primals that require grad, with one tangent per such output.
    """
    tangents = [torch.ones(outs[i].shape, dtype=outs[i].dtype, device=outs[i].device)
                for i in diff]  # fmt: skip
    for k, t in enumerate(tangents):
        recorder.tracker.placeholder(f"tangents_{k + 1}", t)
    wrt = [p for p in primals if p.requires_grad]
    grads = [None] * len(wrt)
    if diff:
        with recorder:
            grads = torch.autograd.grad([outs[i] for i in diff], wrt, tangents, allow_unused=True)
    it = iter(grads)
    return [recorder.tracker.read(next(it), "gradient") if p.requires_grad else None
            for p in primals]  # fmt: skip


def _trace_inner(fn: Callable, inputs: Sequence[torch.Tensor], joint: bool) -> _Trace:
    tracker = TensorTracker()
    recorder = FunctionalRecorder(tracker)
    primals = [_clone_input(x, joint and x.requires_grad) for x in inputs]
    for i, p in enumerate(primals):
        tracker.placeholder(f"primals_{i + 1}", p)
    with torch.enable_grad() if joint else torch.no_grad():
        with recorder:
            outs = _as_tuple(fn(*primals))
        out_nodes = [tracker.read(o, f"output {i}") for i, o in enumerate(outs)]
        mutations = _input_mutations(tracker, primals, inputs)
        diff_outputs = [i for i, o in enumerate(outs) if joint and o.requires_grad]
        grad_nodes = _trace_backward(recorder, primals, outs, diff_outputs) if joint else []
        if joint and _input_mutations(tracker, primals, inputs) != mutations:
            raise NotImplementedError("toycomp.aot: the backward mutates an input")
    tracker.graph.output((*out_nodes, *[n for _, n in mutations], *grad_nodes))
    tracker.graph.eliminate_dead_code()
    tracker.graph.lint()
    gm = fx.GraphModule(tracker.constants, tracker.graph)
    gm.meta.update(
        num_fwd_outputs=len(outs) + len(mutations),
        num_user_outputs=len(outs),
        mutated_inputs=[i for i, _ in mutations],
        diff_outputs=diff_outputs,
        requires_grad=[p.requires_grad for p in primals],
        grad_inputs=[i for i, g in enumerate(grad_nodes) if g is not None],
        output_alias_info=output_alias_info(outs, primals),
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


# What aot_function copies from the traced graph's meta into AOTOutput.
_RUNTIME_METADATA = ("num_fwd_outputs", "num_user_outputs", "mutated_inputs", "requires_grad",
                     "diff_outputs", "grad_inputs", "output_alias_info")  # fmt: skip


def aot_function(
    fn: Callable,
    example_inputs: Sequence[torch.Tensor],
    fw_compiler: Compiler | None = None,
    bw_compiler: Compiler | None = None,
    partition_fn: Callable = default_partition,
) -> AOTOutput:
    """Trace ``fn`` at the ATen level, partition, compile both halves, and wrap them.

    Args:
        fn: callable on flat tensors returning a tensor or a tuple/list of tensors.
        example_inputs: real tensors; ``requires_grad`` decides which inputs get gradients.
        fw_compiler: ``compiler(gm, example_inputs) -> callable(list) -> sequence``; ``None``
            runs the GraphModule.
        bw_compiler: same for the backward; ``None`` uses ``fw_compiler``.
        partition_fn: ``joint -> (forward, backward, saved value names)``.

    Returns:
        An ``AOTOutput``. With no input requiring grad (or grad mode off) only the forward is
        traced: ``joint`` and ``backward`` are ``None``.
    """
    fw_compiler = fw_compiler or run_graph
    bw_compiler = bw_compiler or fw_compiler
    joint = torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs)
    trace = _trace(fn, example_inputs, joint=joint)
    forward, backward, saved = partition_fn(trace.gm) if joint else (trace.gm, None, [])
    compiled_forward = fw_compiler(forward, trace.examples(forward))
    compiled_backward = bw_compiler(backward, trace.examples(backward)) if joint else None
    return AOTOutput(
        joint=trace.gm if joint else None,
        forward=forward,
        backward=backward,
        saved_values=saved,
        compiled_forward=compiled_forward,
        compiled_backward=compiled_backward,
        offset_sensitive=offset_sensitive_inputs(trace.gm, len(example_inputs)),
        **{name: trace.gm.meta[name] for name in _RUNTIME_METADATA},
    )
