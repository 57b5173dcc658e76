"""AOTAutograd's runtime: compiled forward / backward callables -> a differentiable callable.

Input: the forward and backward graphs that toycomp/aot/aot_autograd.py traced and partitioned,
their compiled callables (``compiler(gm, example_inputs)``'s results) and the metadata collected
while tracing (mutated inputs, which outputs have tangents, ``OutputAliasInfo`` per output).
Output: an ``AOTOutput``, called like the traced function on flat tensors.

    >>> import torch
    >>> from toycomp.aot.aot_autograd import aot_function
    >>> def f(x, buf):
    ...     buf.add_(1)
    ...     return x.sin() * buf
    >>> x, buf = torch.randn(3, requires_grad=True), torch.zeros(3)
    >>> aot = aot_function(f, [x, buf])   # traces on copies: buf is still zero
    >>> aot.mutated_inputs
    [1]
    >>> out, = aot(x, buf)  # CompiledFunction.apply: compiled forward, then buf.copy_(new buf)
    >>> buf
    tensor([1., 1., 1.])
    >>> out.grad_fn.name()  # out.backward() runs the compiled backward on saved values + grad
    'CompiledFunctionBackward'

``AOTOutput.__call__`` checks the inputs against the traced ones (shapes, dtypes, strides,
storage offsets for ``as_strided``), runs the compiled forward inside ``CompiledFunction`` (a
``torch.autograd.Function`` whose backward runs the compiled backward), copies the new values
of mutated inputs back into them, and makes sure outputs share memory with inputs exactly where
eager's do ([Note: outputs that eager made fresh]).

NB: in PyTorch this lives in torch/_functorch/_aot_autograd/runtime_wrappers.py (the runtime
wrappers, ``AOTDispatchAutograd``'s ``CompiledFunction``) and
torch/_functorch/_aot_autograd/collect_metadata_analysis.py / schemas.py (``OutputAliasInfo``).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from toycomp._torch_compat import LayoutsSeen, clear_saved_tensors
from toycomp.aot.functional_utils import copy_like, storage_key
from toycomp.symbolic_shapes import SymbolicInputs, symbolic_inputs
from toycomp.tensor_utils import same_strides

__all__ = [
    "AOTOutput",
    "CompiledFunction",
    "CompiledFunctionBackward",
    "OutputAliasInfo",
    "offset_sensitive_inputs",
    "output_alias_info",
    "run_graph",
]

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class OutputAliasInfo:
    """The inputs and earlier outputs that one user output shared storage with, in eager."""

    aliased_inputs: frozenset[int]
    aliased_outputs: frozenset[int]
    is_input: int | None = None  # the output IS this input (x.add_(y) returns x itself)


def output_alias_info(outs: Sequence[torch.Tensor], inputs: Sequence) -> list[OutputAliasInfo]:
    """Which inputs / earlier outputs each of ``outs`` shares storage with (or is)."""
    in_keys, out_keys = [storage_key(x) for x in inputs], [storage_key(o) for o in outs]
    return [OutputAliasInfo(frozenset(j for j, k in enumerate(in_keys) if key and k == key),
                            frozenset(j for j, k in enumerate(out_keys[:i]) if key and k == key),
                            next((j for j, x in enumerate(inputs) if x is out), None))
            for i, (out, key) in enumerate(zip(outs, out_keys))]  # fmt: skip


def run_graph(gm: fx.GraphModule, example_inputs: list) -> Callable[[list], Sequence]:
    """The default compiler: run the GraphModule as it is."""
    return lambda args: gm(*args)


class CompiledFunction(torch.autograd.Function):
    """Runs an ``AOTOutput``'s compiled forward; its backward runs the compiled backward."""

    @staticmethod
    def forward(ctx, aot: AOTOutput, *args: torch.Tensor):  # type: ignore[override]
        fwd, saved = aot.run_forward(args)
        if aot.mutated_inputs:  # the epilogue will overwrite inputs the backward may read
            saved = aot.unshare_mutated(saved, args)
        ctx.save_for_backward(*[s for s in saved if isinstance(s, torch.Tensor)])
        ctx.sizes = [s for s in saved if not isinstance(s, torch.Tensor)]  # (after the tensors)
        ctx.aot = aot
        if len(set(map(id, [*fwd, *args]))) < len(fwd) + len(args):  # an object given twice
            fwd = _distinct_outputs(fwd, args)
        ctx.mark_non_differentiable(*[o for i, o in enumerate(fwd)
                                      if i not in aot.diff_outputs and isinstance(o, torch.Tensor)])
        return tuple(fwd)

    @staticmethod
    @torch.compiler.disable  # [Note: the compiled callable is opaque to Dynamo] in pipeline.py
    def backward(ctx, *grad_outputs: torch.Tensor):  # type: ignore[override]
        aot: AOTOutput = ctx.aot
        args = [*ctx.saved_tensors, *ctx.sizes]  # the backward's inputs: saved values, tangents
        args += [_offset_free(grad_outputs[i].contiguous()) for i in aot.diff_outputs]
        if torch.is_grad_enabled():  # create_graph=True: see [Note: double backward]
            grads = CompiledFunctionBackward.apply(aot, _GRAPH_ANCHOR, *args)
        else:  # the backward may free each saved value once dead: hand over our references
            clear_saved_tensors(ctx)  # (kept when retain_graph=True)
            grads = getattr(aot.compiled_backward, "call_boxed", aot.compiled_backward)(args)
        grads = dict(zip(aot.grad_inputs, grads))  # the input each gradient is for
        return (None, *[grads.get(i) for i in range(len(aot.requires_grad))])


