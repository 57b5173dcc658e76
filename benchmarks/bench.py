"""Benchmark: eager vs torch.compile (TorchInductor) vs toycomp, measured in one run.

    python benchmarks/bench.py                  # CUDA when a GPU is present, else the CPU
    python benchmarks/bench.py --device cpu     # the CPU rows (C++ backend), CPU-sized inputs
    python benchmarks/bench.py --quick          # tiny sizes, short timings: a smoke run
    python benchmarks/bench.py --json out.json  # also store every figure (date, device, versions)
    python benchmarks/bench.py --models         # torchvision training steps (needs torchvision)
    python benchmarks/bench.py --compile-time   # compile time of 40- to 200-op pointwise chains
    python benchmarks/bench.py --mode reduce-overhead  # both compilers replay CUDA graphs
    python benchmarks/bench.py --autotune       # toycomp autotunes its Triton configs on CUDA

Rows (benchmarks/workloads.py): issue 9's workloads at its sizes on CUDA (sin²+cos² on 16M
floats, bias + GELU, softmax and layer_norm on 8192 x 4096, forward and forward + backward, an
MLP 1024 -> 4096 -> 1024 at batch 8192) and the small ones (the course's MLP training step at
batch 32, a row softmax 8192 x 1000, a column sum 4096 x 4096, sin²+cos² on 4M floats), with
CPU-sized inputs on the CPU. For each row and each of eager, ``torch.compile`` and
``toycomp.compile``:

1. check: one step's outputs and gradients against eager's (fp32: each tensor allclose at rtol
   1e-4 / atol 1e-5, or within 1e-4 of eager relative to its norm); a row that differs is
   marked FAILED and not timed, one that raises is marked error;
2. device time and per-call time, the compilers' steps taking turns in five rounds (the median
   of the rounds; the host's speed drifts; fifteen for a host-bound row: [Note: rounds of a
   host-bound step] in workloads.py), and peak memory (benchmarks/timing.py says how; on
   the CPU the two times are two medians of single calls, so their difference shows how noisy
   the machine was: other processes on a 2-core machine make it very noisy, and
   ``OMP_NUM_THREADS=1`` makes it less so);
3. compile time: toycomp's own (capture to generated source: the first call of a fresh
   ``toycomp.compile`` while its kernel cache and Triton's already hold every kernel, so no
   C++ or Triton compiler runs, less the fastest step) and torch.compile's cold compile (first
   call after ``torch._dynamo.reset()`` with Inductor's caches off, less the fastest step).

The memory-bound rows also show the fraction of the copy-bandwidth floor that toycomp and
torch.compile reach: bytes the step must move (benchmarks/workloads.py, [Note: the
copy-bandwidth floor]) over the device's copy rate measured at the start of the run, divided
by the measured device time; the "copy" column is the same fraction for a plain ``copy_`` that
moves the row's own bytes, the most a kernel of that size can be expected to reach (launch and
the cleared L2 cost every kernel a few microseconds). Ratios are what to read: absolute times
depend on the machine.
This is a measurement, not a test: it prints, and exits non-zero if a row failed its check
or raised.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import warnings
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ modules
import timing  # noqa: E402
from workloads import ROWS, Case, tensor_bytes  # noqa: E402

import toycomp  # noqa: E402
from toycomp.inductor.opt import autotune  # noqa: E402

COMPILERS = ("eager", "torch.compile", "toycomp")
RTOL, ATOL, NORM_TOL = 1e-4, 1e-5, 1e-4


# --- checking ---------------------------------------------------------------------------------
def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (inf when shapes or dtypes differ, nan stays nan)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return math.inf
    diff = (got.double() - want.double()).norm().item()
    return diff / max(want.double().norm().item(), 1e-30)


def agrees(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    """Every tensor allclose to eager's, or within NORM_TOL of it relative to its norm."""
    if len(got) != len(want):
        return False
    return all(
        (g.shape == w.shape and torch.allclose(g, w, rtol=RTOL, atol=ATOL))
        or relative_error(g, w) < NORM_TOL
        for g, w in zip(got, want)
    )


def worst_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    errors = [relative_error(g, w) for g, w in zip(got, want)]
    return max(errors, default=math.inf) if len(got) == len(want) else math.inf


