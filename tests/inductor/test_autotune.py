"""Autotuning of Triton launch configs (toycomp/inductor/opt/autotune.py, [Note: autotuning]; the
candidates: [Note: autotuning candidates] in codegen/triton_heuristics.py).

On the CPU the kernels run in Triton's interpreter, which never autotunes; here an ``Autotuner``
is put around interpreted kernels by hand, with a stand-in timer, to check what it launches,
that its timing runs change no result (eager is the oracle), and its cache. The CUDA tests
(the real timer, lean launches) need the lent GPU.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import toycomp
from toycomp._triton_compat import InterpretedKernel
from toycomp.inductor import cache
from toycomp.inductor.opt import autotune
from toycomp.inductor.opt.autotune import Autotuner
from toycomp.inductor.codegen import triton as triton_codegen
from toycomp.inductor.codegen.triton_heuristics import (
    BLOCK_ELEMENTS,
    block_sizes,
    candidate_configs,
    index_dtype,
    kernel_hint,
    next_power_of_2,
)
from toycomp.inductor.opt.split_reduction import ReductionHint

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def fresh_choices(tmp_path, monkeypatch):
    """Each test: its own kernel cache, and no choice remembered from another test."""
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_CHOSEN", {})
    monkeypatch.delenv("TOYCOMP_AUTOTUNE", raising=False)


class Timer:
    """A stand-in for ``autotune.benchmark``: runs the launch ``runs`` times (as do_bench does,
    many times) and says config ``fastest`` took 1 ms, the others 2 ms."""

    def __init__(self, fastest: int = 0, runs: int = 3, failing: int | None = None) -> None:
        self.fastest, self.runs, self.failing, self.calls = fastest, runs, failing, 0

    def __call__(self, fn) -> float:
        index, self.calls = self.calls, self.calls + 1
        if index == self.failing:
            raise RuntimeError("out of resources")
        for _ in range(self.runs):
            fn()
        return 1.0 if index == self.fastest else 2.0


# --- the candidates ---------------------------------------------------------------------------
def softmax_rows(x):
    return torch.softmax(x, dim=-1)


def column_sum(x):
    return x.sum(dim=0)


def sin2_cos2(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


# (function, input size, the kind of its first kernel)
CASES = {
    "pointwise": (sin2_cos2, (1 << 17,)),
    "persistent": (softmax_rows, (128, 1000)),
    "looped": (softmax_rows, (16, 5000)),
    "outer": (column_sum, (2048, 64)),
}


def kind(kernel) -> str:
    blocks = block_sizes(kernel)
    if "RBLOCK" not in blocks:
        return "pointwise"
    if kernel_hint(kernel) == ReductionHint.OUTER:
        return "outer"
    return "persistent" if blocks["RBLOCK"] >= kernel.rnumel else "looped"


def explained(case: str):
    """The forward graph's artefacts for ``CASES[case]`` on the Triton backend (CPU tensors)."""
    fn, size = CASES[case]
    torch.manual_seed(0)
    x = torch.randn(size)
    return fn, x, toycomp.explain(fn, x, backend="triton").graph("forward")


@pytest.mark.parametrize("cuda", [False, True], ids=["interpreter", "cuda"])
@pytest.mark.parametrize("case", CASES)
def test_candidates_are_sane_and_start_with_the_fixed_config(case, cuda):
    _, _, graph = explained(case)
    kernels = [k for k in graph.scheduled.steps if hasattr(k, "loops")]
    assert kind(kernels[0]) == case  # the case covers the kind it is named after
    for kernel in kernels:
        fixed = block_sizes(kernel, cuda)
        configs = candidate_configs(kernel, fixed)
        assert configs[0] == fixed
        assert len(configs) <= 6 and len({tuple(c.items()) for c in configs}) == len(configs)
        if kernel is kernels[0]:
            assert len(configs) >= 3, configs
        persistent = fixed.get("RBLOCK", 0) >= kernel.rnumel
        int64 = index_dtype(kernel, fixed, "RBLOCK" in fixed)
        for c in configs:
            xblock, rblock, warps = c["XBLOCK"], c.get("RBLOCK", 1), c["num_warps"]
            assert c.keys() == fixed.keys()
            assert all(next_power_of_2(v) == v for v in (xblock, rblock, warps))
            assert xblock <= next_power_of_2(kernel.numel)
            assert rblock <= max(1, next_power_of_2(kernel.rnumel))
            assert xblock * rblock <= BLOCK_ELEMENTS and 1 <= warps <= 16
            assert warps * 32 <= max(32, xblock * rblock)  # no thread without an element
            if "RBLOCK" in c:  # the source is persistent or looped: every candidate agrees
                assert (rblock >= kernel.rnumel) == persistent
            assert index_dtype(kernel, c, "RBLOCK" in c) == int64