def _distinct_outputs(fwd: list, args: Sequence) -> list:
    """An output may be returned twice or be an input; autograd wants distinct tensors."""
    seen = {id(a) for a in args if isinstance(a, torch.Tensor)}
    for i, out in enumerate(fwd):
        if isinstance(out, torch.Tensor):
            fwd[i] = out.view_as(out) if id(out) in seen else out
            seen.add(id(fwd[i]))
    return fwd


# [Note: double backward]
# With create_graph=True, autograd runs CompiledFunction.backward with grad mode on and expects
# gradients that are themselves differentiable. The compiled backward is not: its kernels run
# on saved values that were detached in the forward, so its results would have no grad_fn and a
# second torch.autograd.grad would silently miss every term that flows through them (once_
# differentiable does not help: it only looks at the incoming gradients, not at the saved
# values). Like AOTAutograd's CompiledFunction._double_backward, we run the compiled backward
# inside one more autograd.Function, anchored to a tensor that requires grad so that its
# results always get a grad_fn, whose own backward raises a clear error. First-order gradients
# with create_graph=True keep their values; only differentiating them again is refused.
_GRAPH_ANCHOR = torch.empty(0, requires_grad=True)
DOUBLE_BACKWARD_ERROR = (
    "toycomp.aot: double backward through a toycomp-compiled function is not supported (as in "
    "PyTorch: 'torch.compile with aot_autograd does not currently support double backward'). "
    "Compute higher-order gradients with the uncompiled function, or compile only the part "
    "that needs no second derivative."
)