# --- one compiler on one row -------------------------------------------------------------------
MODE: str | None = None  # --mode: torch.compile's and toycomp.compile's mode


def compile_with(compiler: str, fn: Callable) -> Callable:
    if compiler == "torch.compile":
        return torch.compile(fn, mode=MODE)
    if compiler == "toycomp":
        return toycomp.compile(fn, mode=MODE)
    return fn


def first_call(case: Case, compiler: str, device: str) -> tuple[Callable, float | None]:
    """Compile ``case.fn`` and time the first step; torch.compile's is a cold compile."""
    if compiler == "eager":
        return case.fn, None
    if compiler == "torch.compile":
        import torch._inductor.config as inductor_config

        torch._dynamo.reset()
        fn = compile_with(compiler, case.fn)
        with inductor_config.patch(force_disable_caches=True):
            return fn, timing.first_call_seconds(case.step_of(fn), device)
    fn = compile_with(compiler, case.fn)
    return fn, timing.first_call_seconds(case.step_of(fn), device)


def compile_seconds(case: Case, compiler: str, first_s: float | None, fn: Callable, device: str):
    """Compile time: torch.compile's cold first call; for toycomp, a fresh compile's first call
    now that the kernel caches hold every kernel (see the docstring); less the fastest of five
    steps of the compiled ``fn`` (so noise in the step cannot make it negative)."""
    if first_s is None:
        return None
    fastest = min(timing.seconds_of_one_call(case.step_of(fn), device) for _ in range(5))
    if compiler == "toycomp":
        first_s = timing.first_call_seconds(case.step_of(compile_with(compiler, case.fn)), device)
    return max(first_s - fastest, 0.0)


def checked(case: Case, compiler: str, want: list, device: str) -> tuple[dict, Callable | None,
                                                                         float | None]:  # fmt: skip
    """Compile ``case.fn`` and check one step against eager's results: the row's entry so far,
    the compiled function (None when it failed or raised) and its first call's seconds."""
    try:
        fn, first_s = first_call(case, compiler, device)
        got = case.results_of(fn)
    except Exception as e:  # reported in the table: a benchmark row, not a crash of the run
        first_line = (str(e).splitlines() or [""])[0]
        return {"status": "error", "message": f"{type(e).__name__}: {first_line}"}, None, None
    if not agrees(got, want):
        return {"status": "FAILED", "error": worst_error(got, want)}, None, None
    return {"status": "ok", "error": worst_error(got, want)}, fn, first_s


def time_in_turns(case: Case, compiled: dict, results: dict, device: str, budget_s: float):
    """Time the checked compilers' steps, taking turns (``timing.in_turns``): each one's median
    over the rounds, and every round's figure; then peak memory and compile time."""
    steps = {compiler: case.step_of(fn) for compiler, (fn, _) in compiled.items()}
    share = budget_s / timing.ROUNDS  # a round's time; a host-bound row takes more rounds
    device_s = timing.in_turns(steps, lambda step: timing.device_seconds(step, device, share),
                               case.rounds)  # fmt: skip
    call_s = timing.in_turns(steps, lambda step: timing.per_call_seconds(step, device, share),
                             case.rounds)  # fmt: skip
    for compiler, (fn, first_s) in compiled.items():
        out = results[compiler]
        out["device_s"] = statistics.median(device_s[compiler])
        out["call_s"] = statistics.median(call_s[compiler])
        out["device_s_rounds"], out["call_s_rounds"] = device_s[compiler], call_s[compiler]
        out["peak_bytes"] = timing.peak_memory_bytes(steps[compiler], device)
        out["compile_s"] = compile_seconds(case, compiler, first_s, fn, device)


def bench_compiler(case: Case, compiler: str, want: list, device: str, budget_s: float) -> dict:
    """Check one compiler's step against eager's results, then time it (see the docstring)."""
    out, fn, first_s = checked(case, compiler, want, device)
    if fn is not None:
        time_in_turns(case, {compiler: (fn, first_s)}, {compiler: out}, device, budget_s)
    return out


