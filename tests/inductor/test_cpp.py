"""C++ kernels compute a value with the same bits wherever they compute it (issue 6, item 1).

See [Note: vectorised libm] and [Note: one rounding per op] in toycomp/inductor/codegen/cpp.py:
the backward of ``amax`` compares the forward's maximum with the values again, so a value
computed in two kernels (or in a vector body and a scalar tail) must come out bit for bit the
same. Eager PyTorch is the oracle for values and gradients.
"""

from __future__ import annotations

import pytest
import torch

import toycomp
from toycomp.inductor import indexing, wrapper
from toycomp.inductor.indexing import r, x
from toycomp.inductor.ir import (
    AllocatedBuffer,
    Constant,
    InputBuffer,
    Kernel,
    Load,
    Local,
    Loop,
    Op,
    Reduce,
    ReductionType,
    ScheduledGraph,
    Store,
    TensorArg,
)

F32 = torch.float32


def compile_cpp(kernels, inputs: dict, outputs: dict, dtype=F32) -> wrapper.CompiledGraph:
    """C++ kernels as a graph of contiguous inputs (shaped as ``inputs``) and outputs."""
    contiguous = lambda size: indexing.contiguous_strides(tuple(size))  # noqa: E731
    graph = ScheduledGraph(
        inputs=tuple(
            InputBuffer(n, tuple(t.shape), t.stride(), t.dtype) for n, t in inputs.items()
        ),
        allocations=tuple(AllocatedBuffer(n, s, contiguous(s), dtype) for n, s in outputs.items()),
        steps=tuple(kernels),
        outputs=tuple(TensorArg(n, s, contiguous(s)) for n, s in outputs.items()),
        device=torch.device("cpu"),
    )
    return wrapper.compile_graph(graph, "cpp")


def run_cpp(kernels, inputs: dict, outputs: dict) -> list[torch.Tensor]:
    """Run C++ kernels on contiguous inputs; return the whole output buffers."""
    return compile_cpp(kernels, inputs, outputs)(list(inputs.values()))


def values(n: int) -> torch.Tensor:
    """NaN, infinities, signed zeros, a denormal, huge arguments, then random values of all
    magnitudes (negative ones give log and pow a NaN: NaN has bits too)."""
    special = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, 88.0, 89.0, -104.0,
               1e4, 1e6, 1e20, 0.5, -0.5, 2.0, 1e-7]  # fmt: skip
    torch.manual_seed(0)
    rest = torch.randn(n - len(special)) * torch.logspace(-3, 3, n - len(special))
    return torch.cat([torch.tensor(special), rest])