class CompiledFunctionBackward(torch.autograd.Function):
    """Runs the compiled backward when autograd records it (create_graph=True); refuses to be
    differentiated again ([Note: double backward])."""

    @staticmethod
    @torch.compiler.disable  # as CompiledFunction.backward
    def forward(ctx, aot: AOTOutput, anchor: torch.Tensor, *args: Any):  # type: ignore[override]
        return tuple(aot.compiled_backward(list(args)))

    @staticmethod
    def backward(ctx, *grads: Any):  # type: ignore[override]
        raise RuntimeError(DOUBLE_BACKWARD_ERROR)


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
    diff_outputs: list[int]  # forward outputs that have a tangent (user outputs, mutated inputs)
    grad_inputs: list[int]  # the input each backward output is the gradient of
    compiled_forward: Callable[[list], Sequence]
    compiled_backward: Callable[[list], Sequence] | None
    offset_sensitive: list[int] = dataclasses.field(default_factory=list)  # as_strided(input)
    enables_grad: bool = False  # the graph turns grad mode on itself (``enable_grad`` inside)
    output_alias_info: list[OutputAliasInfo] = dataclasses.field(default_factory=list)
    inputs_seen: LayoutsSeen | None = None  # fast_guards: [Note: inputs checked once]

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = self._with_layouts(args) if self.inputs_seen is None else self._seen(args)
        if self.offset_sensitive:  # as_strided reads an input: its storage offset must be 0
            self._check_offsets(args)
        if (torch.is_grad_enabled() or self.enables_grad) and any(map(_requires_grad, args)):
            if any(_requires_grad(a) and not self.requires_grad[i] for i, a in enumerate(args)):
                raise self._new_grads_error(args)
            with torch.enable_grad():  # (outputs made under the graph's no_grad: not diff)
                outs = CompiledFunction.apply(self, *inputs)
        else:
            with torch.no_grad():
                outs = self.run_forward(inputs)[0]  # (no saved values needed)
        if self.mutated_inputs or any(i.is_input is not None for i in self.output_alias_info):
            return self._epilogue(args, outs)  # in-place ops on inputs
        return tuple(outs[: self.num_user_outputs])

    def _epilogue(self, args: Sequence[torch.Tensor], outs: Sequence) -> tuple:
        """The user outputs, once the new values of mutated inputs are copied into ``args``."""
        if self.mutated_inputs:
            self._apply_mutations(args, outs[self.num_user_outputs :])
        return tuple(self._inputs_as_outputs(args, outs[: self.num_user_outputs]))

    def _check_offsets(self, args: Sequence[torch.Tensor]) -> None:
        for i in self.offset_sensitive:
            if args[i].storage_offset() != 0:
                raise RuntimeError(f"toycomp.aot: aten.as_strided on input {i}, which has a "
                                   "storage offset, is not supported (traced with offset 0)")

    def _apply_mutations(self, args: Sequence[torch.Tensor], values: Sequence) -> None:
        """The input-mutation epilogue, as in AOTAutograd.

        A new value that requires grad came from a mutation autograd recorded ([Note: mutated
        inputs that require grad] in aot_autograd.py): copying it with grad on gives the
        caller's tensor eager's history (and, for a leaf, eager's error). Other mutations
        (buffers, a parameter clamped under no_grad) are copied without autograd seeing them,
        as they happened in eager.
        """
        for index, value in zip(self.mutated_inputs, values):
            with torch.set_grad_enabled(value.requires_grad and torch.is_grad_enabled()):
                args[index].copy_(value)

    def _inputs_as_outputs(self, args: Sequence[torch.Tensor], outs: Sequence) -> list:
        """An output that was an input in eager (an in-place op's result) is that input, now
        holding its new value: writes through it reach the caller's tensor."""
        outs = list(outs)
        for i, info in enumerate(self.output_alias_info[: self.num_user_outputs]):
            if info.is_input is not None:
                outs[i] = args[info.is_input]
        return outs

    def unshare_mutated(self, saved: Sequence, args: Sequence) -> list:
        """Saved values, with copies of those sharing memory with an input about to be mutated.

        The backward may need an input's old value (``primals_1``) that the epilogue then
        overwrites; saving the input itself would fail autograd's version check, or worse.
        """
        keys = {storage_key(args[i]) for i in self.mutated_inputs} - {None}
        if not keys:
            return list(saved)
        return [s.clone() if isinstance(s, torch.Tensor) and storage_key(s) in keys else s
                for s in saved]  # fmt: skip

    def _new_grads_error(self, args: Sequence[torch.Tensor]) -> RuntimeError:
        """An input requires grad now but did not when traced (or all, if traced without
        autograd)."""
        if self.backward is None:
            return RuntimeError("toycomp.aot: traced without autograd, but now an input requires "
                                "grad; trace again with the same requires_grad")  # fmt: skip
        new = [i for i, a in enumerate(args) if _requires_grad(a) and not self.requires_grad[i]]
        return RuntimeError(f"toycomp.aot: inputs {new} require grad now but did not when "
                            "traced; trace again")  # fmt: skip

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
    # left alone; saved values are not user outputs and are never copied. A compiler may
    # promise that some outputs are fresh (toycomp's CompiledGraph.fresh_outputs: buffers its
    # own kernels wrote, each returned once); when all user outputs are, nothing is checked.
    def run_forward(self, inputs: Sequence) -> tuple[list, list]:
        """The compiled forward's outputs (unexpected storage sharing copied away), saved values."""
        outs = list(self.compiled_forward(list(inputs)))
        fwd, saved = outs[: self.num_fwd_outputs], outs[self.num_fwd_outputs :]
        fresh = getattr(self.compiled_forward, "fresh_outputs", ())
        if len(fresh) < self.num_user_outputs or not all(fresh[: self.num_user_outputs]):
            fwd = self._copy_shared_outputs(fwd, inputs)  # (unless the compiler says: all new)
        return fwd, saved

    def _copy_shared_outputs(self, outs: list, inputs: Sequence) -> list:
        """``outs`` with the outputs that share storage unlike eager's replaced by copies."""
        in_keys = [storage_key(x) for x in inputs] + self._constant_keys  # no output aliases those
        out_keys = [storage_key(o) for o in outs[: self.num_user_outputs]]
        for i, info in enumerate(self.output_alias_info[: self.num_user_outputs]):
            key = out_keys[i]
            clash = [j for j, k in enumerate(in_keys) if k == key and j not in info.aliased_inputs]
            clash += [j for j in range(i) if out_keys[j] == key and j not in info.aliased_outputs]
            if key is not None and clash:  # a copy with eager's strides (traced in meta["val"])
                eager = self.forward.graph.output_node().args[0][i].meta["val"]
                outs[i] = copy_like(outs[i], self._concrete(eager, inputs))
                out_keys[i] = storage_key(outs[i])
        return outs

    @functools.cached_property
    def _constant_keys(self) -> list:
        """Storages of the forward graph's constants: an output returning one must be copied."""
        targets = [n.target for n in self.forward.graph.nodes if n.op == "get_attr"]
        values = [operator.attrgetter(target)(self.forward) for target in targets]
        return [storage_key(v) for v in values if isinstance(v, torch.Tensor)]

    # [Note: inputs with symbolic sizes] With dynamic shapes a forward input's traced value has
    # sizes such as (s0, 3), and sizes are inputs too (Dynamo's s0). On each call we read every
    # symbol's value from the first input that holds it (a size input, else a tensor's size),
    # compute the shapes and strides all inputs must then have, and check them as for static
    # inputs: a mismatch raises instead of running kernels on the wrong sizes. Inputs seen
    # before are not checked again ([Note: inputs checked once] in inductor/runtime.py).
    @functools.cached_property
    def _traced_inputs(self) -> tuple[list, list, SymbolicInputs | None]:
        """The forward's inputs as traced: meta values, (shape, strides), symbols if dynamic."""
        vals = [n.meta["val"] for n in self.forward.graph.find_nodes(op="placeholder")]
        layouts = [(m.shape, m.stride()) if isinstance(m, torch.Tensor) else None for m in vals]
        return vals, layouts, symbolic_inputs(vals)

    def _with_layouts(self, args: Sequence) -> list:
        """``args`` with the layouts they were traced with (a copy where strides differ)."""
        vals, layouts, symbolic = self._traced_inputs
        if symbolic is not None:  # dynamic shapes: the layouts for this call's sizes
            layouts = symbolic.layouts(args)
        return [a if layout is None else _with_layout(a, *layout, m.dtype)
                for a, m, layout in zip(args, vals, layouts)]  # fmt: skip

    def _seen(self, args: Sequence) -> list:
        """``_with_layouts``, skipped when one C++ call finds the inputs like the last ones that
        passed (``fast_guards``: [Note: inputs checked once] in inductor/runtime.py)."""
        if self.inputs_seen.check(*args):
            return list(args)
        inputs = self._with_layouts(args)
        if all(isinstance(a, torch.Tensor) and a is b for a, b in zip(args, inputs)):
            self.inputs_seen.remember(*args)
        return inputs

    def _concrete(self, meta: torch.Tensor, args: Sequence) -> tuple[tuple, tuple]:
        """(shape, strides) of a traced value in the call with inputs ``args``."""
        symbolic = self._traced_inputs[2]
        if symbolic is None:
            return tuple(meta.shape), meta.stride()
        return symbolic.evaluate(meta, args)

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