def bench_row(case: Case, device: str, budget_s: float, compilers=COMPILERS) -> dict:
    """Check every compiler's step, then time those that passed, taking turns."""
    want = case.results_of(case.fn)
    row = {"name": case.name, "shape": case.shape, "floor_bytes": case.floor_bytes}
    compiled = {}
    for compiler in compilers:
        row[compiler], fn, first_s = checked(case, compiler, want, device)
        if fn is not None:
            compiled[compiler] = (fn, first_s)
    time_in_turns(case, compiled, row, device, budget_s)
    if case.floor_bytes is not None:  # what a plain copy of the same bytes reaches
        row["copy_s"] = timing.copy_seconds(case.floor_bytes, device, budget_s)
    return row


# --- printing ---------------------------------------------------------------------------------
def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale or unit == "us":
            return f"{seconds / scale:.3g}{unit}"
    return "-"


def cell(result: dict, key: str, fmt: Callable = fmt_time) -> str:
    if result.get("status") != "ok":
        return result.get("status", "-")
    return fmt(result.get(key))


def ratio(row: dict, key: str, a: str = "toycomp", b: str = "torch.compile") -> float | None:
    ra, rb = row.get(a, {}), row.get(b, {})
    if ra.get("status") != "ok" or rb.get("status") != "ok":
        return None
    return ra[key] / rb[key]


def floor_fraction(row: dict, compiler: str, copy_rate: float) -> float | None:
    """The floor over ``compiler``'s device time; ``compiler`` "copy": the same-bytes copy's."""
    if compiler == "copy":
        seconds = row.get("copy_s")
    else:
        result = row.get(compiler, {})
        seconds = result.get("device_s") if result.get("status") == "ok" else None
    if row["floor_bytes"] is None or seconds is None:
        return None
    return row["floor_bytes"] / copy_rate / seconds


def fmt_num(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_times(rows: list[dict], device: str, copy_rate: float) -> None:
    print(f"\n{'row':<27}{'shape':>16}{'eager':>9}{'compile':>9}{'toycomp':>9}  "
          f"{'eager':>8}{'compile':>9}{'toycomp':>9}  {'toy/tc':>7}{'toy/tc':>7}"
          f"{'floor':>7}{'floor':>7}{'floor':>7}")  # fmt: skip
    print(f"{'':<27}{'':>16}{'device time':>27}  {'per-call time':>26}  {'dev':>7}{'call':>7}"
          f"{'toy':>7}{'tc':>7}{'copy':>7}")  # fmt: skip
    for r in rows:
        dev = "".join(f"{cell(r.get(c, {}), 'device_s'):>9}" for c in COMPILERS)
        call = "".join(f"{cell(r.get(c, {}), 'call_s'):>9}" for c in COMPILERS)
        floors = "".join(f"{fmt_num(floor_fraction(r, c, copy_rate)):>7}"
                         for c in ("toycomp", "torch.compile", "copy"))
        print(f"{r['name']:<27}{r['shape']:>16}{dev}  {call[1:]}  "
              f"{fmt_num(ratio(r, 'device_s')):>7}{fmt_num(ratio(r, 'call_s')):>7}{floors}")
    ratios = [x for x in (ratio(r, "device_s") for r in rows) if x]
    if ratios:
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"geometric mean of toycomp / torch.compile device time over {len(ratios)} rows: "
              f"{geomean:.3f}")  # fmt: skip


def print_compile_and_memory(rows: list[dict]) -> None:
    print(f"\n{'row':<27}{'toycomp':>9}{'tc cold':>9}{'ratio':>7}   "
          f"{'peak memory: eager':>19}{'compile':>10}{'toycomp':>10}")  # fmt: skip
    for r in rows:
        peaks = "".join(f"{cell(r.get(c, {}), 'peak_bytes', tensor_bytes):>10}" for c in COMPILERS)
        print(f"{r['name']:<27}{cell(r.get('toycomp', {}), 'compile_s'):>9}"
              f"{cell(r.get('torch.compile', {}), 'compile_s'):>9}"
              f"{fmt_num(ratio(r, 'compile_s'), '.3f'):>7}   {peaks:>39}")  # fmt: skip
    for r in rows:
        for c in COMPILERS:
            if r.get(c, {}).get("status", "ok") != "ok":
                print(f"  {r['name']}, {c}: {problem(r[c])}")


