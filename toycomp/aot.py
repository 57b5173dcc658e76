"""Stage 2, AOTAutograd: a callable on flat tensors -> ATen-level joint, forward, backward graphs.

Input IR: any ``fn(*flat_tensors) -> Tensor | tuple[Tensor, ...]``, e.g. the torch-level
``GraphModule`` from ``toycomp.capture`` or a plain function, plus real example tensors.

Output IR: ``torch.fx.GraphModule``s whose ``call_function`` targets are ATen ``OpOverload``s
(``torch.ops.aten.sin.default``...), every node carrying ``meta["val"]`` (a meta tensor with the
node's shape, dtype and stride): the *joint* graph, then the *forward* and *backward* graphs
split from it (``toycomp.partitioners``), wrapped in a ``torch.autograd.Function``.

Tiny example, ``f(x) = sin(x)`` with ``x.requires_grad``::

    def joint(primals_1, tangents_1):          # what trace_joint records
        sin = aten.sin.default(primals_1)
        cos = aten.cos.default(primals_1)
        mul = aten.mul.Tensor(tangents_1, cos)
        return (sin, mul)                      # forward outputs, then one gradient per primal

This module does the tracing (run ``fn``, then ``torch.autograd.grad``, under the recorder of
``toycomp.functionalize``, which records ATen ops and rewrites in-place ones into out-of-place
ones) and the runtime: ``AOTOutput`` runs the compiled forward inside a
``torch.autograd.Function`` whose backward runs the compiled backward, copies the new values
of mutated inputs back into them (the input-mutation epilogue), and makes sure outputs share
memory with inputs exactly where eager's do ([Note: outputs that eager made fresh]).

NB: in PyTorch this lives in torch/_functorch/aot_autograd.py (``aot_function``),
torch/_functorch/_aot_autograd/ (``create_joint`` in traced_function_transforms.py, output alias
analysis in collect_metadata_analysis.py, the autograd.Function and runtime wrappers in
runtime_wrappers.py) and torch/_functorch/partitioners.py (``default_partition``).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from toycomp.functionalize import FunctionalRecorder, copy_like, is_dense, storage_key
from toycomp.partitioners import default_partition

__all__ = [
    "AOTOutput",
    "CompiledFunction",
    "OutputAliasInfo",
    "aot_function",
    "default_partition",
    "trace_forward",
    "trace_joint",
]

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


def _input_mutations(rec: FunctionalRecorder, primals: list, inputs: Sequence) -> list:
    """(input index, final value node) for every input the traced function mutated."""
    mutations = []
    for i, (p, placeholder) in enumerate(zip(primals, rec.placeholders)):
        node = rec.read(p, f"the input-mutation epilogue (input {i})")
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


@dataclasses.dataclass(frozen=True)
class OutputAliasInfo:
    """The inputs and earlier outputs that one user output shared storage with, in eager."""

    aliased_inputs: frozenset[int]
    aliased_outputs: frozenset[int]


def output_alias_info(outs: Sequence[torch.Tensor], inputs: Sequence) -> list[OutputAliasInfo]:
    """Which inputs / earlier outputs each of ``outs`` shares storage with."""
    in_keys, out_keys = [storage_key(x) for x in inputs], [storage_key(o) for o in outs]

    def sharing(key: tuple | None, keys: list) -> frozenset[int]:
        return frozenset(j for j, k in enumerate(keys) if key is not None and k == key)

    return [OutputAliasInfo(sharing(key, in_keys), sharing(key, out_keys[:i]))
            for i, key in enumerate(out_keys)]  # fmt: skip


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
    backends = (torch.backends.cudnn, torch.backends.mkldnn)
    enabled = [backend.enabled for backend in backends]
    try:
        for backend in backends:
            backend.enabled = False
        return _trace_inner(fn, inputs, joint)
    finally:
        for backend, was_enabled in zip(backends, enabled):
            backend.enabled = was_enabled


def _trace_backward(rec: FunctionalRecorder, primals: list, outs: tuple, diff: list) -> list:
    """Record the backward: a gradient node (or None) per primal.

    [Note: the joint function] Like PyTorch's create_joint: grads of the outputs that require
    grad w.r.t. the primals that require grad, with one tangent per such output.
    """
    tangents = [torch.ones(outs[i].shape, dtype=outs[i].dtype, device=outs[i].device)
                for i in diff]  # fmt: skip
    for k, t in enumerate(tangents):
        rec.placeholder(f"tangents_{k + 1}", t)
    wrt = [p for p in primals if p.requires_grad]
    grads = [None] * len(wrt)
    if diff:
        with rec:
            grads = torch.autograd.grad([outs[i] for i in diff], wrt, tangents, allow_unused=True)
    it = iter(grads)
    return [rec.read(next(it), "gradient") if p.requires_grad else None for p in primals]


def _trace_inner(fn: Callable, inputs: Sequence[torch.Tensor], joint: bool) -> _Trace:
    rec = FunctionalRecorder()
    primals = [_clone_input(x, joint and x.requires_grad) for x in inputs]
    for i, p in enumerate(primals):
        rec.placeholder(f"primals_{i + 1}", p)
    with torch.enable_grad() if joint else torch.no_grad():
        with rec:
            outs = _as_tuple(fn(*primals))
        out_nodes = [rec.read(o, f"output {i}") for i, o in enumerate(outs)]
        mutations = _input_mutations(rec, primals, inputs)
        diff_outputs = [i for i, o in enumerate(outs) if joint and o.requires_grad]
        grad_nodes = _trace_backward(rec, primals, outs, diff_outputs) if joint else []
        if joint and _input_mutations(rec, primals, inputs) != mutations:
            raise NotImplementedError("toycomp.aot: the backward mutates an input")
    rec.graph.output((*out_nodes, *[n for _, n in mutations], *grad_nodes))
    rec.graph.eliminate_dead_code()
    rec.graph.lint()
    gm = fx.GraphModule(rec.constants, rec.graph)
    gm.meta.update(
        num_fwd_outputs=len(outs) + len(mutations),
        num_user_outputs=len(outs),
        mutated_inputs=[i for i, _ in mutations],
        diff_outputs=diff_outputs,
        requires_grad=[p.requires_grad for p in primals],
        grad_inputs=[i for i, g in enumerate(grad_nodes) if g is not None],
        output_alias_info=output_alias_info(outs, primals),
    )
    return _Trace(gm, {node.name: value for node, value in rec.values.items()})


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


# -- runtime ---------------------------------------------------------------------------------
def _run_graph(gm: fx.GraphModule, example_inputs: list) -> Callable[[list], Sequence]:
    """The default compiler: run the GraphModule as it is."""
    return lambda args: gm(*args)


class CompiledFunction(torch.autograd.Function):
    """Runs an ``AOTOutput``'s compiled forward; its backward runs the compiled backward."""

    @staticmethod
    def forward(ctx, aot: AOTOutput, *args: torch.Tensor):  # type: ignore[override]
        outs = list(aot.compiled_forward(list(args)))
        fwd = aot.unalias_outputs(outs[: aot.num_fwd_outputs], args)
        saved = outs[aot.num_fwd_outputs :]  # not user outputs: never copied
        is_tensor = [isinstance(s, torch.Tensor) for s in saved]
        ctx.save_for_backward(*[s for s, t in zip(saved, is_tensor) if t])
        ctx.non_tensors = [s for s, t in zip(saved, is_tensor) if not t]
        ctx.is_tensor, ctx.aot = is_tensor, aot
        # An output may be returned twice or be an input; autograd wants distinct tensors.
        seen = {id(a) for a in args}
        for i, out in enumerate(fwd):
            fwd[i] = out.view_as(out) if id(out) in seen else out
            seen.add(id(fwd[i]))
        ctx.mark_non_differentiable(
            *[o for i, o in enumerate(fwd) if i not in aot.diff_outputs]
        )
        return tuple(fwd)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outputs: torch.Tensor):  # type: ignore[override]
        aot: AOTOutput = ctx.aot
        tensors, others = iter(ctx.saved_tensors), iter(ctx.non_tensors)
        saved = [next(tensors) if t else next(others) for t in ctx.is_tensor]
        tangents = [grad_outputs[i].contiguous() for i in aot.diff_outputs]
        grads = list(aot.compiled_backward(saved + tangents))
        result: list[torch.Tensor | None] = [None] * len(aot.requires_grad)
        for index, grad in zip(aot.grad_inputs, grads):
            result[index] = grad
        return (None, *result)