def _requires_grad(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


def _with_layout(arg: torch.Tensor, shape: tuple, stride: tuple, dtype) -> torch.Tensor:
    """``arg`` with the strides it had when traced (a differentiable copy if they differ)."""
    if not isinstance(arg, torch.Tensor) or (arg.shape, arg.dtype) != (shape, dtype):
        raise RuntimeError(f"toycomp.aot: expected a {dtype} tensor of shape "
                           f"{tuple(shape)} like when traced; trace again")  # fmt: skip
    if arg.stride() == stride or same_strides((shape, stride), arg):  # the first: a quick check
        return arg
    return torch.empty_strided(shape, stride, dtype=arg.dtype, device=arg.device).copy_(arg)


def offset_sensitive_inputs(gm: fx.GraphModule, num_inputs: int) -> list[int]:
    """The inputs that ``gm`` reads with as_strided ([Note: as_strided reads memory])."""
    inputs = list(gm.graph.find_nodes(op="placeholder"))[:num_inputs]
    return [i for i, n in enumerate(inputs) if isinstance(n.meta.get("val"), torch.Tensor)
            and aten.as_strided.default in {u.target for u in n.users}]  # fmt: skip


def _offset_free(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy if it starts inside its storage (the backward may ``as_strided`` it)."""
    return t if t.storage_offset() == 0 else t.clone(memory_format=torch.contiguous_format)
