"""Lean Triton launches on CUDA ([Note: lean launches] in toycomp/_triton_compat.py): a kernel
launched directly only with the specialization Triton compiled it for, and results like eager's.
The specialization check runs anywhere; the launches need the lent GPU."""

from __future__ import annotations

import itertools

import pytest
import torch

import toycomp
from toycomp._triton_compat import LeanLauncher, _specialization, fast_launch

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def triton_specialization(arg):
    """Triton's own view of an argument (the oracle; its name has changed across versions)."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:
        pytest.skip("this Triton has no native_specialize_impl")
    return native_specialize_impl(BaseBackend, arg, False, True, True)


def test_equal_specializations_are_equal_for_triton():
    t = torch.zeros(64)
    args = [0, 1, 2, 15, 16, 17, 32, -16, -1, 2**31 - 16, 2**31, 2**40, 2**63, 2.5, 1.0,
            t, t[1:], t[4:], t.double(), t.double()[1:], t.to(torch.int32)[2:]]  # fmt: skip
    for a, b in itertools.combinations(args, 2):
        if _specialization(a) == _specialization(b):
            assert triton_specialization(a) == triton_specialization(b), (a, b)


def test_fast_launch_takes_exactly_the_calls_of_its_kind():
    """[Note: fast launches]: the generated check accepts a call iff the keyed path's key
    (``_specialization`` of each argument, and the constexprs) is the one it was made for,
    and passes tensors as their addresses, in order."""
    def key(args, meta):
        return (*map(_specialization, args), *meta.items())

    launched = []
    t = torch.zeros(64)
    made_for = ((t, t[1:], 1000, 2.5), {"XBLOCK": 64})
    fast = fast_launch(*made_for, (lambda *a: launched.append(a), "fn", "md", (64,)), bool)
    choices = [[t, t[4:], t[1:], t.double(), 1000], [t[1:], t[2:], t, t.int()[1:]],
               [1000, 999, 1000.0, True, t], [2.5, 1.0, 2, None]]  # fmt: skip
    seen = set()
    for args in itertools.product(*choices):
        for meta in ({"XBLOCK": 64}, {"XBLOCK": 32}):
            took = fast(5, (2,), args, meta)
            assert took == (key(args, meta) == key(*made_for)), (args, meta)
            seen.add(took)
            if took:
                addresses = [a.data_ptr() for a in args[:2]]
                assert launched[-1] == (2, 1, 1, 5, "fn", "md", None, None, None,
                                        *addresses, args[2], args[3], 64)  # fmt: skip
    assert seen == {True, False}
    assert not fast(5, (2,), made_for[0][:3], made_for[1])  # fewer arguments
    hooked = fast_launch(*made_for, (lambda *a: None, "fn", "md", (64,)), lambda: True)
    assert not hooked(5, (2,), *made_for)  # a launch hook: every launch through Triton


def add_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        xmask = xindex < xnumel
        a = tl.load(in_ptr0 + xindex, xmask)
        b = tl.load(in_ptr1 + xindex, xmask)
        tl.store(out_ptr0 + xindex, a + b, xmask)

    return add


@CUDA
def test_lean_launches_reuse_only_the_matching_compiled_kernel():
    kernel = LeanLauncher(add_kernel())
    base = torch.randn(4096 + 1, device="cuda")
    other = torch.randn(4096 + 1, device="cuda")
    cases = [(base[:4096], 4096), (base[:4096], 4096), (base[1:], 4096), (base[:1000], 1000),
             (base[:1], 1), (base[1:1001], 1000)]  # fmt: skip
    for a, n in cases:
        out = torch.empty(n, device="cuda")
        kernel[(-(-n // 256),)](a, other[:n], out, n, XBLOCK=256, num_warps=4)
        torch.testing.assert_close(out, a[:n] + other[:n])
    # aligned 4096, misaligned 4096, aligned 1000, n=1, misaligned 1000: five specializations
    assert len(kernel.launches) == 5


@CUDA
def test_launch_hooks_see_every_launch():
    from triton import knobs

    kernel, seen = LeanLauncher(add_kernel()), []
    a = torch.randn(256, device="cuda")
    out = torch.empty(256, device="cuda")
    kernel[(1,)](a, a, out, 256, XBLOCK=256, num_warps=4)
    default = knobs.runtime.launch_enter_hook
    knobs.runtime.launch_enter_hook = seen.append
    try:
        for _ in range(3):
            kernel[(1,)](a, a, out, 256, XBLOCK=256, num_warps=4)
    finally:
        knobs.runtime.launch_enter_hook = default
    assert len(seen) == 3
    torch.testing.assert_close(out, a + a)


@CUDA
def test_compiled_training_step_with_lean_launches_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128), torch.nn.Linear(128, 8)
    ).cuda()

    def step(x, y):
        return torch.nn.functional.cross_entropy(model(x), y)

    compiled = toycomp.compile(step, backend="triton")
    for batch in (32, 32, 17, 32):  # the same graph again, then another size
        x, y = torch.randn(batch, 64, device="cuda"), torch.randint(0, 8, (batch,), device="cuda")
        model.zero_grad()
        expected = step(x, y)
        expected.backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        got = compiled(x, y)
        got.backward()
        torch.testing.assert_close(got, expected)
        for g, w in zip((p.grad for p in model.parameters()), want):
            torch.testing.assert_close(g, w)


def test_cuda_wrapper_guards_its_device_and_reads_the_stream_once():
    """The CUDA wrapper's source (generated without a GPU): inputs checked first, then every
    allocation and launch inside `with torch.cuda.device(1):`, on the stream read once."""
    from tests.inductor.test_codegen import contiguous, softmax_kernel
    from toycomp.inductor import ir, wrapper
    from toycomp.inductor.codegen import triton

    kernel = softmax_kernel(8, 1000)
    graph = ir.ScheduledGraph(
        inputs=(ir.InputBuffer("arg0", (8, 1000), (1000, 1), torch.float32),),
        allocations=(ir.AllocatedBuffer("buf2", (8, 1000), contiguous((8, 1000)), torch.float32),),
        steps=(kernel,),
        outputs=(ir.TensorArg("buf2", (8, 1000), (1000, 1)),),
        device=torch.device("cuda", 1),
    )
    source = wrapper.WrapperCodegen(graph, [triton.generate(kernel, lean=True)]).generate()
    lines = [line.strip() for line in source.splitlines()]
    guard = lines.index("with torch.cuda.device(1):")
    check = "check_input(arg0, (8, 1000), (1000, 1), torch.float32, device, 'arg0')"
    assert lines.index(check) < guard
    assert lines[guard + 1] == "stream0 = get_raw_stream(1)"
    (launch,) = [line for line in lines if "kernel_1" in line]
    assert launch.startswith("kernel_1.run(stream0, (") and lines.index(launch) > guard + 1
    body = source.split("with torch.cuda.device(1):\n")[1]
    assert all(line.startswith("        ") for line in body.splitlines()), body  # all inside
    compile(source, "<wrapper>", "exec")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_graph_on_another_device_launches_there():
    """The wrapper's device guard: tensors on cuda:1 while cuda:0 is current (kernels used to
    launch on the current device)."""
    def fn(x, w):
        return torch.softmax(x @ w, -1).sum(0) * 2

    compiled = toycomp.compile(fn, backend="triton")
    for device in ("cuda:1", "cuda:0", "cuda:1"):
        torch.manual_seed(0)
        x = torch.randn(64, 128, device=device, requires_grad=True)
        w = torch.randn(128, 256, device=device)
        with torch.cuda.device(0):
            got = compiled(x, w)
            (grad,) = torch.autograd.grad(got.sum(), x)
        expected = fn(x, w)
        (want,) = torch.autograd.grad(expected.sum(), x)
        assert got.device == x.device and grad.device == x.device
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(grad, want)
