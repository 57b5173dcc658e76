"""Stage 4 without code generation: run the loop IR with vectorised torch ("Python backend").

Input: a ``ScheduledGraph`` (or a ``LoweredGraph``) and real input tensors. Output: the graph's
output tensors. Each kernel is evaluated for all ``x`` at once (``x = arange(numel)[:, None]``,
``r = arange(rnumel)[None, :]``); an index is a sympy expression evaluated with ``FloorDiv`` as
``//``; a load indexes the flat memory of a buffer; an ``Op`` calls the prim's eager reference;
graph constants (``ConstantBuffer``) are bound next to the inputs, and an extern call returning a
tuple defines one buffer per ``MultiOutput``.
It is the executable meaning of the IR, so lowering and scheduling can be tested (against eager
PyTorch) before, and independently of, the C++ and Triton code generators::

    >>> from toycomp.inductor.lowering import lower
    >>> from toycomp.inductor.scheduler import schedule
    >>> from toycomp.prims.decompositions import decompose
    >>> aten, a = torch.ops.aten, torch.randn(8, 1000)
    >>> gm = torch.fx.symbolic_trace(lambda a: aten._softmax.default(a, -1, False))
    >>> (out,) = run_scheduled(schedule(lower(decompose(gm, [a]), [a])), [a])
    >>> torch.allclose(out, torch.softmax(a, -1))
    True

NB: PyTorch has no such backend; the nearest thing is running Inductor's ``inner_fn`` closures
under a handler of torch/_inductor/virtualized.py's ``V.ops`` (see torch/_inductor/ops_handler.py).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import sympy
import torch

import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.inductor.runtime import (
    check_extern,
    check_input,
    reinterpret_tensor,
    resolve_extern,
    restride,
)

_REDUCE = {
    ir.ReductionType.SUM: torch.sum,
    ir.ReductionType.MAX: torch.amax,
    ir.ReductionType.MIN: torch.amin,
}


@dataclass
class _Env:
    buffers: dict[str, torch.Tensor]
    variables: dict[sympy.Symbol, torch.Tensor]
    locals: dict[str, torch.Tensor]
    device: torch.device


def run_scheduled(scheduled: ir.ScheduledGraph, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the kernels and extern calls of ``scheduled`` on ``inputs``; return the outputs."""
    buffers = _bind_inputs(scheduled.inputs, inputs, scheduled.constants, scheduled.device)
    for a in scheduled.allocations:
        buffers[a.name] = torch.empty_strided(
            a.size, a.stride, dtype=a.dtype, device=scheduled.device
        )
    for step in scheduled.steps:
        if isinstance(step, ir.ExternKernel):
            buffers.update(_run_extern(step, buffers))
        else:
            _run_kernel(step, _Env(buffers, {}, {}, scheduled.device))
    return _outputs(scheduled, buffers)


