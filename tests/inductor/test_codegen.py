"""Code generation (C++ and Triton), compilation cache and wrapper, on hand-built loop IR.

Eager PyTorch is the oracle. Triton runs on CPU through its interpreter (no TRITON_INTERPRET
needed); the CUDA tests run only where a GPU is present.
"""

from __future__ import annotations

import os
import re
import warnings

import pytest
import sympy
import torch

import toycomp
import toycomp.prims as prims
from toycomp.inductor import cache, indexing, wrapper
from toycomp.inductor.codegen import common as codegen, cpp, triton, triton_heuristics
from toycomp.inductor.opt import libmvec
from toycomp.inductor.ir import (
    AllocatedBuffer,
    Constant,
    ExternKernel,
    IndexValue,
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
from toycomp.inductor.indexing import r, x
from toycomp.inductor.codegen.triton_helpers import TRITON_OPS

F32, I64, BOOL = torch.float32, torch.int64, torch.bool
BACKENDS = ["cpp", "triton"]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def contiguous(size):
    return indexing.contiguous_strides(tuple(size))


def run(kernels, inputs: dict, outputs: dict, backend: str, device="cpu", steps=None):
    """Wrap kernels in a ScheduledGraph (inputs contiguous, outputs = whole buffers) and run it."""
    graph = ScheduledGraph(
        inputs=tuple(
            InputBuffer(n, tuple(t.shape), t.stride(), t.dtype) for n, t in inputs.items()
        ),
        allocations=tuple(
            AllocatedBuffer(n, size, contiguous(size), dt) for n, (size, dt) in outputs.items()
        ),
        steps=tuple(steps or kernels),
        outputs=tuple(TensorArg(n, size, contiguous(size)) for n, (size, _) in outputs.items()),
        device=torch.device(device),
    )
    compiled = wrapper.compile_graph(graph, backend)
    return compiled, compiled([t.to(device) for t in inputs.values()])


def check(actual, expected):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), equal_nan=True, rtol=1e-4, atol=1e-5)


# --- kernels --------------------------------------------------------------------------------------
def sincos_kernel(n: int) -> Kernel:
    a = Load("arg0", x, F32)
    sq = lambda v: Op("pow", (v, Constant(2.0, F32)), F32)  # noqa: E731
    body = Op("add", (sq(Op("sin", (a,), F32)), sq(Op("cos", (a,), F32))), F32)
    dtypes = (("arg0", F32), ("buf0", F32))
    return Kernel("kernel_0", n, 1, (Loop(False, (Store("buf0", x, body),)),), dtypes, ("sin",))