def test_gpu_pointwise_blocks_give_each_thread_four_floats():
    """[Note: four floats a thread]: one 16-byte load a thread on CUDA; the interpreter, which
    pays per program, keeps blocks twice as large; the other remains a candidate."""
    _, x, graph = explained("pointwise")
    kernel = graph.scheduled.steps[0]
    gpu, interpreted = block_sizes(kernel, cuda=True), block_sizes(kernel)
    assert gpu["XBLOCK"] == 4 * 32 * gpu["num_warps"] and gpu["num_warps"] >= 4
    assert interpreted["XBLOCK"] == 2 * gpu["XBLOCK"]
    assert interpreted in candidate_configs(kernel, gpu)[1:]
    call = triton_codegen.generate(kernel, cuda=True).call
    grid = -(-x.numel() // gpu["XBLOCK"])
    assert call.startswith(f"kernel_0.run(stream0, ({grid},), ")
    assert call.endswith(f"XBLOCK={gpu['XBLOCK']}, num_warps={gpu['num_warps']})")
    tiny = type(kernel)(kernel.name, 100, 1, kernel.loops, kernel.buffer_dtypes, kernel.origins)
    assert block_sizes(tiny, cuda=True) == {"XBLOCK": 128, "num_warps": 1}  # 4 floats a thread


@pytest.mark.parametrize("rnumel", [197, 1000, 4096])
def test_gpu_persistent_rows_hold_half_the_interpreters_elements(rnumel):
    """[Note: rows per program on CUDA]: 2048 elements a program at 16 a thread, rows of 4096
    one a program; the interpreter's larger blocks stay a candidate; a symbolic rnumel's
    wrapper asks for the CUDA rule too."""
    x = torch.randn(max(64, 2**17 // rnumel), rnumel)  # enough to be worth autotuning
    graph = toycomp.explain(softmax_rows, x, backend="triton").graph("forward")
    kernel = graph.scheduled.steps[0]
    gpu, interpreted = block_sizes(kernel, cuda=True), block_sizes(kernel)
    assert gpu["RBLOCK"] == interpreted["RBLOCK"] == next_power_of_2(rnumel)
    assert gpu["XBLOCK"] == max(1, interpreted["XBLOCK"] // 2)
    assert gpu["XBLOCK"] * gpu["RBLOCK"] == max(2048, gpu["RBLOCK"])
    assert gpu["XBLOCK"] * gpu["RBLOCK"] == 16 * 32 * gpu["num_warps"]
    assert interpreted in candidate_configs(kernel, gpu)
    dynamic = toycomp.explain(softmax_rows, x, backend="triton", dynamic=True)
    kernel = dynamic.graph("forward").scheduled.steps[0]
    assert "cuda=True)" in triton_codegen.generate(kernel, cuda=True).call
    assert "cuda=True" not in triton_codegen.generate(kernel).call


def test_small_and_symbolic_kernels_keep_their_fixed_config():
    _, _, graph = explained("pointwise")
    kernel = graph.scheduled.steps[0]
    small = type(kernel)(kernel.name, 4096, 1, kernel.loops, kernel.buffer_dtypes, kernel.origins)
    assert candidate_configs(small) == [block_sizes(small)]
    x = torch.randn(8, 300)
    explanation = toycomp.explain(softmax_rows, x, backend="triton", dynamic=True)
    kernels = [k for g in explanation.entries[0].graphs for k in g.compiled.kernels]
    assert kernels and "kernel_0_looped" in kernels[0].source  # a symbolic rnumel
    assert all(len(k.configs) <= 1 for k in kernels)


def with_autotuner(compiled, make_timer) -> list[Autotuner]:
    """Put an ``Autotuner`` (timed by ``make_timer()``) around each kernel of ``compiled`` (a
    ``CompiledGraph`` on CPU tensors) that has several candidates, as CUDA's ``load`` does."""
    namespace = compiled.fn.__globals__
    tuners = []
    for g in compiled.kernels:
        if len(g.configs) > 1:
            jit_fn = getattr(cache.load_python_module(g.source, "triton"), g.name)
            launcher = namespace[g.name]
            while isinstance(launcher, Autotuner):  # (one put there by a previous call)
                launcher = launcher.launcher
            tuner = Autotuner(launcher, jit_fn.arg_names, g.configs, g.source, g.name,
                              timer=make_timer(), disk=False)  # fmt: skip
            namespace[g.name] = tuner
            tuners.append(tuner)
    return tuners


@pytest.mark.parametrize("case", CASES)
def test_every_candidate_computes_eagers_result(case):
    """Each candidate chosen in turn (the grid follows its XBLOCK): eager's values."""
    fn, x, graph = explained(case)
    count = max(len(g.configs) for g in graph.compiled.kernels)
    for fastest in range(count):
        autotune._CHOSEN.clear()
        tuners = with_autotuner(graph.compiled, lambda: Timer(fastest, runs=0))
        x = torch.randn(x.shape)  # new values: a stale output buffer cannot pass
        (got,) = graph.compiled([x])
        torch.testing.assert_close(got, fn(x), rtol=1e-4, atol=1e-5)
        for t in tuners:  # (a kernel with fewer candidates keeps its first)
            want = t.configs[fastest] if fastest < len(t.configs) else t.configs[0]
            assert [meta for _, meta in t.chosen.values()] == [want]


# --- the interpreter ----------------------------------------------------------------------------
def test_the_interpreter_launches_only_the_fixed_config(monkeypatch):
    def no_timing(*args, **kwargs):
        raise AssertionError("the interpreter must not autotune")

    monkeypatch.setattr(Autotuner, "choose", no_timing)
    fn, x, graph = explained("persistent")
    generated = graph.compiled.kernels
    assert any(len(g.configs) > 1 for g in generated)  # (there is something it could time)
    for g in generated:
        loaded = graph.compiled.fn.__globals__[g.name]
        assert isinstance(loaded, InterpretedKernel)
        assert isinstance(triton_codegen.load(g, torch.device("cpu")), InterpretedKernel)
        meta = ", ".join(f"{k}={v}" for k, v in g.configs[0].items())
        assert g.call.endswith(f"{meta})")  # the wrapper's line: the fixed config
    (got,) = graph.compiled([x])
    torch.testing.assert_close(got, fn(x))


def test_autotuned_wraps_only_kernels_with_a_choice(monkeypatch):
    _, _, graph = explained("pointwise")
    (g,) = graph.compiled.kernels
    jit_fn = getattr(cache.load_python_module(g.source, "triton"), g.name)
    launcher = object()
    assert autotune.autotuned(launcher, jit_fn, g) is launcher  # not asked for
    with autotune.requested(True):  # mode="max-autotune"
        assert isinstance(autotune.autotuned(launcher, jit_fn, g), Autotuner)
        one = type(g)(g.name, g.backend, g.source, g.origins, g.call, configs=g.configs[:1])
        assert autotune.autotuned(launcher, jit_fn, one) is launcher
        monkeypatch.setenv("TOYCOMP_AUTOTUNE", "0")
        assert autotune.autotuned(launcher, jit_fn, g) is launcher
    monkeypatch.setenv("TOYCOMP_AUTOTUNE", "1")
    assert isinstance(autotune.autotuned(launcher, jit_fn, g), Autotuner)


def test_max_autotune_mode_asks_for_autotuning(monkeypatch):
    # kernels load (and are wrapped, on CUDA) while stage 4 compiles: record what it is told
    import toycomp.pipeline as pipeline

    seen, real = [], pipeline.compile_graph
    monkeypatch.setattr(pipeline, "compile_graph",
                        lambda *a: seen.append(autotune.enabled()) or real(*a))
    for mode in (None, "max-autotune"):
        toycomp.compile(lambda x: x.sin() * 2, mode=mode)(torch.randn(1000))
    assert seen == [False, True] and not autotune.enabled()


# --- choosing -----------------------------------------------------------------------------------
@triton.jit
def accumulate(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    """out += in: a kernel that reads the buffer it writes."""
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    total = tl.load(out_ptr0 + xindex, xmask) + tl.load(in_ptr0 + xindex, xmask)
    tl.store(out_ptr0 + xindex, total, xmask)


CONFIGS = ({"XBLOCK": 64, "num_warps": 2}, {"XBLOCK": 256, "num_warps": 4},
           {"XBLOCK": 32, "num_warps": 1})  # fmt: skip


class Recorder:
    """A launcher that runs ``accumulate`` in the interpreter and records each launch."""

    def __init__(self) -> None:
        self.kernel, self.launches = InterpretedKernel(accumulate), []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.launches.append((grid, meta))
            self.kernel[grid](*args, **meta)

        return launch


def accumulate_tuner(timer, source: str = "accumulate v1", name: str = "accumulate", **kw):
    return Autotuner(Recorder(), accumulate.arg_names, CONFIGS, source, name, timer=timer, **kw)


@pytest.mark.parametrize("fastest", [0, 1, 2])
def test_the_fastest_config_is_launched_over_its_own_grid(fastest):
    timer = Timer(fastest)
    tuner = accumulate_tuner(timer, disk=False)
    a, out = torch.randn(1000), torch.zeros(1000)
    for _ in range(2):
        tuner[(16,)](a, out, 1000, **CONFIGS[0])  # the wrapper's line names config 0
    assert timer.calls == 3  # timed once, at the first launch
    xblock = CONFIGS[fastest]["XBLOCK"]
    assert tuner.launcher.launches[-2:] == [((-(-1000 // xblock),), CONFIGS[fastest])] * 2
    torch.testing.assert_close(out, 2 * a)


def test_a_config_that_fails_is_not_chosen():
    tuner = accumulate_tuner(Timer(fastest=1, failing=1), disk=False)
    a, out = torch.randn(1000), torch.zeros(1000)
    tuner[(16,)](a, out, 1000, **CONFIGS[0])
    assert tuner.launcher.launches[-1][1] == CONFIGS[0]  # 2 ms; config 1 raised, config 2: 2 ms
    torch.testing.assert_close(out, a)


def test_the_fixed_config_stays_unless_another_is_clearly_faster():
    assert autotune.fastest([1.0, 0.99, 2.0]) == 0  # 1%: noise
    assert autotune.fastest([1.0, 0.97, 0.95]) == 2
    assert autotune.fastest([float("inf"), 3.0, 2.0]) == 2  # the fixed one failed


def test_timing_runs_leave_written_buffers_as_eager_does():
    """The timed launches write copies: ``out += a`` happens once, as in eager."""
    tuner = accumulate_tuner(Timer(fastest=2, runs=4), disk=False)
    a, out = torch.randn(1000), torch.randn(1000)
    want = out + a
    storage = out.untyped_storage().data_ptr()
    tuner[(16,)](a, out, 1000, **CONFIGS[0])
    assert len(tuner.launcher.launches) == 3 * 4 + 1  # the timing did run the kernel
    torch.testing.assert_close(out, want)
    assert out.untyped_storage().data_ptr() == storage


def test_a_view_is_copied_with_its_layout():
    base = torch.arange(40.0)
    view = base[3:].as_strided((4, 5), (8, 1), 3)
    copy = autotune.clone_storage(view)
    assert copy.storage_offset() == 3 and copy.stride() == (8, 1)
    assert torch.equal(copy, view) and copy.data_ptr() != view.data_ptr()
    copy.fill_(-1)
    assert torch.equal(base, torch.arange(40.0))


def test_graph_with_a_buffer_reused_in_place_matches_eager():
    """The matmul's buffer is overwritten in place by the kernel that reads it ([Note: memory
    planning]): timing that kernel must not apply ``* 2 + 1`` more than once."""
    def f(a, w):
        return torch.tanh(a @ w) * 2 + 1

    torch.manual_seed(0)
    a, w = torch.randn(128, 64), torch.randn(64, 512)
    graph = toycomp.explain(f, a, w, backend="triton").graph("forward")
    assert "reuse in place" in graph.compiled.wrapper_source
    tuners = with_autotuner(graph.compiled, lambda: Timer(fastest=1, runs=2))
    (got,) = graph.compiled([a, w])
    assert tuners and all(t.chosen for t in tuners)
    torch.testing.assert_close(got, f(a, w), rtol=1e-4, atol=1e-5)


def test_a_capture_launches_the_fixed_config(monkeypatch):
    monkeypatch.setattr(autotune, "_capturing", lambda args: True)
    timer = Timer(fastest=1)
    tuner = accumulate_tuner(timer, disk=False)
    a, out = torch.randn(100), torch.zeros(100)
    tuner[(2,)](a, out, 100, **CONFIGS[0])
    assert timer.calls == 0 and tuner.launcher.launches == [((2,), CONFIGS[0])]
    assert not tuner.chosen


# --- the cache ----------------------------------------------------------------------------------
def first_launch(tuner, n: int = 1000, dtype=torch.float32) -> dict:
    a, out = torch.ones(n, dtype=dtype), torch.zeros(n, dtype=dtype)
    tuner[(1,)](a, out, n, **CONFIGS[0])
    return tuner.launcher.launches[-1][1]


def never(fn):
    raise AssertionError("timed although the choice was cached")


def test_the_choice_is_reused_from_memory_then_from_disk(tmp_path, monkeypatch):
    assert first_launch(accumulate_tuner(Timer(fastest=2))) == CONFIGS[2]
    assert first_launch(accumulate_tuner(never)) == CONFIGS[2]  # this process: memory
    files = list((tmp_path / "cache" / "autotune").glob("*.json"))
    assert len(files) == 1 and stat_mode(files[0]) & 0o077 == 0
    record = json.loads(files[0].read_text())
    assert record["config"] == CONFIGS[2] and record["timings_ms"] == [2.0, 2.0, 1.0]
    monkeypatch.setattr(autotune, "_CHOSEN", {})  # another process: the disk
    assert first_launch(accumulate_tuner(never)) == CONFIGS[2]


def stat_mode(path) -> int:
    return os.stat(path).st_mode & 0o777


@pytest.mark.parametrize("change", ["source", "name", "device", "triton", "size", "dtype"])
def test_the_key_covers_what_the_choice_depends_on(change, monkeypatch):
    first_launch(accumulate_tuner(Timer(fastest=2)))
    monkeypatch.setattr(autotune, "_CHOSEN", {})
    kwargs, n, dtype = {}, 1000, torch.float32
    if change == "source":
        kwargs["source"] = "accumulate v2"
    elif change == "name":
        kwargs["name"] = "accumulate_2"
    elif change == "device":
        monkeypatch.setattr(autotune, "device_name", lambda device: "Another GPU")
    elif change == "triton":
        monkeypatch.setattr(triton, "__version__", "0.0.1")
    elif change == "size":
        n = 999
    else:
        dtype = torch.float64
    timer = Timer(fastest=1)
    assert first_launch(accumulate_tuner(timer, **kwargs), n, dtype) == CONFIGS[1]  # a miss
    assert timer.calls == 3


def test_a_record_is_accepted_only_if_ours_and_among_the_candidates(tmp_path, monkeypatch):
    first_launch(accumulate_tuner(Timer(fastest=2)))
    (path,) = (tmp_path / "cache" / "autotune").glob("*.json")
    record = json.loads(path.read_text())
    for tampered in ({**record, "config": {"XBLOCK": 4096, "num_warps": 4}},  # not a candidate
                     {**record, "key": {**record["key"], "device": "Another GPU"}},
                     "not a record"):  # fmt: skip
        path.write_text(json.dumps(tampered))
        monkeypatch.setattr(autotune, "_CHOSEN", {})
        timer = Timer(fastest=1)
        assert first_launch(accumulate_tuner(timer)) == CONFIGS[1] and timer.calls == 3
    path.write_text(json.dumps(record))
    os.chmod(path, 0o666)  # a file others may write is not trusted
    monkeypatch.setattr(autotune, "_CHOSEN", {})
    timer = Timer(fastest=0)
    assert first_launch(accumulate_tuner(timer)) == CONFIGS[0] and timer.calls == 3


def test_an_unsafe_cache_directory_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o777)
    with pytest.raises(cache.CacheDirError):
        first_launch(accumulate_tuner(Timer()))


# --- CUDA ---------------------------------------------------------------------------------------
@CUDA
@pytest.mark.parametrize("case", CASES)
def test_autotuned_kernels_on_cuda_match_eager(case):
    fn, size = CASES[case]
    x = torch.randn(size, device="cuda")
    compiled = toycomp.compile(fn, backend="triton", mode="max-autotune")
    for _ in range(2):
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-5)
    assert autotune._CHOSEN  # something was timed and chosen


@CUDA
def test_autotuned_training_step_on_cuda_matches_eager():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024)]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 64)).cuda()

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    x, y = torch.randn(512, 256, device="cuda"), torch.randint(0, 64, (512,), device="cuda")
    want = step(x, y).detach()
    want_grads = [p.grad.clone() for p in model.parameters()]
    compiled = toycomp.compile(step, backend="triton", mode="max-autotune")
    for _ in range(2):
        model.zero_grad()
        torch.testing.assert_close(compiled(x, y), want, rtol=1e-4, atol=1e-5)
        for p, g in zip(model.parameters(), want_grads):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)
    assert autotune._CHOSEN


@CUDA
def test_an_input_mutated_in_place_on_cuda_is_updated_once():
    def f(x, y):
        x.mul_(2).add_(y)
        return x.sum(dim=0)

    x, y = torch.randn(4096, 256, device="cuda"), torch.randn(4096, 256, device="cuda")
    want_x = x.clone()
    want = f(want_x, y)
    got_x = x.clone()
    got = toycomp.compile(f, backend="triton")(got_x, y)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_x, want_x)
