"""The optimisation ladder on a few examples: each pass switched on in turn, timed in one run.

    python benchmarks/ladder.py --device cuda --json benchmarks/results/DATE-CARD-ladder.json
    python benchmarks/ladder.py --device cpu --quick

For each example, ``toycomp.inductor.opt.ladder.ladder`` compiles the rungs from the ``teach``
preset to ``fast`` (one more pass a rung) and reports each rung's generated code and kernels;
then every rung, eager and ``torch.compile`` are timed taking turns in this process
(``timing.per_call_seconds_in_turns``: wall time per call, synchronised on CUDA), forward and
backward. Each rung's values are checked against eager's first. Notebook 04 reads the stored GPU
run as its second ladder table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ modules
import timing  # noqa: E402

import toycomp  # noqa: E402
from toycomp.inductor.opt.ladder import ladder  # noqa: E402


def sin2_cos2(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def softmax(x):
    return torch.softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def total_sum(x):
    return x.sum()


def examples(device: str, quick: bool):
    """name -> (function, inputs): a pointwise chain, a row reduction, a layer norm (whose
    backward sums over rows and columns: the mix-order reduction) and a full sum (a split one)."""
    n, rows, cols = (1 << 16, 256, 512) if quick else (1 << 24, 8192, 1024)

    def make(*shape):
        return torch.randn(*shape, device=device, requires_grad=True)

    return {
        f"sin(x)**2 + cos(x)**2, {n} floats": (sin2_cos2, (make(n),)),
        f"softmax [{rows}, {cols}]": (softmax, (make(rows, cols),)),
        f"layer_norm [{rows}, {cols}]": (layer_norm, (make(rows, cols), make(cols), make(cols))),
        f"sum of {n} floats": (total_sum, (make(n),)),
    }


def step_of(fn, inputs):
    def step():
        out = fn(*inputs)
        out.sum().backward() if out.dim() else out.backward()
    return step


def run_example(name, fn, inputs, backend, device, budget_s):
    rungs = ladder(fn, *inputs, backend=backend, repeat=1)
    want = fn(*inputs)
    steps = {"eager": step_of(fn, inputs)}
    rows = []
    for r in rungs:
        compiled = toycomp.compile(fn, backend=backend, options=r.flags)
        got = compiled(*inputs)
        ok = torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        rows.append({"rung": r.name, "code_lines": r.code_lines, "kernels": r.kernels,
                     "allclose": ok})
        if ok:
            steps[r.name] = step_of(compiled, inputs)
    torch._dynamo.reset()
    steps["torch.compile"] = step_of(torch.compile(fn), inputs)
    steps["torch.compile"]()  # compiles
    calls = timing.per_call_seconds_in_turns(steps, device, budget_s * len(steps))
    ms = {k: statistics.median(v) * 1e3 for k, v in calls.items()}
    for row in rows:
        row["ms"] = ms.get(row["rung"])
    return {"example": name, "eager_ms": ms["eager"], "torch.compile_ms": ms["torch.compile"],
            "rungs": rows}


def print_example(result):
    print(f"\n{result['example']}: forward + backward, ms per call "
          f"(eager {result['eager_ms']:.3f}, torch.compile {result['torch.compile_ms']:.3f})")
    print(f"  {'rung':30}{'code lines':>11}{'kernels':>9}{'ms':>10}{'x teach':>9}"
          f"{'/ torch.compile':>17}")
    first = result["rungs"][0]["ms"]
    for r in result["rungs"]:
        if r["ms"] is None:
            print(f"  {r['rung']:30}{r['code_lines']:>11}{r['kernels']:>9}   values differ!")
            continue
        print(f"  {r['rung']:30}{r['code_lines']:>11}{r['kernels']:>9}{r['ms']:>10.3f}"
              f"{first / r['ms']:>9.2f}{r['ms'] / result['torch.compile_ms']:>17.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small inputs, short timings")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of calls a step")
    parser.add_argument("--json", help="store the results here")
    args = parser.parse_args()
    backend = "triton" if args.device == "cuda" else "cpp"
    meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "backend": backend, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    results = []
    for name, (fn, inputs) in examples(args.device, args.quick).items():
        results.append(run_example(name, fn, inputs, backend, args.device,
                                   0.05 if args.quick else args.budget))
        print_example(results[-1])
        if args.json:  # after each example: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "examples": results}, f, indent=1)


if __name__ == "__main__":
    main()
