"""Lean Triton launches on CUDA ([Note: lean launches] in toycomp/_triton_compat.py): a kernel
launched directly only with the specialization Triton compiled it for, and results like eager's.
The specialization check runs anywhere; the launches need the lent GPU."""

from __future__ import annotations

import itertools

import pytest
import torch

import toycomp
from toycomp._triton_compat import MAX_LAUNCH_KINDS, LeanLauncher, _specialization, fast_launch

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


class FakeJIT:
    """A stand-in for a ``JITFunction`` (``fn[grid](*args, **meta)`` compiles and launches):
    each kind of arguments compiles into its own "kernel", whose runs are recorded."""

    arg_names = ["in_ptr0", "xnumel", "XBLOCK"]

    def __init__(self):
        self.compiled, self.runs = 0, []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.compiled += 1
            n = self.compiled
            kernel = type("Kernel", (), {})()
            kernel.run = lambda *a: self.runs.append((n, a))
            kernel.function, kernel.packed_metadata = f"function{n}", "md"
            self.runs.append((n, ("triton", *args)))
            return kernel

        return launch


def test_launch_tables_stay_bounded_and_launch_the_right_kernel():
    """[Note: launch tables are bounded]: sizes that vary at every call keep at most
    MAX_LAUNCH_KINDS kinds, and every launch still runs the kernel made for its size."""
    jit = FakeJIT()
    launcher = LeanLauncher.__new__(LeanLauncher)  # (no CUDA driver here)
    launcher.fn, launcher.fast = jit, None
    launcher.launches, launcher.fast_launches = {}, {}
    launcher.knobs = type("Knobs", (), {"launch_enter_hook": None})()
    t = torch.zeros(4)
    compiled_for = {}
    for n in [*range(3 * MAX_LAUNCH_KINDS), *range(3 * MAX_LAUNCH_KINDS)] * 2:
        launcher.run(7, (n,), t, n, XBLOCK=16)
        assert len(launcher.launches) <= MAX_LAUNCH_KINDS
        assert len(launcher.fast_launches) <= MAX_LAUNCH_KINDS
        kernel, args = jit.runs[-1]
        if args[0] == "triton":  # compiled (again) for this size
            assert args[1:] == (t, n)
            compiled_for[n] = kernel
        else:  # launched directly: the kernel compiled for n, with n passed on
            assert kernel == compiled_for[n]
            assert args == (n, 1, 1, 7, f"function{kernel}", "md", None, None, None,
                            t.data_ptr(), n, 16)  # fmt: skip
    for _ in range(3):  # a kind launched again and again: directly after the first time
        launcher.run(7, (5,), t, 5, XBLOCK=16)
    kernel = jit.runs[-3][0]
    assert [(k, a[0]) for k, a in jit.runs[-2:]] == [(kernel, 5), (kernel, 5)]


@CUDA
def test_sizes_that_vary_at_every_launch_stay_correct_and_bounded():
    kernel = LeanLauncher(add_kernel())
    a, b = torch.randn(512, device="cuda"), torch.randn(512, device="cuda")
    for n in [*range(1, 2 * MAX_LAUNCH_KINDS), *range(1, 2 * MAX_LAUNCH_KINDS, 3)]:
        out = torch.zeros(512, device="cuda")
        kernel[(-(-n // 128),)](a, b, out, n, XBLOCK=128, num_warps=4)
        torch.testing.assert_close(out[:n], a[:n] + b[:n])
        assert not out[n:].any()
    assert len(kernel.launches) <= MAX_LAUNCH_KINDS >= len(kernel.fast_launches)


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
    source = wrapper.WrapperCodegen(graph, [triton.generate(kernel, cuda=True)]).generate()
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
