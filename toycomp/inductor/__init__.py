"""Stage 4, inductor: a prims graph -> loop IR -> fused kernels -> C++ / Triton -> a callable.

Input IR -> output: a ``GraphModule`` of prims (stage 3's output) and example inputs ->
``lower`` -> ``ir.LoweredGraph`` (the buffers that must exist in memory, each with a loop body)
-> ``schedule`` -> ``ir.ScheduledGraph`` (buffers fused into ``Kernel``s over flat variables
``x`` and ``r``) -> ``compile_graph`` -> C++ or Triton source per kernel, plus a Python
``call(args)`` wrapper that allocates buffers and launches them: a ``CompiledGraph``.
The forward of ``f(x) = sin(x)**2 + cos(x)**2``, one fused kernel::

    >>> import torch
    >>> from toycomp.inductor.lowering import lower
    >>> from toycomp.inductor.scheduler import schedule
    >>> from toycomp.prims.decompositions import decompose
    >>> aten = torch.ops.aten
    >>> def f(a):  # the ATen graph that toycomp.aot records for sin(a)**2 + cos(a)**2
    ...     sin, cos = aten.sin.default(a), aten.cos.default(a)
    ...     return aten.add.Tensor(aten.pow.Tensor_Scalar(sin, 2), aten.pow.Tensor_Scalar(cos, 2))
    >>> x = torch.randn(1000)
    >>> lowered = lower(decompose(torch.fx.symbolic_trace(f), [x]), [x])
    >>> lowered
    input a[1000] torch.float32
    buf0[1000] = add(mul(sin(load(a, i0)), sin(load(a, i0))), mul(cos(load(a, i0)), ...))
    return TensorArg(buffer='buf0', size=(1000,), stride=(1,), offset=0)
    >>> schedule(lowered)
    allocate buf0[1000] torch.float32
    kernel_0(numel=1000, rnumel=1):  # ('sin', 'mul', 'cos', 'mul_1', 'add')
      once:
        buf0[x] = add(mul(sin(load(a, x)), sin(load(a, x))), mul(cos(load(a, x)), ...))
    return TensorArg(buffer='buf0', size=(1000,), stride=(1,), offset=0)

Files, in reading order:

* ``indexing.py``: sympy index arithmetic (where element ``(i0, i1)`` lives in memory);
* ``sizevars.py``: dynamic shapes: PyTorch's SymInts -> expressions in the sizes ``s0, s1...``;
* ``loop_body.py``, ``ir.py``: the loop IR: value expressions (a loop's body), then buffers and
  kernels;
* ``tensor_value.py``, ``lowering_table.py``, ``lowering_rules.py``, ``lowering_meta.py``,
  ``lowering.py``: lowering, one rule per prim; views are index maps, never copies;
* ``scheduler.py``: fusion into kernels; ``interpret.py`` runs any of these IRs with torch;
* ``codegen/``: kernels -> source text (shared part, C++, Triton);
* ``runtime.py``, ``wrapper.py``: the ``call(args)`` function and what it calls at run time;
* ``cache.py``: compiled kernels on disk;
* ``opt/``: the optimisations, one pass a file behind a flag of ``toycomp.config`` (split
  reductions, memory planning, vector math, C++ layouts, CUDA graphs, autotuning...), entered at
  named hook points; none runs in the ``teach`` preset.

NB: in PyTorch this lives in torch/_inductor: lowering.py (the ``lowerings`` table), graph.py
(``GraphLowering``), ir.py, scheduler.py, codegen/common.py, codegen/cpp.py, codegen/triton.py,
codegen/wrapper.py and codecache.py.
"""
