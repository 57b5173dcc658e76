"""benchmarks/bench.py runs, and its correctness check can fail (no timing is asserted).

The smoke run is ``bench.py --quick --device cpu`` (tiny sizes, short timings) for eager and
toycomp; torch.compile's path is run in-process on one row (an Inductor compile per row would
make the smoke run minutes long on a 2-core machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench  # noqa: E402
from workloads import ROWS, row_named  # noqa: E402


def test_quick_run_on_cpu_checks_every_row(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(BENCHMARKS / "bench.py"), "--quick", "--device", "cpu",
           "--compilers", "eager", "toycomp", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["torch"] == torch.__version__
    names = [r["name"] for r in data["rows"]]
    assert names == [r.name for r in ROWS if r.sizes["quick"] is not None]
    for row in data["rows"]:
        for compiler in ("eager", "toycomp"):
            result = row[compiler]
            assert result["status"] == "ok", (row["name"], compiler, result)
            assert result["device_s"] > 0 and result["peak_bytes"] >= 0
        assert row["toycomp"]["compile_s"] is not None
    assert "geometric mean" not in proc.stdout  # no torch.compile column to divide by


def test_torch_compile_row():
    case = row_named("row softmax").case("cpu", quick=True)
    result = bench.bench_row(case, "cpu", 0.01, compilers=("torch.compile",))["torch.compile"]
    assert result["status"] == "ok", result
    assert result["compile_s"] is not None and result["call_s"] > 0


@pytest.mark.parametrize("name", ["softmax fwd+bwd", "course MLP train step"])
def test_a_wrong_result_is_failed_not_timed(name):
    case = row_named(name).case("cpu", quick=True)
    want = case.results_of(case.fn)
    want[-1] = want[-1] * 1.01  # one gradient (or the output) 1% off
    result = bench.bench_compiler(case, "eager", want, "cpu", 0.01)
    assert result["status"] == "FAILED" and "device_s" not in result
    assert 1e-3 < result["error"] < 1e-1


def test_an_error_is_reported_not_raised(monkeypatch):
    case = row_named("column sum").case("cpu", quick=True)

    def broken(compiler, fn):
        raise NotImplementedError("toycomp: no lowering for aten.frobnicate")

    monkeypatch.setattr(bench, "compile_with", broken)
    result = bench.bench_compiler(case, "toycomp", case.results_of(case.fn), "cpu", 0.01)
    assert result == {"status": "error",
                      "message": "NotImplementedError: toycomp: no lowering for aten.frobnicate"}


def test_models_check_tells_rounding_from_a_wrong_result():
    import models

    torch.manual_seed(0)
    exact = torch.randn(1000, dtype=torch.float64)
    want64 = (torch.tensor(2.0, dtype=torch.float64), {"bias": exact})
    eager = (torch.tensor(2.0), {"bias": (exact * (1 + 1e-3 * torch.randn(1000))).float()})
    rounding = (torch.tensor(2.0), {"bias": (exact * (1 + 2e-3 * torch.randn(1000))).float()})
    wrong = (torch.tensor(2.0), {"bias": exact.float() * 1.05})
    assert models.rounding_mismatch(eager, eager, want64) is None
    assert models.rounding_mismatch(rounding, eager, want64) is None
    assert "bias" in models.rounding_mismatch(wrong, eager, want64)


def test_models_check_takes_inductors_rounding_where_eager_is_far_more_exact():
    """cuDNN's BatchNorm bias gradient: eager's error 1e-7, Inductor's and toycomp's ~2e-3."""
    import models

    def off_by(exact, rel, seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.tensor(2.0), {"bias": (exact * (1 + rel * torch.randn(1000, generator=g,
                                                    dtype=torch.float64))).float()})  # fmt: skip

    exact = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want64 = (torch.tensor(2.0, dtype=torch.float64), {"bias": exact})
    eager, inductor, ours = off_by(exact, 1e-7, 1), off_by(exact, 2e-3, 2), off_by(exact, 2e-3, 3)
    assert "bias" in models.rounding_mismatch(ours, eager, want64)  # alone: 10x eager's + 1e-4
    assert models.rounding_mismatch(ours, eager, want64, peer=inductor) is None
    worse = off_by(exact, 6e-3, 3)  # three times Inductor's error
    assert "bias" in models.rounding_mismatch(worse, eager, want64, peer=inductor)
    wrong_peer, wrong = off_by(exact, 3e-2, 2), off_by(exact, 3e-2, 3)  # both wrong: no excuse
    assert "bias" in models.rounding_mismatch(wrong, eager, want64, peer=wrong_peer)


def test_compared_steps_take_turns(monkeypatch):
    import timing

    order = []
    monkeypatch.setattr(timing, "per_call_seconds",
                        lambda step, device, budget: order.append(step()) or 1.0)  # fmt: skip
    steps = {name: (lambda name=name: name) for name in ("eager", "a", "b")}
    seconds = timing.per_call_seconds_in_turns(steps, "cpu", 1.0, rounds=4)
    assert seconds == {name: [1.0] * 4 for name in steps}
    assert order == ["eager", "a", "b", "a", "b", "eager", "b", "eager", "a", "eager", "a", "b"]


def test_a_rows_compilers_are_checked_then_take_turns(monkeypatch):
    """``bench_row`` checks every compiler first, then times the steps in rounds, each round
    starting with the next compiler, for device time and for per-call time; then a copy that
    moves the row's floor bytes."""
    import timing

    case = row_named("column sum").case("cpu", quick=True)
    called = []

    def first_call(case, compiler, device):
        return (lambda *args: called.append(compiler) or case.fn(*args)), None

    def measure(step, device, budget):
        called.clear()
        step()
        timed.append(called[0] if called else "a copy of the row's bytes")
        return 1.0

    timed = []
    monkeypatch.setattr(bench, "first_call", first_call)
    monkeypatch.setattr(timing, "device_seconds", measure)
    monkeypatch.setattr(timing, "per_call_seconds", measure)
    row = bench.bench_row(case, "cpu", 0.01)
    turns = ["eager", "torch.compile", "toycomp", "torch.compile", "toycomp", "eager", "toycomp",
             "eager", "torch.compile", "eager", "torch.compile", "toycomp", "torch.compile",
             "toycomp", "eager"]  # fmt: skip
    # device time's rounds, then per-call time's, then the copy of the floor's bytes
    assert timed == turns * 2 + ["a copy of the row's bytes"]
    assert row["copy_s"] == 1.0
    for compiler in bench.COMPILERS:
        assert row[compiler]["device_s_rounds"] == [1.0] * timing.ROUNDS


