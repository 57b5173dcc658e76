"""Compile time (toycomp/inductor/opt/async_compile.py, opt/async_compile.py): a graph's C++ kernels
compiled a few to a unit with the same results as eager's, a unit that fails compiled kernel by
kernel, and the Triton kernels of a CUDA graph given to Triton before the first run (on the CPU,
the interpreter: nothing to do)."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

import toycomp
from toycomp.inductor import cache
from toycomp.inductor.codegen.common import GeneratedKernel
from toycomp.inductor.opt import async_compile


@pytest.fixture
def compiles(tmp_path, monkeypatch):
    """The compiler runs of each test, in a fresh cache (so every kernel compiles)."""
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_LIBRARIES", {})
    runs, real = [], cache._run_compiler
    monkeypatch.setattr(cache, "_run_compiler", lambda cmd: runs.append(cmd) or real(cmd))
    return runs


def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Forward and backward of a small MLP-like function: several kernels each way."""
    h = torch.tanh(x @ w) * torch.sigmoid(x.sum(1, keepdim=True))
    return (torch.softmax(h, -1) * h.exp().clamp(max=3)).sum() + h.amax(0).mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("simdlen", [None, 0])
def test_batched_kernels_compute_what_eager_does(compiles, dtype, simdlen):
    x = torch.randn(13, 7, dtype=dtype)
    w = torch.randn(7, 11, dtype=dtype, requires_grad=True)
    with toycomp.config.patch(compile_threads=2, **{"cpp.simdlen": simdlen}):
        f = toycomp.compile(step, backend="cpp")
        got = f(x, w)
        got.backward()
    grad, w.grad = w.grad, None
    want = step(x, w)
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, w.grad)
    kernels = sum(len(g.compiled.kernels) for e in f.entries for g in e.graphs)
    units = [c for c in compiles if any(str(a).endswith(".cpp") for a in c)]
    units = [c for c in units if "probe" not in " ".join(map(str, c))]
    assert kernels >= 5 and len(units) < kernels  # a few kernels a compile


def test_teach_compiles_each_kernel_alone():
    assert toycomp.config.teach["cpp.batch_kernels"] is False
    assert toycomp.config.fast["cpp.batch_kernels"] is True


def kernel(name: str, body: str, extra: str = "") -> GeneratedKernel:
    source = f"#include <cmath>\n#include <cstdint>\n\n{extra}\n" \
             f'extern "C" void {name}(float* out) {{ {body} }}\n'
    return GeneratedKernel(name, "cpp", source, (), call=f"{name}(buf0.data_ptr())")


def run(fn) -> float:
    out = torch.zeros(1)
    fn(out.data_ptr())
    return out.item()


def test_a_unit_that_fails_compiles_kernel_by_kernel(compiles):
    # both define the C symbol `clash`: one unit cannot hold them, each alone can
    clash = 'extern "C" float clash() { return 2.0f; }'
    ks = [kernel("kernel_0", "out[0] = std::sqrt(4.0f) + clash();", clash),
          kernel("kernel_1", "out[0] = -clash();", clash), kernel("kernel_2", "out[0] = 7;")]
    fns = async_compile.load_in_units(ks, 1)
    assert [run(f) for f in fns] == [4.0, -2.0, 7.0]
    assert len(compiles) == 1 + 3  # the unit, then each kernel alone


def test_a_unit_keeps_each_kernels_helpers_its_own(compiles):
    # the same helper name with two meanings: each kernel sees its own (its namespace)
    ks = [kernel(f"kernel_{i}", "out[0] = helper();", f"inline float helper() {{ return {i}; }}")
          for i in range(3)]
    fns = async_compile.load_in_units(ks, 1)
    assert [run(f) for f in fns] == [0.0, 1.0, 2.0] and len(compiles) == 1


def test_the_shared_prefix_is_cut_outside_braces_and_conditions():
    common = ["#if defined(A)", "", "#define B \\", "  {", "#endif", "",
              "inline int f() {", "", "  return 1;", "}", ""]
    bodies = [common + ["int x0;"], common + ["int x1;"]]
    assert async_compile._shared_prefix(bodies) == len(common)  # after f, not in it or in the #if
    assert async_compile._shared_prefix([common[:8] + ["a"], common[:8] + ["b"]]) == 6
    late = "#include <cmath>\n\nint x;\n#include <vector>\n"
    assert async_compile.split_includes(late) is None