def op_expr(name: str, a):
    if name == "pow":
        return Op("pow", (a, Constant(1.7, F32)), F32)
    return Op(name, (a,), F32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("name", ["exp", "sin", "cos", "log", "log1p", "tanh", "erf", "pow"])
def test_libm_value_has_the_same_bits_in_every_loop(name):
    """op(a) computed by a vectorised x loop (its body and tail), by an r loop of one row, by a
    short loop that is all tail, and as the maximum of a strided reduction: the same bits."""
    n = 1003  # no multiple of a vector width: a tail
    a = values(n)
    cols = 17
    rows = n // cols  # a (rows, cols) view of the first rows * cols values
    at_x, at_r = Load("arg0", x, F32), Load("arg0", r, F32)
    pointwise = Kernel("kernel_0", n, 1, (Loop(False, (Store("buf0", x, op_expr(name, at_x)),)),),
                       (("arg0", F32), ("buf0", F32)), (name,))  # fmt: skip
    one_row = Kernel("kernel_1", 1, n, (Loop(True, (Store("buf1", r, op_expr(name, at_r)),)),),
                     (("arg0", F32), ("buf1", F32)), (name,))  # fmt: skip
    short = [
        Kernel(f"kernel_{2 + k}", 5, 1, (Loop(False, (Store(f"short{k}", x, op_expr(name,
               Load("arg0", x + 5 * k, F32))),)),), (("arg0", F32), (f"short{k}", F32)), (name,))
        for k in range(3)
    ]  # fmt: skip
    # amax over dim 0 of the (rows, cols) view: a strided r loop per column
    column = Load("arg0", x + cols * r, F32)
    reduce = Reduce("amax_col", ReductionType.MAX, op_expr(name, column), F32)
    loops = (Loop(True, (reduce,)), Loop(False, (Store("colmax", x, Local("amax_col", F32)),)))
    strided = Kernel("kernel_9", cols, rows, loops, (("arg0", F32), ("colmax", F32)), (name,))
    outputs = {"buf0": (n,), "buf1": (n,), **{f"short{k}": (5,) for k in range(3)}}
    outputs["colmax"] = (cols,)
    kernels = [pointwise, one_row, *short, strided]
    ref, in_r_loop, *shorts, colmax = run_cpp(kernels, {"arg0": a}, outputs)
    assert same_bits(in_r_loop, ref)
    assert same_bits(torch.cat(shorts), ref[:15])
    grid = ref[: rows * cols].view(rows, cols)
    # the reduction's maximum is one of the stored values (NaN rows aside)
    finite = ~grid.isnan().any(0)
    assert same_bits(colmax[finite], grid.amax(0)[finite])


def test_multiply_add_rounds_twice_in_every_kernel():
    """``a * b + c`` alone (a fused multiply-add, if the compiler may) and with ``a * b`` also
    stored (no fusion possible): both the bits of eager's two roundings."""
    torch.manual_seed(0)
    a, b, c = torch.randn(3, 1003).unbind()
    la, lb, lc = (Load(f"arg{k}", x, F32) for k in range(3))
    prod = Op("mul", (la, lb), F32)
    fma = Op("add", (prod, lc), F32)
    dtypes = (("arg0", F32), ("arg1", F32), ("arg2", F32))
    alone = Kernel("kernel_0", 1003, 1, (Loop(False, (Store("buf0", x, fma),)),),
                   (*dtypes, ("buf0", F32)), ("mul", "add"))  # fmt: skip
    stores = (Store("buf1", x, fma), Store("buf2", x, prod))
    shared = Kernel("kernel_1", 1003, 1, (Loop(False, stores),),
                    (*dtypes, ("buf1", F32), ("buf2", F32)), ("mul", "add"))  # fmt: skip
    outputs = {"buf0": (1003,), "buf1": (1003,), "buf2": (1003,)}
    out_alone, out_shared, _ = run_cpp([alone, shared], {"arg0": a, "arg1": b, "arg2": c}, outputs)
    assert same_bits(out_alone, a * b + c)
    assert same_bits(out_shared, a * b + c)


CASES = {
    "exp.amax": lambda t: torch.exp(t).amax(0),
    "sin.amax": lambda t: torch.sin(t).amax(0),
    "tanh.amax(1)": lambda t: torch.tanh(t).amax(1),
    "log.amax": lambda t: torch.log(t.abs() + 1).amax(0),
    "pow.amax": lambda t: torch.pow(t.abs() + 0.1, 1.5).amax(0),
    "exp.amin": lambda t: torch.exp(t).amin(0),
    # the backward recomputes exp (min-cut) and compares it with the saved maximum
    "exp.amax+sin": lambda t: torch.exp(t).amax(0).sum() + t.sin().sum(),
    "fma.amax": lambda t: (t * t.flip(0) + t).amax(0) * (t * t.flip(0)).amax(1).sum(),
}


def check_values_and_grads(fn, shape, backend):
    torch.manual_seed(sum(shape))
    for _ in range(3):
        a = torch.randn(*shape, requires_grad=True)
        out = toycomp.compile(fn, backend=backend)(a)
        (grad,) = torch.autograd.grad(out.sum(), a)
        want = fn(a)
        (want_grad,) = torch.autograd.grad(want.sum(), a)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-5)


SHAPES = [(8, 4), (16, 4), (4, 8), (33, 7)]


@pytest.mark.parametrize(
    "case,shape", [("exp.amax", s) for s in SHAPES] + [(c, (33, 7)) for c in list(CASES)[1:]]
)
def test_amax_gradient_over_transcendentals_cpp(case, shape):
    check_values_and_grads(CASES[case], shape, "cpp")


@pytest.mark.parametrize("case", ["exp.amax", "exp.amin", "exp.amax+sin", "fma.amax"])
def test_amax_gradient_over_transcendentals_triton(case):
    check_values_and_grads(CASES[case], (16, 4), "triton")


# --- [Note: pointwise kernels over planes] ------------------------------------------------------
def _pointwise_kernel(fn, *args):
    from toycomp.inductor.codegen import cpp

    steps = toycomp.explain(fn, *args).graph("forward").scheduled.steps
    return [cpp.generate(k).source.removeprefix(cpp.PREAMBLE) for k in steps
            if isinstance(k, Kernel)]  # fmt: skip


def test_a_per_channel_broadcast_runs_over_planes():
    def bn_relu6(x, mean, var, w, b):
        return torch.nn.functional.batch_norm(x, mean, var, w, b, False).clamp(0, 6)

    x, stats = torch.randn(2, 8, 6, 6), [torch.rand(8) + 0.5 for _ in range(4)]
    (source,) = _pointwise_kernel(bn_relu6, x, *stats)
    assert "for (int64_t x1 = 0; x1 < 36; x1++)" in source and "xindex" not in source
    assert "in_ptr1[x0 - 8*((x0) / (8))]" in source  # per channel: no x1, hoistable
    torch.testing.assert_close(toycomp.compile(bn_relu6)(x, *stats), bn_relu6(x, *stats))


def test_a_kernel_without_a_common_plane_keeps_one_flat_loop():
    def f(a, b):  # reads b at x // 4 - 12*(x // 48): planes of 4, less than a vector
        return a * b

    (source,) = _pointwise_kernel(f, torch.randn(4, 12, 4), torch.randn(12, 1))
    assert "xindex" in source and "x1" not in source

    def g(a, b, c):  # x // 8 (b per row) and x // 12 (c's rows of 12): a plane of 4 at most
        return a + b + c.expand(8, 12).reshape(12, 8)

    args = torch.randn(12, 8), torch.randn(12, 1), torch.randn(1, 12)
    (source,) = _pointwise_kernel(g, *args)
    assert "xindex" in source and "x1" not in source
    torch.testing.assert_close(toycomp.compile(g)(*args), g(*args))


