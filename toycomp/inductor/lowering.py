"""Stage 4b: lowering, a prims graph -> the loop IR (``ir.LoweredGraph``).

Input: a ``torch.fx.GraphModule`` whose ``call_function`` targets are toycomp prims or ATen ops,
plus real example inputs. Output: ``LoweredGraph``, the buffers that must exist in memory, each
with a loop body over its own index variables. Every prim has a rule in ``LOWERINGS``; values
stay *unrealized* expressions (size, dtype, body over ``i0, i1, ...``) that flow into their users,
and only become buffers when they must (see [Note: when to realize]). A transpose is only an
index map: returned alone it is a strided view of its input, under ``exp`` it is read through::

    >>> import torch
    >>> from toycomp.prims.decompositions import decompose
    >>> aten, a = torch.ops.aten, torch.randn(3, 4)
    >>> gm = torch.fx.symbolic_trace(lambda a: aten.t.default(a))
    >>> lower(decompose(gm, [a]), [a])
    input a[3, 4] torch.float32
    return TensorArg(buffer='a', size=(4, 3), stride=(1, 4), offset=0)
    >>> gm = torch.fx.symbolic_trace(lambda a: aten.exp.default(aten.t.default(a)))
    >>> lower(decompose(gm, [a]), [a])
    input a[3, 4] torch.float32
    buf0[4, 3] = exp(load(a, i0 + 4*i1))
    return TensorArg(buffer='buf0', size=(4, 3), stride=(3, 1), offset=0)

This module is the machinery: ``GraphLowering`` (the FX interpreter that runs the rules,
realizes buffers and turns ATen ops into ``ExternKernel`` calls into eager PyTorch) and ``lower``.
The rules themselves, one per prim, live in ``lowering_rules.py`` (views rewrite the index of
every load and never copy; ``full`` becomes a ``Constant``; reductions become ``Reduction``
buffers) and fill the ``LOWERINGS`` table of ``lowering_table.py``; ``TensorValue`` and the view
index maps live in ``tensor_value.py``; each node's meta value and the dtypes the loop IR
supports, in ``lowering_meta.py``.

NB: in PyTorch this lives in torch/_inductor/lowering.py (the ``lowerings`` table,
``make_pointwise``, ``make_reduction``), torch/_inductor/graph.py (``GraphLowering``, the FX
interpreter that runs the rules) and torch/_inductor/ir.py (``TensorBox``/``StorageBox.realize``).
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any

import torch
from torch.fx.node import Node

import toycomp.config as config
import toycomp.prims as prims
from toycomp._torch_compat import OpOverload
from toycomp.inductor import indexing, ir, lowering_indexing, lowering_rules  # noqa: F401 (rules)
from toycomp.inductor.lowering_meta import (  # noqa: F401  (re-exported: SUPPORTED_DTYPES)
    SUPPORTED_DTYPES,
    _dtypes_supported,
    _graph_device,
    _map_nodes,
    _meta_value,
    eager_layout_arg,
)
from toycomp.inductor.lowering_table import LOWERINGS, LoweringError
from toycomp.inductor.opt import layout_optimization
from toycomp.inductor.sizevars import SizeVars, is_symbolic
from toycomp.inductor.tensor_value import (
    TensorMeta,
    TensorValue,
    as_strided_view,
    strided_load,
    tree_size,
)
from toycomp.prims.decomp_table import EXTERN_OPS
from toycomp.tensor_utils import to_meta

# [Note: when to realize]
# A TensorValue is inlined into every user (its body is copied into theirs, like Inductor's
# pointwise inlining), and becomes a buffer ("realized", a Pointwise node) only when:
#   1. it is a graph output, or an argument of an extern kernel (eager PyTorch needs memory);
#      if the value is already a strided view of a buffer (its body is one load at an affine
#      index), we hand out a TensorArg of that buffer instead: a transpose is not copied;
#   2. it has 2+ FX users and its body has more than REALIZE_THRESHOLD expression nodes, so
#      each kernel that inlines it would recompute a lot (its users share one expression
#      object: see [Note: expressions are DAGs] in loop_body.py). Small shared values (sin(x)
#      in sin(x)*cos(x)*sin(x)) are recomputed: the fused kernel's CSE computes them once anyway.
#      Likewise when its body reads more than REALIZE_READS_THRESHOLD buffers: a residual
#      stream x = x + f(x), inlined layer after layer, would make the last layer's kernels
#      read every earlier layer's output; stored once, each user reads one buffer;
#   3. reductions are always buffers; their users read them with a Load (contiguous layout).
# Inductor's rule is similar (realize_opcount_threshold=30, realize_reads_threshold=4); the
# scheduler then fuses realized buffers back into kernels where the indices allow it.
#
# [Note: realizing a view realizes its base]
# A view is a new FX node whose value is its base's body read through an index map. When an
# extern needs the view in memory (``bmm(reshape(softmax(x)))``) and the base has other users
# (the softmax is also saved for the backward), storing the view's copy and later the base's
# own would write the same values twice. So realizing a view first realizes its base, as
# Inductor's views share their base's storage (ReinterpretView), and the view is lowered again
# on top of that buffer: usually a strided view of it, at no cost.
REALIZE_THRESHOLD = 30
REALIZE_READS_THRESHOLD = 4


def lower(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> ir.LoweredGraph:
    """Lower a prims graph (prims and ATen ops) to the loop IR, for ``example_inputs``' strides."""
    return GraphLowering(gm, example_inputs).run()