def softmax_kernel(rows: int, cols: int) -> Kernel:
    a = Load("arg0", r + cols * x, F32)
    e = Op("exp", (Op("sub", (a, Local("amax", F32)), F32),), F32)
    loops = (
        Loop(True, (Reduce("amax", ReductionType.MAX, a, F32),)),
        Loop(True, (Reduce("sum_1", ReductionType.SUM, e, F32),)),
        Loop(True, (Store("buf2", r + cols * x, Op("div", (e, Local("sum_1", F32)), F32)),)),
    )
    dtypes = (("arg0", F32), ("buf2", F32))
    return Kernel("kernel_1", rows, cols, loops, dtypes, ("amax", "sub", "exp", "sum", "div"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_sin_cos_pointwise(backend):
    a = torch.randn(1000)
    compiled, (out,) = run([sincos_kernel(1000)], {"arg0": a}, {"buf0": ((1000,), F32)}, backend)
    check(out, a.sin() ** 2 + a.cos() ** 2)
    assert "kernel_0" in compiled.kernels[0].source and "sin" in compiled.kernels[0].source
    assert "def call(args)" in compiled.wrapper_source


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,cols", [(8, 1000), (3, 5000)])
def test_softmax(backend, rows, cols):
    a = torch.randn(rows, cols)
    a[1, 7] = float("nan")  # a NaN row stays NaN (amax propagates it)
    outputs = {"buf2": ((rows, cols), F32)}
    compiled, (out,) = run([softmax_kernel(rows, cols)], {"arg0": a}, outputs, backend)
    check(out, torch.softmax(a, 1))
    src = compiled.kernels[0].source
    if backend == "triton":
        assert ("for roffset in range" in src) == (cols > triton.PERSISTENT_MAX_RNUMEL)


def test_eviction_hints_of_reduction_loads():
    """[Note: eviction policy]: a looped reduction's load along r that no later loop repeats is
    evicted first; on CUDA past the L2 cache, a persistent reduction's row and a pointwise
    kernel's loads are evicted last; a weight keeps the default."""
    def loads(kernel, cuda=False):
        return [line.strip() for line in triton.generate(kernel, cuda=cuda).source.splitlines()
                if "tl.load(" in line]  # fmt: skip

    def cuda_loads(kernel):
        return loads(kernel, cuda=True)

    row_sum = Kernel("kernel_0", 8, 5000, (Loop(True, (Reduce("sum_0", ReductionType.SUM,
                     Load("arg0", r + 5000 * x, F32), F32),)),), (("arg0", F32),), ("sum",))
    (load,) = loads(row_sum)
    assert "eviction_policy='evict_first'" in load, load
    # a looped softmax reads its row in each of its three loops: only the last read streams
    first, second, last = loads(softmax_kernel(3, 5000))
    assert "evict" not in first and "evict" not in second, (first, second)
    assert "eviction_policy='evict_first'" in last, last
    # one pass over more floats than the L2 holds, on CUDA: evict_last; smaller, or on the
    # interpreter: no hint
    big, small = 1 << 24, 1 << 20  # floats: 64 MB and 4 MB, against the H100's 50 MB of L2
    assert 4 * small < triton_heuristics.L2_BYTES < 4 * big
    for kernel, past in ((sincos_kernel(big), True), (sincos_kernel(small), False),
                         (softmax_kernel(big // 4096, 4096), True),
                         (softmax_kernel(small // 4096, 4096), False)):  # fmt: skip
        assert not any("evict" in line for line in loads(kernel))
        on_cuda = cuda_loads(kernel)
        assert on_cuda and all(("eviction_policy='evict_last'" in line) == past
                               for line in on_cuda), on_cuda  # fmt: skip
    long_dot = Kernel("kernel_3", 4096, 4096, (Loop(True, (Reduce("sum_0", ReductionType.SUM,
                      Op("mul", (Load("arg0", r + 4096 * x, F32), Load("arg1", r, F32)), F32),
                      F32),)),), (("arg0", F32), ("arg1", F32)), ("mul", "sum"))  # fmt: skip
    rows, weight = cuda_loads(long_dot)  # a persistent row: the weight keeps the default
    assert "evict_last" in rows and "evict" not in weight, (rows, weight)
    # a weight read by every row (its index has no x) is kept, its rows streamed
    scaled = Op("mul", (Load("arg0", r + 5000 * x, F32), Load("arg1", r, F32)), F32)
    row_dot = Kernel("kernel_2", 8, 5000, (Loop(True, (Reduce("sum_0", ReductionType.SUM,
                     scaled, F32),)),), (("arg0", F32), ("arg1", F32)), ("mul", "sum"))
    rows, weight = loads(row_dot)
    assert "evict_first" in rows and "evict" not in weight, (rows, weight)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", [ReductionType.SUM, ReductionType.MAX])
def test_reduce_to_scalar(backend, kind):
    n = 100_000
    a = torch.rand(n)
    red = Reduce("acc", kind, Load("arg0", r, F32), F32)
    loops = (Loop(True, (red,)), Loop(False, (Store("buf0", sympy.Integer(0), Local("acc", F32)),)))
    k = Kernel("kernel_0", 1, n, loops, (("arg0", F32), ("buf0", F32)), ("sum",))
    compiled, (out,) = run([k], {"arg0": a}, {"buf0": ((), F32)}, backend)
    check(out, a.sum() if kind == ReductionType.SUM else a.amax())
    if backend == "cpp":  # one row: the reduction itself runs in parallel (a float sum over
        # blocks of 1024, each block vectorised: see cpp_reduction.py's cascade)
        assert re.search(r"#pragma omp parallel for (simd )?reduction\(", compiled.kernels[0].source)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_and_bool(backend):
    n, c = 6, 5  # one_hot-like: out[i, j] = where(j == labels[i], 2.5, -1.0), and the mask
    i, j = indexing.FloorDiv(x, c), indexing.modular(x, c)
    hit = Op("eq", (IndexValue(j, I64), Load("labels", i, I64)), BOOL)
    body = Op("where", (hit, Constant(2.5, F32), Constant(-1.0, F32)), F32)
    count = Op("add", (Load("labels", i, I64), Constant(1, I64)), I64)
    stores = (Store("buf0", x, body), Store("buf1", x, hit), Store("buf2", x, count))
    dtypes = (("labels", I64), ("buf0", F32), ("buf1", BOOL), ("buf2", I64))
    k = Kernel("kernel_0", n * c, 1, (Loop(False, stores),), dtypes, ("eq", "where"))
    labels = torch.tensor([0, 4, 2, 2, 1, 3])
    outs = {"buf0": ((n, c), F32), "buf1": ((n, c), BOOL), "buf2": ((n, c), I64)}
    _, (vals, mask, counts) = run([k], {"labels": labels}, outs, backend)
    expected_mask = torch.arange(c)[None, :] == labels[:, None]
    assert torch.equal(mask, expected_mask)
    check(vals, torch.where(expected_mask, 2.5, -1.0))
    assert torch.equal(counts, (labels[:, None] + 1).expand(n, c))


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_load(backend):
    m, n = 7, 9  # out (n, m) = 2 * in.T, in (m, n) contiguous
    i, j = indexing.FloorDiv(x, m), indexing.modular(x, m)
    body = Op("mul", (Load("arg0", j * n + i, F32), Constant(2.0, F32)), F32)
    k = Kernel("kernel_0", m * n, 1, (Loop(False, (Store("buf0", x, body),)),),
               (("arg0", F32), ("buf0", F32)), ("permute", "mul"))  # fmt: skip
    a = torch.randn(m, n)
    _, (out,) = run([k], {"arg0": a}, {"buf0": ((n, m), F32)}, backend)
    check(out, 2 * a.T)


def mm_graph(device="cpu") -> ScheduledGraph:
    """buf0 = a @ b.T (b given as (4, 16), passed transposed); buf1 = relu(buf0) by a kernel."""
    mm = ExternKernel(
        "buf0", "aten.mm.default",
        (TensorArg("a", (8, 16), (16, 1)), TensorArg("b", (16, 4), (1, 16))), (),
        (8, 4), (4, 1), F32, fallback=False, origins=("mm",),
    )  # fmt: skip
    relu = Op("maximum", (Load("buf0", x, F32), Constant(0.0, F32)), F32)
    k = Kernel("kernel_0", 32, 1, (Loop(False, (Store("buf1", x, relu),)),),
               (("buf0", F32), ("buf1", F32)), ("relu",))  # fmt: skip
    return ScheduledGraph(
        inputs=(InputBuffer("a", (8, 16), (16, 1), F32), InputBuffer("b", (4, 16), (16, 1), F32)),
        allocations=(AllocatedBuffer("buf1", (8, 4), (4, 1), F32),),
        steps=(mm, k),
        outputs=(TensorArg("buf1", (8, 4), (4, 1)), TensorArg("buf0", (4, 8), (1, 4)), None),
        device=torch.device(device),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_extern_mm_in_graph(backend):
    a, b = torch.randn(8, 16), torch.randn(4, 16)
    compiled = wrapper.compile_graph(mm_graph(), backend)
    relu, mm_t, none = compiled([a, b])
    check(relu, torch.relu(a @ b.T))
    check(mm_t, (a @ b.T).T)
    assert none is None
    assert "aten.mm.out(" in compiled.wrapper_source  # into its planned buffer
    assert "reinterpret_tensor(buf0, (4, 8), (1, 4), 0)" in compiled.wrapper_source
    assert "aten.mm.default" in repr(compiled)
    with pytest.raises(ValueError, match="input a: compiled for"):
        compiled([a.T.contiguous().T, b])  # same values, other strides


# --- every op of the rule tables against its prim's eager reference ------------------------
def test_rule_tables_cover_every_pointwise_prim():
    pointwise = {i.name for i in prims.PRIM_INFO.values() if i.kind == prims.PrimKind.POINTWISE}
    assert set(cpp.CPP_OPS) == pointwise
    assert set(TRITON_OPS) == pointwise


INF, NAN = float("inf"), float("nan")
FLOATS = [-3.0, -1.0, -0.5, -0.0, 0.0, 1e-3, 0.5, 1.0, 2.5, 20.0, INF, -INF, NAN]
PAIR_VALUES = [-2.0, -0.5, 0.0, 1.0, 3.0, INF, -INF, NAN]


def op_cases():
    """(prim name, input tensors, dtype) cases, NaN/inf edge cases included."""
    u, pairs = torch.tensor(FLOATS), torch.tensor(PAIR_VALUES)
    pa, pb = (t.reshape(-1) for t in torch.meshgrid(pairs, pairs, indexing="ij"))
    ints_a = torch.tensor([-7, -1, 0, 0, 3, 5, 2**40], dtype=I64)
    ints_b = torch.tensor([2, -1, 0, 4, 3, -9, 7], dtype=I64)
    bools_a = torch.tensor([True, True, False, False])
    bools_b = torch.tensor([True, False, True, False])
    cases = []
    for name in ["neg", "abs", "exp", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
                 "tanh", "erf", "floor", "sign"]:  # fmt: skip
        cases.append((name, (u,), F32))
    for name in ["add", "sub", "mul", "div", "pow", "maximum", "minimum",
                 "eq", "ne", "lt", "le", "gt", "ge"]:  # fmt: skip
        cases.append((name, (pa, pb), F32))
    for name in ["add", "sub", "mul", "maximum", "minimum", "eq", "lt", "neg", "abs", "sign"]:
        cases.append((name, (ints_a, ints_b)[: 1 if name in ("neg", "abs", "sign") else 2], I64))
    cases.append(("logical_not", (bools_a,), BOOL))
    cases.append(("logical_and", (bools_a, bools_b), BOOL))
    values = (torch.tensor([1.0, 2, 3, 4]), torch.tensor([-1.0, -2, -3, -4]))
    cases.append(("where", (bools_a, *values), F32))
    return cases


def op_kernel():
    """All cases as one kernel with one store per case: (kernel, inputs, expected outputs)."""
    n = 64
    stores, dtypes, expected, inputs = [], [], {}, {}
    for k, (name, args, dt) in enumerate(op_cases()):
        ir_args = []
        for j, t in enumerate(args):
            buf = f"in{k}_{j}"
            inputs[buf] = torch.cat([t, t[:1].expand(n - len(t))])  # pad to n elements
            dtypes.append((buf, t.dtype))
            ir_args.append(Load(buf, x, t.dtype))
        ref_fn = prims.PRIM_INFO[prims.PRIMS[name]].ref
        ref = ref_fn(*(inputs[f"in{k}_{j}"] for j in range(len(args))))
        out = f"out{k}_{name}_{str(dt).split('.')[1]}"
        expected[out] = ref
        stores.append(Store(out, x, Op(name, tuple(ir_args), ref.dtype)))
        dtypes.append((out, ref.dtype))
    # constants: pow special cases, a materialised number, conversions
    v = torch.tensor(FLOATS[:10] * 7)[:n]
    inputs["v"], src = v, Load("v", x, F32)
    dtypes.append(("v", F32))
    to_bf16 = Op("convert_element_type", (src,), torch.bfloat16)
    extra = {
        "pow2": (Op("pow", (src, Constant(2.0, F32)), F32), v**2),
        "pow05": (Op("pow", (src, Constant(0.5, F32)), F32), v**0.5),
        "pow17": (Op("pow", (src, Constant(1.7, F32)), F32), v**1.7),
        "powm1": (Op("pow", (src, Constant(-1.0, F32)), F32), v**-1),
        "two_pow": (Op("pow", (Constant(2.0, F32), src), F32), 2.0**v),
        "exp_const": (Op("add", (src, Op("exp", (Constant(1.0, F32),), F32)), F32), v + torch.e),
        "to_i64": (Op("convert_element_type", (src,), I64), v.to(I64)),
        "to_bool": (Op("convert_element_type", (src,), BOOL), v.to(BOOL)),
        "to_bf16": (Op("convert_element_type", (to_bf16,), F32), v.to(torch.bfloat16).to(F32)),
    }
    for name, (expr, ref) in extra.items():
        stores.append(Store(name, x, expr))
        dtypes.append((name, ref.dtype))
        expected[name] = ref
    k = Kernel("kernel_0", n, 1, (Loop(False, tuple(stores)),), tuple(dtypes), ("ops",))
    return k, inputs, expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_against_eager(backend):
    k, inputs, expected = op_kernel()
    outputs = {name: (tuple(t.shape), t.dtype) for name, t in expected.items()}
    _, outs = run([k], inputs, outputs, backend)
    for (name, ref), out in zip(expected.items(), outs):
        assert out.dtype == ref.dtype, name
        torch.testing.assert_close(out, ref, equal_nan=True, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_buffers(backend):
    bf = torch.bfloat16
    body = Op("mul", (Op("exp", (Load("arg0", x, bf),), bf), Constant(3.0, bf)), bf)
    k = Kernel("kernel_0", 100, 1, (Loop(False, (Store("buf0", x, body),)),),
               (("arg0", bf), ("buf0", bf)), ("exp", "mul"))  # fmt: skip
    a = torch.randn(100).to(bf)
    _, (out,) = run([k], {"arg0": a}, {"buf0": ((100,), bf)}, backend)
    assert out.dtype == bf
    torch.testing.assert_close(out, (a.float().exp() * 3).to(bf))


# --- fp16 / bf16 conversions round like eager (see [Note: fp16 and bf16 conversions]) -----------
# Ties to even (1 + 2**-8), double rounding through fp32 (1 + 2**-8 + 2**-30 is 1.0 in eager's
# bf16, 1.0078125 rounded once), bf16 and fp16 subnormals, overflow to inf, NaN, signed zeros.
ROUNDING_CASES = [
    0.0, -0.0, 1.0, 0.1, -2.25, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-10, 1 + 2**-8 + 2**-30,
    1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-40, 1e-40, -3e-39, 9.2e-41, 6e-8, 3e-8, 1e-8,
    65504.0, 65519.99, 65520.0, 3.39e38, 3.4e38, 1e39, -1e39, float("inf"), float("-inf"),
    float("nan"),
]  # fmt: skip
INTEGER_CASES = [0, 1, -1, 257, 2049, 4097, 65521, -65537, 2**24 + 1, 2**31 - 1]
LOW_PRECISION = [torch.bfloat16, torch.float16]
CONVERSIONS = [
    *[(src, dst) for dst in LOW_PRECISION
      for src in (torch.float64, F32, torch.float16, torch.bfloat16, I64, torch.int32, BOOL)
      if src != dst],
    *[(src, dst) for src in LOW_PRECISION for dst in (torch.float64, F32, I64)],
]  # fmt: skip


def conversion_input(src: torch.dtype, dst: torch.dtype, device: str = "cpu") -> torch.Tensor:
    if src == BOOL:
        return torch.tensor([True, False, True], device=device)
    if not src.is_floating_point:
        return torch.tensor(INTEGER_CASES, dtype=src, device=device)
    values = torch.tensor(ROUNDING_CASES, dtype=torch.float64).to(src)
    if not dst.is_floating_point:  # float -> int is undefined out of range: whole numbers only
        values = torch.tensor([0.0, -0.0, 1.0, -2.0, 255.0, 256.0, -4096.0]).to(src)
    return values.to(device)


def assert_same_values(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to the last bit, signed zeros included (any NaN equals any NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if not want.dtype.is_floating_point:
        assert torch.equal(got, want)
        return
    g, w = got.double().cpu(), want.double().cpu()
    assert torch.equal(g.isnan(), w.isnan()), (got, want)
    g, w = g.nan_to_num(0.0), w.nan_to_num(0.0)
    assert torch.equal(g, w) and torch.equal(g.signbit(), w.signbit()), (got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("src,dst", CONVERSIONS, ids=str)
def test_low_precision_conversions_round_like_eager(backend, src, dst):
    # eager rounds fp64 -> fp16 through fp32: 1 + 2**-11 + 2**-40 -> 1.0, not 1.0009765625
    a = conversion_input(src, dst)
    got = toycomp.compile(lambda t: t.to(dst), backend=backend)(a)
    assert_same_values(got, a.to(dst))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_arithmetic_rounds_to_nearest_even(backend):
    """bf16 ops compute in fp32 and round once: Triton's interpreter used to truncate."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1000, generator=gen).to(torch.bfloat16) for _ in range(2))
    got = toycomp.compile(lambda a, b: (a * b, a / 3.0), backend=backend)(a, b)
    for g, w in zip(got, (a * b, a / 3.0)):  # correctly rounded in fp32: equal to the last bit
        assert_same_values(g, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_gradient_of_a_mixed_precision_product(backend):
    """The bf16 input's gradient is computed in fp64 and converted to bf16 (it was NaN)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, generator=gen).to(torch.bfloat16).requires_grad_()
    b = torch.randn(64, generator=gen, dtype=torch.float64).requires_grad_()
    fn = lambda a, b: (a * b).sin()  # noqa: E731
    got = torch.autograd.grad(toycomp.compile(fn, backend=backend)(a, b).sum(), (a, b))
    want = torch.autograd.grad(fn(a, b).sum(), (a, b))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)


# --- signed zeros and NaN, bit for bit (see [Note: maximum, minimum, NaN and signed zero]) -------
# The cases are the prims-level test's (tests/prims): here they run through both code generators.
from tests.prims.test_decompositions import SIGNED_ZERO_CASES, SPECIAL_VALUES  # noqa: E402

_NAN = float("nan")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [n for n in SIGNED_ZERO_CASES if n != "relu_backward"])
def test_signed_zeros_and_nan_like_eager(backend, name):
    fn = SIGNED_ZERO_CASES[name]
    x = SPECIAL_VALUES.repeat(8).requires_grad_()
    out = toycomp.compile(fn, backend=backend)(x)
    assert_same_values(out, fn(x))
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert_same_values(grad, torch.autograd.grad(fn(x).sum(), x)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_maximum_minimum_kernels_follow_the_prims_rule(backend):
    """NaN from either side wins; a -0.0/0.0 tie gives b (eager's own answer there depends on
    the length: see the Note), in both codegens and in the reference alike."""
    a = torch.tensor([-0.0, 0.0, _NAN, 1.0, _NAN, 2.0, 0.0, -0.0])
    b = torch.tensor([0.0, -0.0, 1.0, _NAN, _NAN, -3.0, 0.0, -0.0])
    got = toycomp.compile(lambda a, b: (torch.maximum(a, b), torch.minimum(a, b)), backend=backend)
    for out, prim in zip(got(a, b), (prims.maximum, prims.minimum)):
        assert_same_values(out, prim(a, b))


# --- C++ compilation cache and errors ------------------------------------------------------------
def test_cpp_cache_hit_skips_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path))
    libmvec.vector_math_functions()  # the once-per-process probe is not what this test counts
    calls = []
    real = cache._run_compiler
    monkeypatch.setattr(cache, "_run_compiler", lambda cmd: calls.append(cmd) or real(cmd))
    source = cpp.generate(sincos_kernel(10)).source
    first = cache.compile_cpp(source)
    assert len(calls) == 1 and first.exists()
    assert cache.compile_cpp(source) == first
    assert len(calls) == 1  # second compile: a cache hit, no compiler
    a = torch.randn(10)
    _, (out,) = run([sincos_kernel(10)], {"arg0": a}, {"buf0": ((10,), F32)}, "cpp")
    compiles = len(calls)  # 1 more when vector math is available (other flags: another library)
    assert compiles == 1 + ("sincosf" in libmvec.vector_math_functions())
    check(out, a.sin() ** 2 + a.cos() ** 2)
    monkeypatch.setattr(cache, "_LIBRARIES", {})  # a new process: only the disk cache is left
    _, (out,) = run([sincos_kernel(10)], {"arg0": a}, {"buf0": ((10,), F32)}, "cpp")
    assert len(calls) == compiles
    check(out, a.sin() ** 2 + a.cos() ** 2)


# --- vectorised libm (see [Note: vectorised libm] in cpp.py) ----------------------------------
VECTOR_OPS = ["sin", "cos", "exp", "log", "log1p", "tanh", "erf", "pow"]


def special_values(n: int = 1003) -> torch.Tensor:
    """NaN, infinities, signed zeros, denormals, huge sin/cos arguments, then random values;
    n is not a multiple of any vector width, so the scalar remainder runs too."""
    special = [NAN, INF, -INF, 0.0, -0.0, 1e-40, -1e-40, 1e-30, 1.0, -1.0, 88.0, 89.0, -104.0,
               1e4, -1e4, 1e6, 1e20, -1e30, 3.4e38, -3.4e38, 0.5, -0.5, 2.0, 1e-7, -0.999]
    torch.manual_seed(0)
    rest = torch.randn(n - len(special)) * torch.logspace(-3, 3, n - len(special))
    return torch.cat([torch.tensor(special), rest])  # fmt: skip


def vector_ops_kernel(n: int, dtype: torch.dtype = F32) -> tuple[Kernel, dict]:
    """One store per op of VECTOR_OPS (pow: v ** 1.7), and the eager results."""
    a, v = Load("arg0", x, dtype), special_values(n).to(dtype)
    refs = {"sin": v.sin(), "cos": v.cos(), "exp": v.exp(), "log": v.log(), "log1p": v.log1p(),
            "tanh": v.tanh(), "erf": v.erf(), "pow": v**1.7}  # fmt: skip
    stores = [Store(f"out_{name}", x, Op(name, (a,), dtype)) for name in VECTOR_OPS[:-1]]
    stores.append(Store("out_pow", x, Op("pow", (a, Constant(1.7, dtype)), dtype)))
    dtypes = (("arg0", dtype), *((f"out_{name}", dtype) for name in VECTOR_OPS))
    k = Kernel("kernel_0", n, 1, (Loop(False, tuple(stores)),), dtypes, tuple(VECTOR_OPS))
    return k, {"arg0": v, **{f"out_{name}": refs[name] for name in VECTOR_OPS}}


def run_vector_ops(dtype: torch.dtype = F32, n: int = 1003):
    k, tensors = vector_ops_kernel(n, dtype)
    outputs = {f"out_{name}": ((n,), dtype) for name in VECTOR_OPS}
    compiled, outs = run([k], {"arg0": tensors["arg0"]}, outputs, "cpp")
    for name, out in zip(VECTOR_OPS, outs):
        ref = tensors[f"out_{name}"]
        torch.testing.assert_close(out, ref, equal_nan=True, rtol=1e-4, atol=1e-5, msg=name)
    return compiled


def test_vector_math_matches_eager_on_special_values():
    available = libmvec.vector_math_functions()
    if "expf" not in available:
        pytest.skip("this machine's glibc has no libmvec expf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to scalar calls here
        compiled = run_vector_ops()
    source = compiled.kernels[0].source
    assert "float tmp3 = toycomp_expf(tmp0);" in source and "#pragma omp simd" in source
    assert "#if defined(TOYCOMP_SIMD_expf) && defined(TOYCOMP_SAME_LIBM_1)\n" in source
    wanted = [f for f, _ in libmvec.VECTOR_MATH.values()]
    flags = libmvec.vector_math_flags(wanted)
    assert "-lmvec" in flags and "-DTOYCOMP_SIMD_expf" in flags
    library = cache.compile_cpp(source, flags).read_bytes()  # a cache hit: what was loaded
    # expf is toycomp's own inline code ([Note: toycomp's own expf]), vectorised in the loop:
    # no glibc symbol; the others are glibc's vector versions
    for fn in (available & set(wanted)) - {"expf"}:
        assert f"v_{fn}".encode() in library, fn  # e.g. _ZGVeN16v_sinf: the vector version
    assert b"_ZGVeN16v_expf" not in library and b"_ZGVdN8v_expf" not in library


def test_vector_math_unavailable_falls_back_to_scalar(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TOYCOMP_VECTOR_MATH", "0")
    assert libmvec.vector_math_functions() == frozenset()
    compiled = run_vector_ops()
    (library,) = (tmp_path / "cpp").glob("*.so")  # one library, compiled without the macros
    assert b"_ZGV" not in library.read_bytes()
    assert "toycomp_expf(tmp0)" in compiled.kernels[0].source  # the same source either way


@pytest.mark.parametrize("failure", ["compile", "load"])
def test_vector_math_failure_falls_back_to_scalar(tmp_path, monkeypatch, failure):
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(libmvec, "vector_math_functions", lambda: frozenset(["sinf", "expf"]))
    real_compile, real_load = cache._run_compiler, cache.load_cpp_library

    def failing_compiler(cmd):
        if "-lmvec" in cmd:
            return cache.subprocess.CompletedProcess(cmd, 1, "", "error: simulated")
        return real_compile(cmd)

    def failing_load(source, extra_flags=()):
        if "-lmvec" in extra_flags:
            raise OSError("undefined symbol: _ZGVeN16v_sinf (simulated)")
        return real_load(source, extra_flags)

    if failure == "compile":
        monkeypatch.setattr(cache, "_run_compiler", failing_compiler)
    else:
        monkeypatch.setattr(cache, "load_cpp_library", failing_load)
    with pytest.warns(UserWarning, match="vectorised libm failed, using scalar calls"):
        run_vector_ops()


def test_vector_math_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path))
    available = libmvec.vector_math_functions()
    if not {"expf", "logf"} <= available:
        pytest.skip("this machine's glibc has no libmvec expf/logf")
    assert libmvec.probe_vector_math(["expf", "logf"]) == {"expf", "logf"}
    # a function computing the wrong values is left out; the others stay
    wrong = dict(libmvec._VECTOR_MATH_CANDIDATES, expf=(1, lambda v: v))
    monkeypatch.setattr(libmvec, "_VECTOR_MATH_CANDIDATES", wrong)
    assert libmvec.probe_vector_math(["expf", "logf"]) == {"logf"}
    # a compiler that fails: nothing, and no exception
    failed = cache.subprocess.CompletedProcess([], 1, "", "error: simulated")
    monkeypatch.setattr(cache, "_run_compiler", lambda cmd: failed)
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path / "empty"))
    assert libmvec.probe_vector_math(["logf"]) == frozenset()


def test_float64_keeps_std_math():
    compiled = run_vector_ops(torch.float64, n=101)
    source = compiled.kernels[0].source
    assert "std::sin(tmp0)" in source and "TOYCOMP_SIMD" not in source


def test_cpp_pragmas():
    """Big kernels run on all cores, small ones on one; loops are `omp simd` where safe."""
    assert "#pragma omp parallel for simd\n" in cpp.generate(sincos_kernel(1 << 16)).source
    small = cpp.generate(sincos_kernel(1000)).source
    assert "#pragma omp simd\n" in small and "parallel" not in small
    big = cpp.generate(softmax_kernel(64, 1000)).source
    assert "#pragma omp parallel for\n" in big  # rows in parallel, each r loop vectorised:
    # (four r loops: the one calling exp runs as two, see [Note: a vector tail])
    assert big.count("#pragma omp simd") == 4 and "simd reduction(max_nan:" in big
    # an r loop reading what it stores at another index keeps its iterations in order
    shifted = Load("buf0", r + 1 + 9 * x, F32)
    loop = Loop(True, (Store("buf0", r + 9 * x, Op("add", (shifted, Constant(1.0, F32)), F32)),))
    k = Kernel("kernel_0", 4096, 8, (loop,), (("buf0", F32),), ("shift",))
    assert "simd" not in cpp.generate(k).source.removeprefix(cpp.PREAMBLE)


def test_cpp_compiler_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path))
    with pytest.raises(cache.CppCompileError, match="error"):
        cache.compile_cpp('extern "C" void f() { this is not C++; }')
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(cache.CppCompileError, match="no-such-compiler"):
        cache.compile_cpp('extern "C" void g() {}')


def test_clear_errors():
    with pytest.raises(RuntimeError, match="C\\+\\+ backend runs on CPU"):
        wrapper.compile_graph(mm_graph("cuda"), "cpp")
    with pytest.raises(ValueError, match="unknown backend"):
        wrapper.compile_graph(mm_graph(), "metal")
    store = Store("b", x, Op("nope", (Load("a", x, F32),), F32))
    bad = Kernel("kernel_0", 4, 1, (Loop(False, (store,)),), (("a", F32), ("b", F32)), ())
    for gen in (cpp.generate, triton.generate):
        with pytest.raises(NotImplementedError, match="'nope'"):
            gen(bad)


def test_interpreter_leaves_no_global_state():
    """A CUDA compile after an interpreted CPU run must see an untouched triton.language."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    spaces = [tl, tl.core, tl.math, tl.tensor, tl.dtype]
    before = [dict(vars(s)) for s in spaces]
    env, call = os.environ.get("TRITON_INTERPRET"), JITFunction.__call__
    a = torch.randn(3, 5000)
    run([softmax_kernel(3, 5000)], {"arg0": a}, {"buf2": ((3, 5000), F32)}, "triton")
    assert (os.environ.get("TRITON_INTERPRET"), JITFunction.__call__) == (env, call)
    for space, old in zip(spaces, before):
        new = dict(vars(space))
        changed = [k for k in set(old) | set(new) if old.get(k) is not new.get(k)]
        assert not changed, (space, changed)


def test_generated_names_are_readable():
    src = triton.generate(softmax_kernel(8, 1000)).source
    for name in ("in_ptr0", "out_ptr0", "xnumel", "rnumel", "xindex", "rindex", "xmask", "rmask",
                 "tmp0", "# FX origins: amax"):  # fmt: skip
        assert name in src
    assert "libdevice" not in src
    csrc = cpp.generate(softmax_kernel(64, 1000)).source
    assert '// kernel_1 (FX origins: amax' in csrc and "#pragma omp parallel for" in csrc


# --- CUDA (the lent GPU machine) -----------------------------------------------------------------
@CUDA
@pytest.mark.parametrize("rows,cols", [(8, 1000), (3, 5000), (300, 100)])
def test_cuda_softmax(rows, cols):
    a = torch.randn(rows, cols)
    _, (out,) = run([softmax_kernel(rows, cols)], {"arg0": a}, {"buf2": ((rows, cols), F32)},
                    "triton", device="cuda")  # fmt: skip
    assert out.is_cuda
    check(out, torch.softmax(a, 1))


@CUDA
def test_cuda_ops_and_mm():
    k, inputs, expected = op_kernel()
    outputs = {name: (tuple(t.shape), t.dtype) for name, t in expected.items()}
    _, outs = run([k], inputs, outputs, "triton", device="cuda")
    for (name, ref), out in zip(expected.items(), outs):
        torch.testing.assert_close(out.cpu(), ref, equal_nan=True, rtol=1e-4, atol=1e-5, msg=name)
    a, b = torch.randn(8, 16, device="cuda"), torch.randn(4, 16, device="cuda")
    relu, _, _ = wrapper.compile_graph(mm_graph("cuda"), "triton")([a, b])
    check(relu, torch.relu(a @ b.T))


@CUDA
@pytest.mark.parametrize("src,dst", CONVERSIONS, ids=str)
def test_cuda_low_precision_conversions_round_like_eager(src, dst):
    a = conversion_input(src, dst, device="cuda")
    got = toycomp.compile(lambda t: t.to(dst), backend="triton")(a)
    assert got.is_cuda
    assert_same_values(got, a.to(dst))


@CUDA
def test_cuda_bfloat16_arithmetic_and_mixed_precision_gradient():
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1000, generator=gen).to(torch.bfloat16).cuda() for _ in range(2))
    for g, w in zip(toycomp.compile(lambda a, b: (a * b, a / 3.0))(a, b), (a * b, a / 3.0)):
        assert_same_values(g, w)
    a = a[:64].requires_grad_()
    d = torch.randn(64, generator=gen, dtype=torch.float64).cuda().requires_grad_()
    fn = lambda a, d: (a * d).sin()  # noqa: E731
    got = torch.autograd.grad(toycomp.compile(fn)(a, d).sum(), (a, d))
    for g, w in zip(got, torch.autograd.grad(fn(a, d).sum(), (a, d))):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("printer", [codegen.IndexPrinter(), cpp.CppPrinter()])
def test_index_printer_keeps_floordiv_operands_together(printer):
    """Printed indices evaluate like the sympy expression (C++ '/' on non-negative ints is '//')."""
    floordiv, modular = indexing.FloorDiv, indexing.modular
    exprs = [floordiv(6 * r + x, 24), modular(x + 3 * r, 7), 5 * floordiv(x, 4) + r]
    for expr in exprs:
        text = printer.doprint(expr).replace("//", "/").replace("/", "//")
        for xv, rv in [(0, 0), (5, 3), (23, 1), (100, 17)]:
            expected = int(expr.subs({x: xv, r: rv}).replace(floordiv, lambda a, b: a // b))
            assert eval(text, {"xindex": xv, "rindex": rv}) == expected, (expr, text)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cols", [67, 5000])  # a persistent row, a looped one (Triton)
def test_float_max_and_min_like_eager_bit_for_bit(backend, dtype, cols):
    """Row and column max/min over NaN anywhere, infinities, signed zeros, subnormals and rows
    of one sign: the Triton kernels reduce ordered integer keys ([Note: one reduction for a
    float max]), which must turn back into eager's floats."""
    gen = torch.Generator().manual_seed(0)
    info = torch.finfo(dtype)
    a = torch.randn(12, cols, generator=gen, dtype=dtype) * 1e3
    a[0, 5] = a[1, -1] = a[7, :] = _NAN
    a[1, 0], a[2, :], a[3, :] = -float("inf"), -float("inf"), float("inf")
    a[4, :], a[5, :] = -0.0, 0.0
    a[6, :] = -info.tiny * torch.rand(cols, generator=gen, dtype=dtype)  # negative subnormals
    a[8, :] = -a[8, :].abs() - 1
    a[9, :] = a[9, :].abs() + 1
    a[10, 3], a[10, 4] = info.max, -info.max
    fn = lambda a: (a.amax(1), a.amin(1), a.amax(0), a.amin(0))  # noqa: E731
    for got, want in zip(toycomp.compile(fn, backend=backend)(a), fn(a)):
        assert_same_values(got, want)