@pytest.mark.parametrize("shape, dims", [
    ((3, 16, 10), (1,)), ((3, 16, 10), (0, 2)), ((2, 3, 8, 9), (1, 3)), ((5, 64), (0,)),
    ((4, 1, 32), (2,)), ((2, 16, 3, 16), (0, 2)),
])  # fmt: skip
def test_broadcasts_over_planes_match_eager(shape, dims):
    """A tensor plus one broadcast along ``dims``, times a third that is transposed."""
    small = [1 if d in dims else n for d, n in enumerate(shape)]

    def f(a, b, c):
        return (a + b).relu() * c.transpose(0, -1).contiguous().transpose(0, -1)

    a, b, c = torch.randn(shape), torch.randn(small), torch.randn(shape)
    torch.testing.assert_close(toycomp.compile(f)(a, b, c), f(a, b, c))


@pytest.mark.parametrize("plane, numel", [(12, 96), (16, 256), (36, 288)])
def test_plane_index_is_the_same_element(plane, numel):
    from toycomp.inductor.opt.cpp_layout import plane_index

    FloorDiv = indexing.FloorDiv
    index = 3 * x + FloorDiv(x, plane) - 2 * FloorDiv(x, 2 * plane) + 7 * FloorDiv(x, numel // 2)
    split = plane_index(index, plane)
    x0, x1 = sorted(split.free_symbols, key=str)
    for value in range(numel):
        got = split.subs({x0: value // plane, x1: value % plane})
        assert got == index.subs(x, value), value


# --- the core kernel and the passes' subclass ---------------------------------------------------
# each C++ flag's value when on, and a case whose code it changes
PASS_FLAGS = {"cpp.simdlen": (None, "softmax"), "cpp.layouts": (True, "sum0"),
              "cpp.row_buffers": (True, "softmax")}  # fmt: skip
PASS_CASES = {  # a pointwise kernel, row and column reductions, bf16, a scatter-add, amax
    "sin2cos2": (lambda a: torch.sin(a) ** 2 + torch.cos(a) ** 2, (1000,)),
    "softmax": (lambda a: a.softmax(-1), (64, 100)),
    "sum0": (lambda a: a.sum(0) * 2, (64, 48)),
    "bf16": (lambda a: a.to(torch.bfloat16).exp().sum(-1), (16, 33)),
    "scatter_add": (lambda a: a.scatter_add(0, torch.tensor([0, 2, 2, 5]), a[:4].exp()), (8,)),
    "amax": (lambda a: a.exp().amax(-1) - a.amin(-1), (16, 40)),
}


def _scheduled_kernels(fn, shape) -> list[Kernel]:
    a = torch.randn(shape, requires_grad=True)
    explanation = toycomp.explain(fn, a, backend="cpp")
    graphs = [explanation.graph(g) for g in ("forward", "backward")]
    return [k for g in graphs if g is not None for k in g.scheduled.steps if isinstance(k, Kernel)]


@pytest.mark.parametrize("case", list(PASS_CASES))
def test_the_passes_subclass_writes_the_core_kernel_with_its_passes_off(case):
    """opt/libmvec.py's CppVecKernelCodegen only adds what its flags switch on: with all of them
    off it writes the core's source, byte for byte (so the teach preset's kernel is the one the
    core shows, and a hook that does something with its pass off is caught)."""
    from toycomp.inductor.codegen import cpp
    from toycomp.inductor.opt import libmvec

    kernels = _scheduled_kernels(*PASS_CASES[case])
    assert kernels
    with toycomp.config.patch(**toycomp.config.teach):
        for k in kernels:
            core = cpp.CppKernelCodegen(k).codegen_kernel()
            assert libmvec.CppVecKernelCodegen(k).codegen_kernel() == core
            assert cpp.generate(k).source == core


@pytest.mark.parametrize("flag", list(PASS_FLAGS))
def test_each_cpp_pass_alone_takes_the_subclass_and_matches_eager(flag):
    """One C++ flag on, the others off: cpp.generate uses the subclass, and values and gradients
    are eager's."""
    from toycomp.inductor.codegen import cpp

    value, changed = PASS_FLAGS[flag]
    options = {**toycomp.config.teach, flag: value}
    with toycomp.config.patch(**options):
        kernels = _scheduled_kernels(*PASS_CASES[changed])
        core = [cpp.CppKernelCodegen(k).codegen_kernel() for k in kernels]
        assert [cpp.generate(k).source for k in kernels] != core
    for case in ("softmax", "sum0", "sin2cos2"):
        fn, shape = PASS_CASES[case]
        a = torch.randn(shape, requires_grad=True)
        compiled = toycomp.compile(fn, backend="cpp", options=options)
        out = compiled(a)
        (grad,) = torch.autograd.grad(out.sum(), a)
        want = fn(a)
        (want_grad,) = torch.autograd.grad(want.sum(), a)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-5)