class GraphLowering:
    """Walks the FX graph once, keeping ``env[node] = TensorValue`` (or a Python value)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        self.gm = gm
        self.example_inputs = list(example_inputs)
        self.args_iter = iter(self.example_inputs)  # one per placeholder, as in fx.Interpreter
        self.env: dict[Node, Any] = {}
        self.meta: dict[Node, Any] = {}  # node -> meta tensor (size, dtype, stride) or value
        self.inputs: list[ir.InputBuffer] = []
        self.constants: list[ir.ConstantBuffer] = []
        self.nodes: list[ir.Pointwise | ir.Reduction | ir.ExternKernel] = []
        self.outputs: tuple[ir.TensorArg | None, ...] = ()
        self.output_strides: tuple[tuple[int, ...] | None, ...] = ()
        self.current_origin = ""
        self.device = _graph_device(gm, self.example_inputs)
        self.sizevars = SizeVars(self.example_inputs)  # SymInts -> s0, s1... (dynamic shapes)
        self.view_base: dict[Node, Node] = {}  # a view prim's node -> the node it views

    def run(self) -> ir.LoweredGraph:
        n_placeholders = sum(node.op == "placeholder" for node in self.gm.graph.nodes)
        if n_placeholders != len(self.example_inputs):
            raise LoweringError(f"{n_placeholders} placeholders, {len(self.example_inputs)} inputs")
        for node in self.gm.graph.nodes:
            if node.op not in ("placeholder", "get_attr", "call_function", "output"):
                raise LoweringError(f"toycomp cannot lower {node.op} node {node.name!r}")
            getattr(self, node.op)(node)  # self.placeholder(node), ...
        scalars = tuple(ir.SizeScalar(f, e) for e, f in self.sizevars.scalars.items())
        return ir.LoweredGraph(
            tuple(self.inputs), tuple(self.nodes), self.outputs, self.device,
            tuple(self.constants), self.output_strides, scalars,
        )  # fmt: skip

    def placeholder(self, node: Node) -> None:
        tensor = next(self.args_iter)
        if not isinstance(tensor, torch.Tensor):  # a size (s0) or a float
            return self.size_input(node, tensor)
        size, stride = self.sizevars.shape(tensor), self.sizevars.stride(tensor)
        buffer = ir.InputBuffer(node.name, size, stride, tensor.dtype)
        if tensor.device != self.device or tensor.dim() == 0:  # maybe an extern's seed
            buffer = _extern_seed(buffer, node, tensor, self.device)
        self.inputs.append(buffer)
        self.meta[node] = to_meta(tensor)
        self.env[node] = strided_load(node.name, size, stride, tensor.dtype)

    def size_input(self, node: Node, size: int | float | torch.SymInt | torch.SymFloat) -> None:
        if not isinstance(size, (int, float, torch.SymInt, torch.SymFloat)):
            raise LoweringError(f"input {node.name!r} is a {type(size).__name__}, not a tensor")
        self.env[node] = self.meta[node] = self.sizevars.expr(size)  # s0 (or a float f0)
        self.inputs.append(ir.SizeInput(node.name, self.env[node]))

    # [Note: extern seeds]
    # On CUDA, memory-efficient attention returns its RNG seed and offset, which its backward
    # takes, as 0-d CPU tensors, but its fake (meta) implementation says they live on the GPU:
    # a backward compiled from fake inputs would expect them there and reject the real ones.
    # Any op may do the same (a custom op's scalar on another device). No kernel of ours reads
    # such a value, only extern ops (ATen or custom), which take it where the forward made it;
    # so a 0-d input that only externs read is checked for its shape and dtype, on any device.

    # [Note: graph constants]
    # AOT puts tensors made from Python data (``torch.tensor([1., 2.])`` in the traced code)
    # into the graph as ``get_attr`` nodes. They are read-only inputs whose value is known at
    # compile time: a ConstantBuffer that kernels load from and extern calls receive like any
    # buffer; the wrapper binds the tensor (moved to the graph's device) in its namespace.
    def get_attr(self, node: Node) -> None:
        value = getattr(self.gm, str(node.target), None)
        if not isinstance(value, torch.Tensor):
            raise LoweringError(f"get_attr node {node.name!r} is a {type(value).__name__}")
        value = value.detach().to(self.device)
        size, stride = tuple(value.shape), tuple(value.stride())
        self.constants.append(ir.ConstantBuffer(node.name, size, stride, value.dtype, value))
        self.meta[node] = to_meta(value)
        self.env[node] = strided_load(node.name, size, stride, value.dtype)

    def call_function(self, node: Node) -> None:
        self.meta[node] = _meta_value(node, self.meta)
        if prims.is_prim(node.target) and isinstance(self.meta[node], torch.Tensor):
            self.prim(node)
        else:  # sizes, ATen ops run by eager PyTorch, getitem of their tuple results
            self.call_size_or_extern(node)

    def call_size_or_extern(self, node: Node) -> None:
        if is_symbolic(self.meta[node]) or isinstance(self.meta[node], int):
            self.env[node] = self.sizevars.expr(self.meta[node])  # sym_size(x, 0) * 4: 4*s0
        elif node.target is operator.getitem:  # one tensor of an extern call's tuple result
            self.getitem(node)
        elif isinstance(node.target, OpOverload):
            fallback = node.target not in EXTERN_OPS
            self.extern(node, _kernel_name(node), fallback)
        elif prims.is_prim(node.target):  # a prim with no tensor result: run eagerly
            self.extern(node, _kernel_name(node), fallback=True)
        else:
            raise LoweringError(f"toycomp cannot lower {node.name!r}: unknown target {node.target}")

    def getitem(self, node: Node) -> None:
        source, index = node.args
        if not isinstance(self.env.get(source), tuple):
            raise LoweringError(f"toycomp cannot lower {node.name!r}: getitem of {source}")
        self.env[node] = self.env[source][index]

    def prim(self, node: Node) -> None:
        rule = LOWERINGS.get(node.target)
        if rule is None or not _dtypes_supported(node, self.meta):
            return self.extern(node, _kernel_name(node), fallback=True)
        out = TensorMeta(self.sizevars.shape(self.meta[node]), self.meta[node].dtype)
        args, kwargs = _map_nodes((node.args, node.kwargs), self.env.__getitem__)
        self.current_origin = node.name  # where a buffer's work comes from
        try:
            value = rule(self, out, *args, **kwargs)
        except NotImplementedError:  # a rule may decline a case: run the prim eagerly instead
            return self.extern(node, _kernel_name(node), fallback=True)
        except Exception as e:
            raise LoweringError(f"lowering {node.name!r} ({_kernel_name(node)}) failed: {e}") from e
        if not self.sizevars.same_sizes(value.size, out.shape) or value.dtype != out.dtype:
            raise _meta_mismatch(node, value, out)  # a wrong rule: an error, not a wrong result
        origins = [o for n in node.all_input_nodes for o in getattr(self.env[n], "origins", ())]
        self.env[node] = replace(value, origins=tuple(dict.fromkeys([*origins, node.name])))
        if prims.PRIM_INFO[node.target].kind is prims.PrimKind.VIEW:  # see realize_base_of_view
            self.view_base[node] = node.args[0]
        if len(node.users) >= 2 and _costly_to_inline(value):
            self.realize(node)

    def extern(self, node: Node, kernel: str, fallback: bool) -> None:
        if config.layout_optimization and layout_optimization.applies(self, node):  # opt pass
            layout_optimization.use_channels_last(self, node)
        out = self.meta[node]
        if isinstance(out, (tuple, list)):
            return self.multi_output_extern(node, kernel, fallback, out)
        if not isinstance(out, torch.Tensor):
            raise LoweringError(f"extern {kernel} ({node.name!r}) returns a {type(out).__name__}")
        args, kwargs = _map_nodes((node.args, node.kwargs), self.fallback_arg(fallback))
        size, stride = self.sizevars.shape(out), self.sizevars.stride(out)
        name = self.new_name()
        self.nodes.append(
            ir.ExternKernel(
                name, kernel, args, tuple(kwargs.items()), size, stride, out.dtype, fallback,
                origins=(node.name,),
            )
        )  # fmt: skip
        self.env[node] = strided_load(name, size, stride, out.dtype)

    def multi_output_extern(self, node: Node, kernel: str, fallback: bool, out: Any) -> None:
        """An extern call returning a tuple: one ``MultiOutput`` buffer per tensor in it; the
        FX graph reads them through ``getitem`` nodes (env holds a tuple of TensorValues)."""
        # numbers among the results (flash attention's max_q): no buffer, their getitems are
        # sizes ([Note: results that are not tensors] in toycomp/aot/tensor_tracker.py)
        if not all(isinstance(t, (torch.Tensor, int)) or t is None or is_symbolic(t) for t in out):
            raise LoweringError(f"extern {kernel} ({node.name!r}) returns non-tensors: {out}")
        args, kwargs = _map_nodes((node.args, node.kwargs), self.fallback_arg(fallback))
        if not any(isinstance(t, torch.Tensor) for t in out):
            raise LoweringError(f"extern {kernel} ({node.name!r}) returns no tensor")
        name = self.new_name()
        outputs, values = [], []
        read = _indices_read(node)
        if not any(isinstance(out[k], torch.Tensor) for k in read):
            read = set()  # (none of the elements read is a tensor: keep them all, as before)
        for k, t in enumerate(out):
            if not isinstance(t, torch.Tensor) or (read and k not in read):  # nobody reads it
                values.append(None)
                continue
            size, stride = self.sizevars.shape(t), self.sizevars.stride(t)
            outputs.append(ir.MultiOutput(f"{name}_{k}", k, size, stride, t.dtype))
            values.append(strided_load(outputs[-1].name, size, stride, t.dtype))
        self.nodes.append(
            ir.ExternKernel(
                name, kernel, args, tuple(kwargs.items()), (), (), outputs[0].dtype, fallback,
                origins=(node.name,), outputs=tuple(outputs),
            )
        )  # fmt: skip
        self.env[node] = tuple(values)

    def output(self, node: Node) -> None:
        results = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
        if not all(r is None or isinstance(r, (Node, int)) for r in results):
            raise LoweringError(f"graph outputs {results} are not all tensors (or sizes)")
        vals = node.meta.get("val")
        vals = vals if isinstance(vals, (tuple, list)) else (vals,)
        if config.layout_optimization and layout_optimization.outputs_apply(self, results, vals):
            self.outputs = layout_optimization.outputs_in_eager_layout(self, results, vals)
        else:
            self.outputs = _map_nodes(results, self.extern_arg)  # an int: a size saved by AOT
        if len(vals) == len(self.outputs):
            self.output_strides = tuple(map(self.eager_stride, self.outputs, vals))

    def extern_arg(self, node: Node) -> ir.TensorArg | int | Any:
        """A tensor argument of an extern call (or a graph output) realized; a size as is."""
        value = self.env[node]
        return value if not isinstance(value, TensorValue) else self.realize(node)

    def fallback_arg(self, fallback: bool) -> Any:
        """``extern_arg``, with eager's strides for a fallback ([Note: fallbacks see eager's
        strides] in lowering_meta.py); matmul-like externs take any layout."""
        if not fallback:
            return self.extern_arg
        return lambda node: eager_layout_arg(self, node, self.extern_arg(node))

    def eager_stride(self, arg: Any, val: Any) -> tuple | None:
        """``val``'s (eager's) strides if ``arg``'s differ, else None: AOT expects eager's."""
        if not isinstance(arg, ir.TensorArg) or not isinstance(val, torch.Tensor):
            return None
        size, stride = self.sizevars.shape(val), self.sizevars.stride(val)
        if not self.sizevars.same_sizes(size, arg.size):
            return None
        steps = zip(size, arg.stride, stride)
        kept = [(a, b) for n, a, b in steps if not indexing.known_less(n, 2)]  # n >= 2 moves
        return None if all(indexing.known_equal(a, b) for a, b in kept) else stride

    def realize(self, node: Node, through_views: bool = True) -> ir.TensorArg:
        """Make ``node``'s value exist in memory and return how to read it (see the Notes)."""
        if through_views and node in self.view_base:  # a view: maybe realize its base first
            self.realize_base_of_view(node)
        value = self.env[node]
        view = as_strided_view(value)
        if view is not None:
            return view
        name = self.new_name()
        self.nodes.append(ir.Pointwise(name, value.size, value.dtype, value.body, value.origins))
        stride = indexing.contiguous_strides(value.size)
        self.env[node] = strided_load(name, value.size, stride, value.dtype)
        return ir.TensorArg(name, value.size, stride)

    def realize_base_of_view(self, node: Node) -> None:
        """Realize the nearest shared node that ``node`` views, then lower the views on it again."""
        if as_strided_view(self.env[node]) is not None:  # already in memory (or a view of it)
            return
        chain = [node]
        while chain[-1] in self.view_base and (chain[-1] is node or len(chain[-1].users) < 2):
            chain.append(self.view_base[chain[-1]])
        base = chain[-1]
        if base is node or len(base.users) < 2 or as_strided_view(self.env[base]) is not None:
            return
        self.realize(base, through_views=False)
        for view in reversed(chain[:-1]):
            self.prim(view)

    def make_reduction(self, size, reduction_size, reduction_type, dtype, body, origins):
        name = self.new_name()
        self.nodes.append(
            ir.Reduction(name, size, reduction_size, reduction_type, dtype, body, origins)
        )
        return strided_load(name, size, indexing.contiguous_strides(size), dtype)

    def new_name(self) -> str:
        return f"buf{len(self.nodes)}"