def test_a_host_bound_row_takes_more_rounds_of_the_same_length(monkeypatch):
    """The course MLP row ([Note: rounds of a host-bound step]): HOST_BOUND_ROUNDS rounds of
    device time and of per-call time for each compiler, each given a round's usual budget."""
    import timing

    from workloads import HOST_BOUND_ROUNDS

    case = row_named("course MLP train step").case("cpu", quick=True)
    budgets = []

    def measure(step, device, budget):
        budgets.append(budget)
        return 1.0

    monkeypatch.setattr(timing, "device_seconds", measure)
    monkeypatch.setattr(timing, "per_call_seconds", measure)
    row = bench.bench_row(case, "cpu", 0.5)
    assert case.rounds == HOST_BOUND_ROUNDS > timing.ROUNDS
    assert budgets == [0.5 / timing.ROUNDS] * (2 * HOST_BOUND_ROUNDS * len(bench.COMPILERS))
    for compiler in bench.COMPILERS:
        assert len(row[compiler]["call_s_rounds"]) == HOST_BOUND_ROUNDS


def test_a_models_steps_are_checked_then_timed_in_one_process(monkeypatch):
    """``models.time_model`` without torchvision: a small convolutional net stands in."""
    import models

    def build(name, device, dtype=torch.float32, train=False):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=16), torch.nn.ReLU(),
                                  torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                  torch.nn.Linear(4, 1000))  # fmt: skip
        return net.to(device, dtype).train(train)

    compile_model = models.compile_model

    def compile_or_break(model, compiler):
        if compiler == "broken":
            raise NotImplementedError("no lowering for aten.frobnicate")
        if compiler == "wrong":  # 1% off: more than rounding
            return lambda x: model(x) * 1.01
        return compile_model(model, compiler)

    monkeypatch.setattr(models, "build", build)
    monkeypatch.setattr(models, "compile_model", compile_or_break)
    results = models.time_model("net", ["toycomp", "broken", "wrong"], 2, "cpu", 0.05)
    by = {r["compiler"]: r for r in results}
    assert by["toycomp"]["status"] == "ok" and len(by["toycomp"]["compiled"]["call_s_rounds"]) == 5
    assert by["toycomp"]["eager"]["call_s"] > 0
    assert by["broken"] == {"model": "net", "batch": 2, "compiler": "broken", "status": "error",
                            "message": "NotImplementedError: no lowering for aten.frobnicate"}
    assert by["wrong"]["status"] == "FAILED"


def test_floor_fractions_of_the_compilers_and_of_the_same_bytes_copy():
    """The floor (bytes over the large copy's rate) over each measured time; none where a
    compiler's step failed its check or the row has no floor."""
    row = {"floor_bytes": 800, "toycomp": {"status": "ok", "device_s": 4.0},
           "torch.compile": {"status": "FAILED"}, "copy_s": 2.5}  # fmt: skip
    assert bench.floor_fraction(row, "toycomp", copy_rate=100.0) == 2.0
    assert bench.floor_fraction(row, "copy", copy_rate=100.0) == 3.2
    assert bench.floor_fraction(row, "torch.compile", copy_rate=100.0) is None
    assert bench.floor_fraction({**row, "floor_bytes": None}, "copy", 100.0) is None