def run_lowered(lowered: ir.LoweredGraph, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``lowered`` buffer by buffer (no fusion): the reference for the scheduler."""
    buffers = _bind_inputs(lowered.inputs, inputs, lowered.constants, lowered.device)
    for node in lowered.nodes:
        if isinstance(node, ir.ExternKernel):
            buffers.update(_run_extern(node, buffers))
        else:
            buffers[node.name] = _run_buffer(node, _Env(buffers, {}, {}, lowered.device))
    return _outputs(lowered, buffers)


def _bind_inputs(specs, inputs, constants, device) -> dict[str, torch.Tensor]:
    """The buffer environment before the first step: the inputs, and the graph's constants
    (``ConstantBuffer``, bound at compile time like the wrapper's namespace does)."""
    if len(specs) != len(inputs):
        raise ValueError(f"expected {len(specs)} inputs, got {len(inputs)}")
    for spec, t in zip(specs, inputs):  # loads use the strides of lowering time: check them
        check_input(t, spec.size, spec.stride, spec.dtype, torch.device(device), spec.name)
    buffers = {spec.name: t for spec, t in zip(specs, inputs)}
    for c in constants:
        value = c.value.to(device)
        if (tuple(value.shape), tuple(value.stride()), value.dtype) != (c.size, c.stride, c.dtype):
            raise ValueError(f"constant {c.name}: {value.shape} {value.stride()} != {c}")
        buffers[c.name] = value
    return buffers


def _outputs(graph: ir.LoweredGraph | ir.ScheduledGraph, buffers) -> list[torch.Tensor | None]:
    """The graph's outputs: views of its buffers, laid out with ``output_strides`` where given;
    a constant is copied (a fresh tensor per call, as eager returns and the wrapper does)."""
    constants = {c.name for c in graph.constants}
    strides = graph.output_strides or (None,) * len(graph.outputs)
    results: list[torch.Tensor | None] = []
    for arg, stride in zip(graph.outputs, strides, strict=True):
        if arg is None:
            results.append(None)
            continue
        out = _view(buffers, arg)
        if stride is not None:
            out = restride(out, stride)
        elif arg.buffer in constants:
            out = out.clone()
        results.append(out)
    return results


def _run_kernel(kernel: ir.Kernel, env: _Env) -> None:
    env.variables = {
        indexing.x: torch.arange(kernel.numel, device=env.device)[:, None],
        indexing.r: torch.arange(kernel.rnumel, device=env.device)[None, :],
    }
    for loop in kernel.loops:
        shape = (kernel.numel, kernel.rnumel if loop.over_r else 1)
        for stmt in loop.body:
            value = _value(stmt.value, env).broadcast_to(shape)
            if isinstance(stmt, ir.Reduce):
                reduced = _REDUCE[stmt.reduction_type](value, dim=1, keepdim=True)
                env.locals[stmt.name] = reduced.to(stmt.dtype)
            else:
                out = env.buffers[stmt.buffer]
                _check_dtype(stmt.buffer, out.dtype, value.dtype)
                index = torch.as_tensor(_index(stmt.index, env), device=env.device)
                _flat(out)[index.broadcast_to(shape).reshape(-1)] = value.reshape(-1)


def _run_buffer(node: ir.Pointwise | ir.Reduction, env: _Env) -> torch.Tensor:
    rsize = node.reduction_size if isinstance(node, ir.Reduction) else ()
    dims = node.size + rsize
    names = indexing.index_vars("i", len(node.size)) + indexing.index_vars("r", len(rsize))
    for k, (v, n) in enumerate(zip(names, dims)):
        shape = [1] * len(dims)
        shape[k] = n
        env.variables[v] = torch.arange(n, device=env.device).reshape(shape)
    value = _value(node.body, env).broadcast_to(dims)
    if isinstance(node, ir.Reduction):
        value = _REDUCE[node.reduction_type](value.reshape(node.size + (-1,)), dim=-1)
    _check_dtype(node.name, node.dtype, value.dtype)
    return value.contiguous()


def _run_extern(
    node: ir.ExternKernel, buffers: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Call the eager kernel; return the buffers it defines: ``{node.name: result}``, or for a
    tuple result one buffer per ``MultiOutput`` (PyTorch: ``ir.MultiOutput``, read by getitem)."""

    def arg(a):
        if isinstance(a, ir.TensorArg):
            return _view(buffers, a)
        return type(a)(arg(b) for b in a) if isinstance(a, (tuple, list)) else a

    out = resolve_extern(node.kernel)(*arg(node.args), **{k: arg(v) for k, v in node.kwargs})
    if not node.outputs:
        return {node.name: check_extern(out, node.size, node.stride, node.dtype, node.name)}
    if not isinstance(out, (tuple, list)):
        raise RuntimeError(f"{node.kernel} returned a {type(out).__name__}, lowering said a tuple")
    return {
        o.name: check_extern(out[o.index], o.size, o.stride, o.dtype, o.name) for o in node.outputs
    }


def _value(expr: ir.Expr, env: _Env) -> torch.Tensor:
    """Evaluate ``expr``: each distinct node once, its arguments first (iteratively: see
    [Note: expressions are DAGs] in ir.py)."""
    values: dict[int, torch.Tensor] = {}
    for node in ir.post_order(expr):
        args = [values[id(a)] for a in node.args] if isinstance(node, ir.Op) else []
        values[id(node)] = _node_value(node, args, env)
    return values[id(expr)]


def _node_value(expr: ir.Expr, args: list[torch.Tensor], env: _Env) -> torch.Tensor:
    if isinstance(expr, ir.Load):
        return _flat(env.buffers[expr.buffer])[_index(expr.index, env)]
    if isinstance(expr, ir.Constant):
        return torch.tensor(expr.value, dtype=expr.dtype, device=env.device)
    if isinstance(expr, ir.IndexValue):
        return torch.as_tensor(_index(expr.index, env), device=env.device).to(expr.dtype)
    if isinstance(expr, ir.Local):
        return env.locals[expr.name]
    if expr.name == "convert_element_type":
        out = args[0].to(expr.dtype)
    else:
        out = prims.PRIM_INFO[prims.PRIMS[expr.name]].ref(*args)
    _check_dtype(expr.name, expr.dtype, out.dtype)
    return out


def _index(expr: sympy.Expr, env: _Env):
    """Evaluate an index: Python int or integer tensor (FloorDiv is ``//``)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return env.variables[expr]
    args = [_index(a, env) for a in expr.args]
    if isinstance(expr, indexing.FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return functools.reduce(operator.add if expr.is_Add else operator.mul, args)
    raise NotImplementedError(f"interpret: index expression {expr}")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The memory a Load indexes: element offsets from ``t``'s first element."""
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    return t.as_strided((extent,), (1,))


def _view(buffers: dict[str, torch.Tensor], arg: ir.TensorArg) -> torch.Tensor:
    return reinterpret_tensor(buffers[arg.buffer], arg.size, arg.stride, arg.offset)


def _check_dtype(what: str, expected: torch.dtype, got: torch.dtype) -> None:
    if expected != got:
        raise RuntimeError(f"interpret: {what} has dtype {got}, the IR says {expected}")