# --- helpers ---------------------------------------------------------------------------------
def _costly_to_inline(value: TensorValue) -> bool:
    """Would each user that inlines ``value`` recompute or re-read too much (see the Note)?"""
    if tree_size(value.body, REALIZE_THRESHOLD) > REALIZE_THRESHOLD:
        return True
    reads = {e.buffer for e in ir.walk(value.body) if isinstance(e, ir.Load)}
    return len(reads) > REALIZE_READS_THRESHOLD


def _extern_seed(buffer: ir.InputBuffer, node: Node, tensor, device) -> ir.InputBuffer:
    """An input on another device, or a 0-d one only externs read ([Note: extern seeds])."""
    elsewhere = tensor.device if tensor.device != device else None  # an extern's cpu seed
    any_device = tensor.dim() == 0 and bool(node.users) and all(
        u.op == "call_function" and isinstance(u.target, OpOverload) for u in node.users
    )
    return replace(buffer, device=elsewhere, any_device=any_device)


def _meta_mismatch(node: Node, value: TensorValue, out: TensorMeta) -> LoweringError:
    return LoweringError(
        f"lowering {node.name!r} gave {list(value.size)} {value.dtype}, "
        f"eager gives {list(out.shape)} {out.dtype}"
    )


def _kernel_name(node: Node) -> str:
    if prims.is_prim(node.target):
        return f"toycomp.prims.{prims.PRIM_INFO[node.target].name}"
    return str(node.target)  # "aten.mm.default"


def _indices_read(node: Node) -> set[int]:
    """The tuple elements of ``node`` that its users read through ``getitem``; empty when a user
    takes the tuple whole. An element nobody reads gets no buffer: a fallback's unused outputs
    may have sizes its meta kernel cannot know (embedding_bag's ``offset2bag``: 0 on meta)."""
    if not node.users or any(u.target is not operator.getitem for u in node.users):
        return set()
    return {u.args[1] for u in node.users}
