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
from dataclasses import dataclass, field

import sympy
import torch

import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.symbolic_shapes import evaluate
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
    sizes: dict[sympy.Symbol, int] = field(default_factory=dict)  # s0 -> this call's value

    def size(self, value):
        """A size of the IR (an int, or an expression in ``s0, s1...``) for this call."""
        return value if indexing.is_static(value) else _index(value, self)


def run_scheduled(scheduled: ir.ScheduledGraph, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the kernels and extern calls of ``scheduled`` on ``inputs``; return the outputs."""
    env = _bind_inputs(scheduled, inputs)
    for a in scheduled.allocations:
        env.buffers[a.name] = torch.empty_strided(
            _sizes(a.size, env), _sizes(a.stride, env), dtype=a.dtype, device=scheduled.device
        )
    for step in scheduled.steps:
        if isinstance(step, ir.ExternKernel):
            env.buffers.update(_run_extern(step, env))
        else:
            _run_kernel(step, _Env(env.buffers, dict(env.sizes), {}, env.device, env.sizes))
    return _outputs(scheduled, env)


def run_lowered(lowered: ir.LoweredGraph, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``lowered`` buffer by buffer (no fusion): the reference for the scheduler."""
    env = _bind_inputs(lowered, inputs)
    for node in lowered.nodes:
        if isinstance(node, ir.ExternKernel):
            env.buffers.update(_run_extern(node, env))
        elif isinstance(node, ir.Scatter):
            run_env = _Env(env.buffers, dict(env.sizes), {}, env.device, env.sizes)
            env.buffers[node.name] = _run_scatter(node, run_env)
        else:
            run_env = _Env(env.buffers, dict(env.sizes), {}, env.device, env.sizes)
            env.buffers[node.name] = _run_buffer(node, run_env)
    return _outputs(lowered, env)


def _bind_inputs(graph: ir.LoweredGraph | ir.ScheduledGraph, inputs: list) -> _Env:
    """The environment before the first step: the inputs, the values of the size symbols
    (``s0`` read from the first input that has it as a size, stride or value, as the wrapper
    does), and the graph's constants (``ConstantBuffer``, bound at compile time like the
    wrapper's namespace does)."""
    specs, constants, device = graph.inputs, graph.constants, graph.device
    if len(specs) != len(inputs):
        raise ValueError(f"expected {len(specs)} inputs, got {len(inputs)}")
    env = _Env({}, {}, {}, torch.device(device))
    for spec, value in zip(specs, inputs):
        if isinstance(spec, ir.SizeInput) and isinstance(spec.expr, sympy.Symbol):
            env.sizes.setdefault(spec.expr, value)  # (an int s0, or a float f0)
    for what in ("size", "stride"):
        for spec, t in zip(specs, inputs):
            for dim, size in enumerate(getattr(spec, what, ())):
                if isinstance(size, sympy.Symbol):
                    env.sizes.setdefault(size, getattr(t, what)(dim))
    for scalar in graph.scalars:  # f0 = 2.0 / (s0 - 1): Python floats, as in the wrapper
        env.sizes.setdefault(scalar.symbol, evaluate(scalar.expr, env.sizes))
    env.variables = dict(env.sizes)
    for spec, t in zip(specs, inputs):  # loads use the strides of lowering time: check them
        if isinstance(spec, ir.SizeInput):
            if env.size(spec.expr) != t:
                raise ValueError(f"input {spec.name}: compiled for {spec.expr}, got {t}")
            continue
        size, stride = _sizes(spec.size, env), _sizes(spec.stride, env)
        where = None if spec.any_device else spec.device or torch.device(device)
        check_input(t, size, stride, spec.dtype, where, spec.name)
    env.buffers = {spec.name: t for spec, t in zip(specs, inputs)}
    buffers = env.buffers
    for c in constants:
        value = c.value.to(device)
        if (tuple(value.shape), tuple(value.stride()), value.dtype) != (c.size, c.stride, c.dtype):
            raise ValueError(f"constant {c.name}: {value.shape} {value.stride()} != {c}")
        buffers[c.name] = value
    return env


def _sizes(values, env: _Env) -> tuple[int, ...]:
    return tuple(int(env.size(v)) for v in values)


def _outputs(graph: ir.LoweredGraph | ir.ScheduledGraph, env: _Env) -> list[torch.Tensor | None]:
    """The graph's outputs: views of its buffers, laid out with ``output_strides`` where given;
    a constant is copied (a fresh tensor per call, as eager returns and the wrapper does); a
    size output is its value for this call."""
    constants = {c.name for c in graph.constants}
    strides = graph.output_strides or (None,) * len(graph.outputs)
    results: list[torch.Tensor | None] = []
    for arg, stride in zip(graph.outputs, strides, strict=True):
        if arg is None or not isinstance(arg, ir.TensorArg):
            results.append(arg if arg is None else int(env.size(arg)))
            continue
        out = _view(env, arg)
        if stride is not None:
            out = restride(out, _sizes(stride, env))
        elif arg.buffer in constants:
            out = out.clone()
        results.append(out)
    return results


def _run_kernel(kernel: ir.Kernel, env: _Env) -> None:
    numel, rnumel = int(env.size(kernel.numel)), int(env.size(kernel.rnumel))
    env.variables[indexing.x] = torch.arange(numel, device=env.device)[:, None]
    env.variables[indexing.r] = torch.arange(rnumel, device=env.device)[None, :]
    for loop in kernel.loops:
        shape = (numel, rnumel if loop.over_r else 1)
        for stmt in loop.body:
            value = _value(stmt.value, env).broadcast_to(shape)
            if isinstance(stmt, ir.Reduce):
                reduced = _REDUCE[stmt.reduction_type](value, dim=1, keepdim=True)
                env.locals[stmt.name] = reduced.to(stmt.dtype)
            elif isinstance(stmt, ir.ColumnReduce):  # over each program's rows, at its first
                rows = kernel.rows_per_program
                value = _REDUCE[stmt.reduction_type](value.reshape(-1, rows, rnumel), dim=1)
                env.variables[indexing.x] = torch.arange(0, numel, rows, device=env.device)[:, None]
                index = torch.as_tensor(_index(stmt.index, env), device=env.device)
                env.variables[indexing.x] = torch.arange(numel, device=env.device)[:, None]
                out = env.buffers[stmt.buffer]
                index = index.broadcast_to(value.shape).reshape(-1)
                _flat(out)[index] = value.reshape(-1).to(out.dtype)
            else:
                out = env.buffers[stmt.buffer]
                _check_dtype(stmt.buffer, out.dtype, value.dtype)
                indirect = [_value(v, env) for v in stmt.indirect]
                index = torch.as_tensor(_indirect_index(stmt.index, indirect, env))
                index = index.to(env.device).broadcast_to(shape).reshape(-1)
                _flat(out).index_put_((index,), value.reshape(-1), accumulate=stmt.accumulate)


def _run_buffer(node: ir.Pointwise | ir.Reduction, env: _Env) -> torch.Tensor:
    rsize = node.reduction_size if isinstance(node, ir.Reduction) else ()
    dims = _sizes(node.size + rsize, env)
    names = indexing.index_vars("i", len(node.size)) + indexing.index_vars("r", len(rsize))
    for k, (v, n) in enumerate(zip(names, dims)):
        shape = [1] * len(dims)
        shape[k] = n
        env.variables[v] = torch.arange(n, device=env.device).reshape(shape)
    value = _value(node.body, env).broadcast_to(dims)
    if isinstance(node, ir.Reduction):
        value = _REDUCE[node.reduction_type](value.reshape(dims[: len(node.size)] + (-1,)), dim=-1)
    _check_dtype(node.name, node.dtype, value.dtype)
    return value.contiguous()


def _run_scatter(node: ir.Scatter, env: _Env) -> torch.Tensor:
    """``name = init``, then each element of the source stored (or added) at its index."""
    out = _run_buffer(ir.Pointwise(node.name, node.size, node.dtype, node.init), env)
    dims = _sizes(node.src_size, env)
    for k, (v, n) in enumerate(zip(indexing.index_vars("i", len(dims)), dims)):
        env.variables[v] = torch.arange(n, device=env.device).reshape([-1 if j == k else 1
                                                                        for j in range(len(dims))])
    value = _value(node.value, env).broadcast_to(dims).reshape(-1)
    indirect = [_value(v, env) for v in node.indirect]
    index = torch.as_tensor(_indirect_index(node.index, indirect, env), device=env.device)
    out.view(-1).index_put_((index.broadcast_to(dims).reshape(-1),), value.to(out.dtype),
                            accumulate=node.accumulate)
    return out


def _run_extern(node: ir.ExternKernel, env: _Env) -> dict[str, torch.Tensor]:
    """Call the eager kernel; return the buffers it defines: ``{node.name: result}``, or for a
    tuple result one buffer per ``MultiOutput`` (PyTorch: ``ir.MultiOutput``, read by getitem)."""

    def arg(a):
        if isinstance(a, ir.TensorArg):
            return _view(env, a)
        if isinstance(a, sympy.Expr):
            return int(env.size(a))
        return type(a)(arg(b) for b in a) if isinstance(a, (tuple, list)) else a

    def check(t, o):
        return check_extern(t, _sizes(o.size, env), _sizes(o.stride, env), o.dtype, o.name)

    out = resolve_extern(node.kernel)(*arg(node.args), **{k: arg(v) for k, v in node.kwargs})
    if not node.outputs:
        return {node.name: check(out, node)}
    if not isinstance(out, (tuple, list)):
        raise RuntimeError(f"{node.kernel} returned a {type(out).__name__}, lowering said a tuple")
    return {o.name: check(out[o.index], o) for o in node.outputs}


def _value(expr: ir.Expr, env: _Env) -> torch.Tensor:
    """Evaluate ``expr``: each distinct node once, its arguments first (iteratively: see
    [Note: expressions are DAGs] in loop_body.py)."""
    values: dict[int, torch.Tensor] = {}
    for node in ir.post_order(expr):
        args = [values[id(a)] for a in ir.children(node)]
        values[id(node)] = _node_value(node, args, env)
    return values[id(expr)]


def _node_value(expr: ir.Expr, args: list[torch.Tensor], env: _Env) -> torch.Tensor:
    if isinstance(expr, ir.Load):
        return _flat(env.buffers[expr.buffer])[_indirect_index(expr.index, args, env)]
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


def _indirect_index(expr: sympy.Expr, values: list[torch.Tensor], env: _Env):
    """``expr`` evaluated with ``ind<k>`` bound to ``values[k]`` ([Note: indirect indexing])."""
    symbols = [ir.indirect_symbol(k) for k in range(len(values))]
    env.variables.update((s, v.to(torch.int64)) for s, v in zip(symbols, values))
    try:
        return _index(expr, env)
    finally:
        for s in symbols:
            env.variables.pop(s)


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
    if isinstance(expr, (sympy.Min, sympy.Max)):  # (index arithmetic: a clamp)
        pick = torch.minimum if isinstance(expr, sympy.Min) else torch.maximum
        return functools.reduce(lambda a, b: pick(torch.as_tensor(a), torch.as_tensor(b)), args)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        return args[0] ** int(expr.exp)
    raise NotImplementedError(f"interpret: index expression {expr}")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The memory a Load indexes: element offsets from ``t``'s first element."""
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    return t.as_strided((extent,), (1,))


def _view(env: _Env, arg: ir.TensorArg) -> torch.Tensor:
    size, stride = _sizes(arg.size, env), _sizes(arg.stride, env)
    return reinterpret_tensor(env.buffers[arg.buffer], size, stride, int(env.size(arg.offset)))


def _check_dtype(what: str, expected: torch.dtype, got: torch.dtype) -> None:
    if expected != got:
        raise RuntimeError(f"interpret: {what} has dtype {got}, the IR says {expected}")
