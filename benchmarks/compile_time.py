"""Compile time of real models: toycomp's first training step, stage by stage, against Inductor's.

    python benchmarks/compile_time.py                                # GPT + every real model
    python benchmarks/compile_time.py --models gpt gpt2 --small --json out.json
    python benchmarks/compile_time.py --models gpt --flag cpp.batch_kernels=False  # pass off
    python benchmarks/compile_time.py --one gpt2 toycomp --small --profile 25  # one child, profiled

For each model (the GPT of notebook 05, ``benchmarks/gpt.py``, and the transformers / timm
models of ``real_models.py``) and each compiler (Inductor, ``torch.compile(backend="toycomp")``,
``toycomp.compile``) a fresh process with empty caches (its own ``TORCHINDUCTOR_CACHE_DIR``,
``TRITON_CACHE_DIR`` and ``TOYCOMP_CACHE_DIR``) times the first training step, forward and
backward: the cold compile a user waits for. The child first imports and warms up each
compiler on a tiny function of its own (so the imports are off the clock and the caches hold
none of the model's kernels).

toycomp's stage functions are wrapped with timers that count each stage's own time (a nested
stage's time counts once, in the inner stage): capture (toycomp's bytecode capture; Dynamo's is
part of "rest"), aot, prims (decompose), lowering, split (opt/split_reduction.py), scheduling,
codegen (source text and wrapper), compiling kernels (C++ compilers, Triton module imports and
Triton's ahead-of-time compiles) and triton jit (Triton compiling at a first launch). "rest" is
the first step less those: Dynamo's capture, the first run of the compiled code, glue.
"""

from __future__ import annotations

import argparse
import ast
import copy
import cProfile
import functools
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ modules
import real_models  # noqa: E402
import timing  # noqa: E402

COMPILERS = ("inductor", "toycomp-backend", "toycomp")
MODELS = ("gpt", *real_models.MODELS)


# --- the models ----------------------------------------------------------------------------------
def build(name: str, device: str, small: bool):
    """(model, step): ``step(forward)`` runs forward and backward of one batch, returns the loss."""
    if name != "gpt":
        model, batch, loss_of = real_models.build(name, device, small)
        return model, lambda forward: _backward(loss_of(forward, batch))
    import gpt

    sizes = gpt.SMALL if small or device == "cpu" else gpt.GPU_SIZED
    cfg = gpt.GPTConfig(vocab_size=96, **sizes)
    torch.manual_seed(0)
    model = gpt.GPT(cfg).to(device).train()
    x = torch.randint(0, cfg.vocab_size, (8, cfg.block_size), device=device)
    y = torch.randint(0, cfg.vocab_size, (8, cfg.block_size), device=device)
    return model, lambda forward: _backward(F.cross_entropy(
        forward(x).view(-1, cfg.vocab_size), y.view(-1)))


def _backward(loss):
    loss.backward()
    return loss.detach()


def compile_with(model, compiler: str):
    import toycomp

    if compiler == "inductor":
        return torch.compile(model)
    if compiler == "toycomp-backend":
        return torch.compile(model, backend=toycomp.toycomp_backend)
    return toycomp.compile(model)


# --- toycomp's stages, timed ---------------------------------------------------------------------
STAGES = ("capture", "aot", "prims", "lowering", "split", "scheduling", "codegen",
          "compiling kernels", "triton jit")