@dataclasses.dataclass(repr=False)
class AOTOutput:
    """The result of ``aot_function``: the graphs, and a callable that runs them.

    Calling it with flat tensors returns a tuple of the outputs (differentiable through the
    compiled backward) and applies input mutations to the tensors passed in.
    """

    joint: fx.GraphModule | None
    forward: fx.GraphModule
    backward: fx.GraphModule | None
    saved_values: list[str]
    num_fwd_outputs: int  # user outputs + mutated input values (before the saved values)
    num_user_outputs: int
    mutated_inputs: list[int]
    requires_grad: list[bool]  # per input, as traced
    diff_outputs: list[int]  # user outputs that have a tangent
    grad_inputs: list[int]  # the input each backward output is the gradient of
    compiled_forward: Callable[[list], Sequence]
    compiled_backward: Callable[[list], Sequence] | None
    offset_sensitive: list[int] = dataclasses.field(default_factory=list)  # as_strided(input)
    output_alias_info: list[OutputAliasInfo] = dataclasses.field(default_factory=list)

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = [_with_layout(a, n.meta["val"]) for a, n in zip(args, self._placeholders())]
        for i in self.offset_sensitive:
            if args[i].storage_offset() != 0:
                raise RuntimeError(f"toycomp.aot: input {i} has a storage offset but the graph "
                                   "applies as_strided to it (traced with offset 0)")  # fmt: skip
        needs_grad = torch.is_grad_enabled() and any(a.requires_grad for a in args)
        if needs_grad and self.backward is None:
            raise RuntimeError("toycomp.aot: traced without autograd, but now an input "
                               "requires grad; trace again with the same requires_grad")
        new_grads = [i for i, a in enumerate(args) if a.requires_grad and not self.requires_grad[i]]
        if needs_grad and new_grads:
            raise RuntimeError(f"toycomp.aot: inputs {new_grads} require grad now but did not "
                               "when traced; trace again")
        if needs_grad:
            outs = CompiledFunction.apply(self, *inputs)
        else:
            with torch.no_grad():
                outs = list(self.compiled_forward(inputs))[: self.num_fwd_outputs]
                outs = self.unalias_outputs(outs, inputs)
        with torch.no_grad():  # the input-mutation epilogue, as in AOTAutograd
            for index, value in zip(self.mutated_inputs, outs[self.num_user_outputs :]):
                args[index].copy_(value)
        return tuple(outs[: self.num_user_outputs])

    # [Note: outputs that eager made fresh]
    # Stages 3/4 may turn a copy into nothing: aten.clone(x), contiguous, _to_copy to the same
    # dtype become x itself, so the compiled forward can return an input's storage where eager
    # returned a new tensor (and a user writing into the output would corrupt the input), or
    # one buffer for two outputs that eager kept apart. Like AOTAutograd's runtime wrappers
    # (OutputAliasInfo, collected in collect_metadata_analysis.py), we record while tracing
    # which inputs and earlier outputs each output shares storage with in eager. At call time
    # an output sharing storage with any *other* input or earlier output, or with a constant
    # of the forward graph (torch.tensor(...) is a get_attr copy made once, at trace time), is
    # replaced by a copy with eager's strides. This happens before the input-mutation epilogue
    # (the copy must hold the value the graph computed, not the input's new value) and, with
    # grad, inside CompiledFunction.forward, so the copy is the Function's output and gradients
    # flow through the compiled backward. Outputs that alias in eager (x, x.t(), x[1:]) are
    # left alone; saved values are not user outputs and are never copied.
    def unalias_outputs(self, outs: Sequence, inputs: Sequence) -> list:
        """``outs`` (user outputs first) with unexpected storage sharing copied away."""
        outs = list(outs)
        in_keys = [storage_key(x) for x in inputs] + self._constant_keys  # no output aliases those
        out_keys = [storage_key(o) for o in outs[: self.num_user_outputs]]
        for i, info in enumerate(self.output_alias_info[: self.num_user_outputs]):
            key = out_keys[i]
            clash = [j for j, k in enumerate(in_keys) if k == key and j not in info.aliased_inputs]
            clash += [j for j in range(i) if out_keys[j] == key and j not in info.aliased_outputs]
            if key is not None and clash:  # a copy with eager's strides (traced in meta["val"])
                eager = self.forward.graph.output_node().args[0][i].meta["val"]
                outs[i] = copy_like(outs[i], eager)
                out_keys[i] = storage_key(outs[i])
        return outs

    @functools.cached_property
    def _constant_keys(self) -> list:
        """Storages of the forward graph's constants: an output returning one must be copied."""
        targets = [n.target for n in self.forward.graph.nodes if n.op == "get_attr"]
        values = [operator.attrgetter(target)(self.forward) for target in targets]
        return [storage_key(v) for v in values if isinstance(v, torch.Tensor)]

    def _placeholders(self) -> list[fx.Node]:
        return [n for n in self.forward.graph.nodes if n.op == "placeholder"]

    def __repr__(self) -> str:
        parts = [
            f"AOTOutput(saved_values={self.saved_values}, num_fwd_outputs={self.num_fwd_outputs}"
            f", mutated_inputs={self.mutated_inputs})",
            "--- forward ---\n" + self.forward.code.strip(),
        ]
        if self.backward is not None:
            parts.append("--- backward ---\n" + self.backward.code.strip())
        return "\n".join(parts)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def _with_layout(arg: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """``arg`` with the strides it had when traced (a differentiable copy if they differ)."""
    if not isinstance(arg, torch.Tensor) or (arg.shape, arg.dtype) != (meta.shape, meta.dtype):
        raise RuntimeError(f"toycomp.aot: expected a {meta.dtype} tensor of shape "
                           f"{tuple(meta.shape)} like when traced; trace again")  # fmt: skip
    strides = zip(arg.shape, arg.stride(), meta.stride())
    if all(stride == traced for size, stride, traced in strides if size > 1):
        return arg
    out = torch.empty_strided(meta.shape, meta.stride(), dtype=arg.dtype, device=arg.device)
    return out.copy_(arg)


def _offset_sensitive(gm: fx.GraphModule) -> list[int]:
    """Inputs that the graph reads with as_strided (whose offsets are storage-absolute)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    uses = [{user.target for user in node.users} for node in placeholders]
    return [i for i, targets in enumerate(uses) if aten.as_strided.default in targets]


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
    fw_compiler = fw_compiler or _run_graph
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
        offset_sensitive=_offset_sensitive(forward),
        **{name: trace.gm.meta[name] for name in _RUNTIME_METADATA},
    )