def problem(result: dict) -> str:
    if result["status"] == "FAILED":
        return f"FAILED: differs from eager (worst relative error {result['error']:.1e})"
    return f"{result['status']}: {result.get('message', '')}"


# --- the run ----------------------------------------------------------------------------------
def environment(device: str) -> dict:
    """Date, device and versions, for the stored data file."""
    import triton

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "toycomp_commit": os.environ.get("TOYCOMP_COMMIT") or git_commit(),
        "threads": torch.get_num_threads(),
        "toycomp_autotune": device == "cuda" and autotune.enabled(),
    }


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"{names[0]}, {len(names)} cores" if names else platform.processor()
    except OSError:
        return platform.processor() or "CPU"


def git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "../toycomp"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+uncommitted toycomp/ changes" if dirty else "")  # fmt: skip


def run(device: str, quick: bool, budget_s: float, only, compilers, save: Callable) -> dict:
    """Every row on ``device``; ``save(results)`` after each row (a partial run is kept)."""
    env = environment(device)
    backend = "Triton" if device == "cuda" else "C++"
    tuned = ", autotuned" if env["toycomp_autotune"] else ""
    print(f"{env['device_name']}; toycomp {backend} backend{tuned}, commit "
          f"{env['toycomp_commit']}; torch {env['torch']}, triton {env['triton']}, "
          f"Python {env['python']}")  # fmt: skip
    if device == "cpu":  # other processes make CPU timings noisy: say how busy the machine was
        print(f"{torch.get_num_threads()} threads; load average at the start: "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    copy_rate = timing.copy_bandwidth(device, quick)
    print(f"copy rate (bytes read + written / s): {tensor_bytes(int(copy_rate))}/s")
    rows: list[dict] = []
    results = {**env, "copy_bytes_per_s": copy_rate, "quick": quick, "rows": rows}
    for row in ROWS:
        case = row.case(device, quick)
        if case is None or (only and not any(o in row.name for o in only)):
            continue
        rows.append(bench_row(case, device, budget_s, compilers))
        print(f"  measured {row.name}", file=sys.stderr, flush=True)
        save(results)
        del case
    print_times(rows, device, copy_rate)
    print_compile_and_memory(rows)
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, short timings")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of timed calls per measurement (default 1, quick 0.05)")
    parser.add_argument("--compilers", nargs="+", choices=COMPILERS, default=list(COMPILERS),
                        help="measure only these (eager's results are the reference anyway)")
    parser.add_argument("--only", nargs="+", help="rows whose name contains one of these")
    parser.add_argument("--json", help="write every figure, with date, device and versions")
    parser.add_argument("--models", action="store_true",
                        help="torchvision training steps instead (benchmarks/models.py)")
    parser.add_argument("--compile-time", action="store_true",
                        help="compile time of pointwise chains instead (benchmarks/chains.py)")
    parser.add_argument("--tf32", action="store_true",
                        help="--models: keep PyTorch's TF32 settings (default: TF32 off)")
    parser.add_argument("--mode", choices=["default", "reduce-overhead"], default=None,
                        help="passed to torch.compile and toycomp.compile (CUDA graphs)")
    parser.add_argument("--autotune", action="store_true",
                        help="toycomp autotunes its Triton configs (TOYCOMP_AUTOTUNE=1)")
    parser.add_argument("--timeout", type=float, default=500.0,
                        help="--models: seconds all compilers' processes may run together")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    global MODE
    MODE = args.mode
    if args.autotune:  # (read when kernels load; the --models processes inherit it)
        os.environ["TOYCOMP_AUTOTUNE"] = "1"
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def save(results: dict) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    warnings.filterwarnings("ignore", message=".*TensorFloat32.*")
    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
    if args.models:
        import models

        results = models.run_models(device, args.quick, args.timeout, args.tf32)
        results = {**environment(device), **results}
    elif args.compile_time:
        import chains

        results = {"device": device, "chains": chains.compile_times(device=device)}
    else:
        budget = args.budget or (0.05 if args.quick else 1.0)
        results = run(device, args.quick, budget, args.only, args.compilers, save)
    save(results)
    failed = [r["name"] for r in results.get("rows", []) for c in COMPILERS
              if r.get(c, {}).get("status") not in (None, "ok")]  # fmt: skip
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