class StageTimer:
    """Wraps functions so that each call adds its own time (less its nested stages') to a stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.stack: list[list[float]] = []  # per open stage: [nested seconds]

    def wrap(self, owner, attr: str, stage: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                return fn(*args, **kwargs)  # a compile thread's time is its caller's
            self.stack.append([0.0])
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.perf_counter() - start
                nested = self.stack.pop()[0]
                self.seconds[stage] += total - nested
                if self.stack:
                    self.stack[-1][0] += total

        setattr(owner, attr, timed)

    def install(self) -> None:
        import toycomp.capture.convert_frame as convert_frame
        import toycomp.inductor.wrapper as wrapper
        import toycomp.pipeline as pipeline

        self.wrap(convert_frame.CompiledFrame, "compile", "capture")
        self.wrap(pipeline, "aot_function", "aot")
        self.wrap(pipeline, "decompose", "prims")
        self.wrap(pipeline, "lower", "lowering")
        self.wrap(pipeline, "split_reductions", "split")
        self.wrap(pipeline, "schedule", "scheduling")
        self.wrap(pipeline, "compile_graph", "codegen")
        self.wrap(wrapper, "_load_kernels", "compiling kernels")
        try:
            import toycomp.inductor.opt.async_compile as async_compile
            self.wrap(async_compile, "precompile_triton", "compiling kernels")
        except ImportError:
            pass
        try:
            from triton.runtime import jit
            self.wrap(jit.JITFunction, "_do_compile", "triton jit")
        except (ImportError, AttributeError):
            pass


# --- one child: one model, one compiler, fresh caches --------------------------------------------
def warm_up(compiler: str, device: str) -> None:
    """Each compiler's imports and first-call costs, on a function unlike any model's."""
    lin = torch.nn.Linear(3, 5).to(device)
    x = torch.randn(7, 3, device=device)
    compile_with(lin, compiler)(x).tanh().sum().backward()
    torch._dynamo.reset()


def measure(name: str, compiler: str, device: str, small: bool, profile: int,
            flags: dict) -> dict:
    import toycomp

    with toycomp.config.patch(flags):
        return _measure(name, compiler, device, small, profile)


def _measure(name: str, compiler: str, device: str, small: bool, profile: int) -> dict:
    warm_up(compiler, device)
    model, step = build(name, device, small)
    want = step(copy.deepcopy(model))
    stages = StageTimer()
    if compiler != "inductor":
        stages.install()
    compiled = compile_with(model, compiler)
    profiler = cProfile.Profile() if profile else None
    timing.synchronize(device)
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    got = step(compiled)
    timing.synchronize(device)
    seconds = time.perf_counter() - start
    if profiler:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(profile)
        print(out.getvalue())
    row = {"model": name, "compiler": compiler, "first_step_s": seconds,
           "loss_ok": bool(torch.allclose(got.float(), want.float(), rtol=1e-3, atol=1e-4))}
    if compiler != "inductor":
        row["stages_s"] = {s: stages.seconds.get(s, 0.0) for s in STAGES}
        row["stages_s"]["rest"] = seconds - sum(row["stages_s"].values())
        if compiler == "toycomp":
            row["kernels"] = sum(len(g.compiled.kernels) for e in compiled.entries
                                 for g in e.graphs)
    return row


def run_child(name: str, compiler: str, args) -> dict:
    """``measure`` in a fresh process with empty caches."""
    with tempfile.TemporaryDirectory(prefix="compile-time-") as tmp:
        env = dict(os.environ)
        for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TOYCOMP_CACHE_DIR"):
            env[var] = os.path.join(tmp, var.lower())
            os.makedirs(env[var], mode=0o700)
        out = os.path.join(tmp, "row.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", name, compiler,
               "--device", args.device, "--out", out] + ["--small"] * args.small
        cmd += [a for f in args.flag for a in ("--flag", f)]
        try:
            proc = subprocess.run(cmd, env=env, timeout=args.timeout, capture_output=True,
                                  text=True)
        except subprocess.TimeoutExpired:
            return {"model": name, "compiler": compiler, "error": f"timeout {args.timeout} s"}
        if proc.returncode or not os.path.exists(out):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            return {"model": name, "compiler": compiler, "error": tail[0][:200]}
        with open(out) as f:
            return json.load(f)


def print_model(rows: list[dict]) -> None:
    by = {r["compiler"]: r for r in rows}
    inductor = by.get("inductor", {}).get("first_step_s")
    for r in rows:
        if "error" in r:
            print(f"  {r['compiler']:<16} {r['error']}")
            continue
        ratio = f"{r['first_step_s'] / inductor:>6.2f}x Inductor" if inductor else ""
        mark = "" if r["loss_ok"] else "  (loss differs from eager's!)"
        print(f"  {r['compiler']:<16}{r['first_step_s']:>8.2f} s {ratio}{mark}")
        if "stages_s" in r:
            parts = [f"{s} {t:.2f}" for s, t in r["stages_s"].items() if t >= 0.005]
            print("      " + ", ".join(parts) + (f"  ({r['kernels']} kernels)"
                                                  if "kernels" in r else ""))
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--compilers", nargs="+", default=list(COMPILERS), choices=COMPILERS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny configs and batches")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per child")
    parser.add_argument("--json", help="store the results here")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "COMPILER"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--flag", action="append", default=[], metavar="NAME=VALUE",
                        help="a toycomp flag for the run, e.g. cpp.batch_kernels=False")
    parser.add_argument("--profile", type=int, default=0,
                        help="with --one: print cProfile's N top functions by cumulative time")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if args.one:
        flags = {k: ast.literal_eval(v) for k, v in (f.split("=", 1) for f in args.flag)}
        row = measure(*args.one, args.device, args.small, args.profile, flags)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(row, f)
        else:
            print_model([row])
        return
    rows = []
    print(f"first training step, cold caches ({args.device}), seconds")
    for name in args.models:
        if name != "gpt" and not real_models.have_package(name):
            print(f"{name}: its package is not installed here; skipped")
            continue
        print(name)
        model_rows = [run_child(name, c, args) for c in args.compilers]
        print_model(model_rows)
        rows += model_rows
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                "cpus": os.cpu_count(), "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d"), "small": args.small, "flags": args.flag}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