def test_groups_are_even_and_in_order():
    assert async_compile.groups(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert async_compile.groups([1, 2], 8) == [[1], [2]] and async_compile.groups([], 2) == []


# --- Triton: compiled ahead of the first run ----------------------------------------------------
def triton_graph(fn, *args):
    pytest.importorskip("triton")
    with toycomp.config.patch({"triton.lean_launch": False}):
        f = toycomp.compile(fn, backend="triton")
        out = f(*args)
    return out, [g for e in f.entries for g in e.graphs]


def pointwise_and_sum(x, y, n):
    return torch.sin(x) * y.to(x.dtype), (x * 2).sum(1), n.float() + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_warmup_args_read_each_launch(dtype):
    x, y, n = torch.randn(8, 100, dtype=dtype), torch.randn(8, 100), torch.arange(5)
    out, graphs = triton_graph(pointwise_and_sum, x, y, n)
    for got, want in zip(out, pointwise_and_sum(x, y, n)):
        torch.testing.assert_close(got, want)
    scheduled, generated = graphs[0].scheduled, graphs[0].compiled.kernels
    dtypes = async_compile.buffer_dtypes(scheduled)
    assert {dtype, torch.float32, torch.int64} <= set(dtypes.values())
    for g in generated:
        name, args, meta = async_compile.warmup_args(g.call, dtypes)
        assert name == g.name and meta and all(isinstance(v, int) for v in meta.values())
        launch = g.call[g.call.index("](") + 2 : -1].split(", ")
        for arg, value in zip(launch, args):
            assert value == (dtypes[arg] if arg in dtypes else int(arg))


def test_launches_not_known_before_the_run_are_left_to_the_launch():
    dtypes = {"buf0": torch.float32}
    assert async_compile.warmup_args("kernel_0[(1,)](buf0, s0, XBLOCK=8)", dtypes) is None
    assert async_compile.warmup_args("kernel_0[(1,)](buf0, 8, XBLOCK=X)", dtypes) is None
    blocks = "blocks = reduction_blocks(s0, s1)\nkernel_0[(1,)](buf0, 8, **blocks)"
    assert async_compile.warmup_args(blocks, dtypes) is None
    lean = "kernel_0.run(stream0, (4, 1, 1), buf0, 64, XBLOCK=16, num_warps=4)"
    assert async_compile.warmup_args(lean, dtypes) == (
        "kernel_0", [torch.float32, 64], {"XBLOCK": 16, "num_warps": 4})


def test_precompile_gives_each_kernel_to_triton_on_cuda_only(monkeypatch):
    x = torch.randn(8, 100)
    _, graphs = triton_graph(pointwise_and_sum, x, torch.randn(8, 100), torch.arange(5))
    scheduled, generated = graphs[0].scheduled, graphs[0].compiled.kernels
    assert async_compile.precompile_triton(generated, scheduled, torch.device("cpu")) == 0
    warmed = []

    class FakeJIT:  # what the pool hands each kernel (CUDA is not here)
        def __init__(self, name):
            self.__name__ = name

        def warmup(self, *args, grid, **meta):
            warmed.append((self.__name__, list(args), meta))

    modules = {g.source: types.SimpleNamespace(**{g.name: FakeJIT(g.name)}) for g in generated}
    monkeypatch.setattr(cache, "load_python_module", lambda source, prefix: modules[source])
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    cuda = torch.device("cuda", 0)
    dtypes = async_compile.buffer_dtypes(scheduled)
    with toycomp.config.patch({"compile_threads": 4, "triton.compile_workers": False}):
        assert async_compile.precompile_triton(generated, scheduled, cuda) == len(generated)
    want = [async_compile.warmup_args(g.call, dtypes) for g in generated]
    assert sorted(warmed, key=lambda w: w[0]) == sorted(want, key=lambda w: w[0])
    warmed.clear()
    with toycomp.config.patch(compile_threads=1):  # off: each compiles at its first launch
        assert async_compile.precompile_triton(generated, scheduled, cuda) == 0
    assert warmed == []


def test_workers_compile_for_the_gpu_and_the_warmup_finds_it(tmp_path, monkeypatch):
    """Triton compiles for a GPU target without one (its ptxas is in the wheel): the workers
    compile each kernel into Triton's cache, and this process's warm-up finds it there."""
    triton = pytest.importorskip("triton")
    from triton.runtime.driver import driver

    from toycomp.inductor.opt import triton_worker

    x = torch.randn(8, 100)
    _, graphs = triton_graph(pointwise_and_sum, x, torch.randn(8, 100), torch.arange(5))
    scheduled, generated = graphs[0].scheduled, graphs[0].compiled.kernels
    target = ("cuda", 90, 32)  # an H100's
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(async_compile, "_workers", None)  # fresh ones, which see that cache
    monkeypatch.setattr(async_compile, "current_target", lambda device: target)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(driver, "_active", triton_worker.TargetOnlyDriver(target))
    cache_hits: list[bool] = []
    monkeypatch.setattr(triton.knobs.compilation, "listener",
                        lambda **kw: cache_hits.append(kw["cache_hit"]))
    with toycomp.config.patch(compile_threads=2):
        count = async_compile.precompile_triton(generated, scheduled, torch.device("cuda", 0))
    assert count == len(generated) >= 2
    assert cache_hits == [True] * count  # compiled by the workers, none here
    assert len(list((tmp_path / "triton").iterdir())) >= count


def test_a_worker_answers_an_error_and_exits_at_the_end_of_its_jobs(tmp_path):
    worker = async_compile._Worker()
    job = (("cuda", 90, 32), str(tmp_path / "missing.py"), "toycomp_missing", "kernel_0", [], {})
    assert "missing.py" in worker.compile(job)
    worker.close()
    assert worker.process.wait(timeout=60) == 0
    assert "exited" in worker.compile(job)


def test_workers_start_with_aot_only_for_cuda_inputs_and_triton(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    started = []
    monkeypatch.setattr(async_compile, "_idle_workers", lambda: started.append(1))
    with FakeTensorMode():  # a CUDA tensor's metadata, on a machine without a GPU
        cuda = torch.empty(2, device="cuda")
    cpu = torch.randn(2)
    with toycomp.config.patch(compile_threads=4):
        async_compile.start_triton_workers([cpu], None)
        async_compile.start_triton_workers([cpu, cuda], "cpp")
        assert started == []
        async_compile.start_triton_workers([cpu, cuda], None)
        async_compile.start_triton_workers([cuda], "triton")
        assert len(started) == 2
        with toycomp.config.patch({"triton.compile_workers": False}):
            async_compile.start_triton_workers([cuda], "triton")
    with toycomp.config.patch(compile_threads=1):
        async_compile.start_triton_workers([cuda], "triton")
    assert len(started) == 2
