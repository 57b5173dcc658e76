"""The models people train, one training step each: transformers and timm, fp32 and bf16 autocast.

    python benchmarks/real_models.py                          # every model, fp32, one process each
    python benchmarks/real_models.py --models gpt2 llama --dtype bf16 --json out.json
    python benchmarks/real_models.py --dtype fp32 bf16 --gpus 4 --json out.json  # a GPU a model
    python benchmarks/real_models.py --gpus 2 --per-gpu 2 --profile prof/ --json out.json
    python benchmarks/real_models.py --time gpt2 --out r.jsonl   # one model (what the above runs)

A step is the model's forward with its own loss (transformers: ``model(input_ids=...,
labels=...).loss``; timm: cross-entropy over its logits), then backward, from random weights
(fixed seed), in train mode with every dropout probability 0 (so each compiler computes eager's
function; BatchNorm updates its running statistics). ``--dtype bf16`` runs the forward and the
loss under ``torch.autocast(device, dtype=torch.bfloat16)``, as mixed-precision training does;
fp32 runs with TF32 off. Compilers: TorchInductor (``torch.compile``), toycomp behind Dynamo
(``torch.compile(backend=toycomp_backend)``) and ``toycomp.compile``; each compiles its own copy
of the model, so every step starts from the same weights and buffers.

Each model runs in its own process, which first checks every compiled step against eager: the
loss and every gradient and float buffer must be within ten times eager's own error of a float64
run of eager (``models.rounding_mismatch``; under autocast eager's error is bf16's, so the bound
follows), or within twice Inductor's error where eager's own is far smaller (cuDNN's BatchNorm).
A toycomp step that differs is reported, not timed; Inductor, the baseline, is timed with its
check's result in the table. Then eager's and the compiled steps are
timed taking turns (``timing.per_call_seconds_in_turns``), and the table gives each compiler's
speed-up over eager and toycomp's step time over Inductor's. The transformers models need the
``transformers`` package, the timm ones ``timm``: a model whose package is missing is skipped.

``--per-gpu 2`` runs two models on each GPU at once: their compiles (host work) overlap, while
the steps that use the GPU most (the checks' eager and float64 steps, the timing and the
profile) wait for a lock of their GPU, so the timed steps have the GPU to themselves (another
model's single first step may still run beside them; each figure is the median of its rounds).
``--profile DIR`` then profiles a few steps of each compiler in the same process (no second
compile) and writes ``DIR/MODEL-DTYPE.txt``: step time, GPU busy time, kernel launches and the
kernels that take the most GPU time, per compiler.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ modules
import models  # noqa: E402
import timing  # noqa: E402

COMPILERS = models.COMPILERS


# --- the models: name -> (package, builder); a builder returns (model, batch, loss of a call) ----
def _transformers_model(kind: str, device: str, small: bool):
    import transformers as hf

    layers, width, seq, batch = (2, 64, 16, 2) if small else (6, 512, 256, 8)
    common = dict(vocab_size=1000 if small else 32000)
    if kind == "gpt2":
        config = hf.GPT2Config(n_layer=layers, n_embd=width, n_head=8, n_positions=seq,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        model = hf.GPT2LMHeadModel(config)
    elif kind == "bert":
        config = hf.BertConfig(num_hidden_layers=layers, hidden_size=width, num_attention_heads=8,
                               intermediate_size=4 * width, max_position_embeddings=seq,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
        model = hf.BertForMaskedLM(config)
    elif kind == "llama":
        config = hf.LlamaConfig(num_hidden_layers=layers, hidden_size=width, num_attention_heads=8,
                                num_key_value_heads=2, intermediate_size=4 * width,
                                max_position_embeddings=seq, attention_dropout=0.0, **common)
        model = hf.LlamaForCausalLM(config)
    elif kind == "t5":
        config = hf.T5Config(num_layers=layers, num_decoder_layers=layers, d_model=width,
                             d_kv=width // 8, d_ff=4 * width, num_heads=8, dropout_rate=0.0,
                             **common)
        model = hf.T5ForConditionalGeneration(config)
    else:
        raise ValueError(kind)
    torch.manual_seed(1)
    ids = torch.randint(0, common["vocab_size"], (batch, seq), device=device)
    inputs = {"input_ids": ids, "labels": ids}
    if kind == "t5":
        inputs["decoder_input_ids"] = ids
    return model.to(device), inputs, lambda m, b: m(**b).loss


def _timm_model(name: str, device: str, small: bool):
    import timm

    try:
        model = timm.create_model(name, pretrained=False, drop_rate=0.0, drop_path_rate=0.0)
    except TypeError:  # a model without stochastic depth (densenet121) takes no drop_path_rate
        model = timm.create_model(name, pretrained=False, drop_rate=0.0)
    size = 2 if small else 32
    torch.manual_seed(1)
    x = torch.randn(size, 3, 224, 224, device=device)
    y = torch.randint(0, model.num_classes, (size,), device=device)
    return model.to(device), {"x": x, "y": y}, lambda m, b: F.cross_entropy(m(b["x"]), b["y"])


TRANSFORMERS = ("gpt2", "bert", "llama", "t5")
TIMM = ("convnext_tiny", "efficientnet_b0", "vit_small_patch16_224", "swin_tiny_patch4_window7_224",
        "mixer_b16_224", "regnetx_016", "mobilenetv3_large_100", "densenet121", "resnet50")
MODELS = TRANSFORMERS + TIMM


def build(name: str, device: str, small: bool = False):
    torch.manual_seed(0)
    if name in TRANSFORMERS:
        model, batch, loss_of = _transformers_model(name, device, small)
    else:
        model, batch, loss_of = _timm_model(name, device, small)
    return model.train(), batch, loss_of


def have_package(name: str) -> bool:
    package = "transformers" if name in TRANSFORMERS else "timm"
    try:
        __import__(package)
    except ImportError:
        return False
    return True


# --- one step -------------------------------------------------------------------------------
def autocast(device: str, dtype: str):
    if dtype == "bf16":
        return torch.autocast(device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(model, forward, batch, loss_of, device: str, dtype: str):
    """The loss, and every gradient and float buffer of ``model`` after one step by ``forward``."""
    model.zero_grad(set_to_none=True)
    with autocast(device, dtype):
        loss = loss_of(forward, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if b.is_floating_point()}
    return loss.detach().float(), grads | buffers


def float64_step(model, batch, loss_of, device: str):
    model64 = copy.deepcopy(model).double()
    batch64 = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    return train_step(model64, model64, batch64, loss_of, device, "fp32")


def compile_model(model, compiler: str) -> Callable:
    return models.compile_model(model, compiler)


@contextlib.contextmanager
def gpu_to_myself():
    """Hold this GPU's lock (``--per-gpu``: set by the parent as ``REAL_MODELS_GPU_LOCK``)."""
    path = os.environ.get("REAL_MODELS_GPU_LOCK")
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def profile_steps(steps: dict[str, Callable], device: str, title: str, count: int = 5):
    """torch.profiler over ``count`` steps of each compiler: a text report and a summary each."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    text, summary = [], {}
    for compiler, step in steps.items():
        step()
        timing.synchronize(device)
        with profile(activities=activities) as prof:
            for _ in range(count):
                step()
            timing.synchronize(device)
        events = prof.key_averages()
        # the kernels and copies themselves (an ATen op's row repeats its kernels' device time)
        on_gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_ms = sum(e.self_device_time_total for e in on_gpu) / count / 1e3
        launches = sum(e.count for e in on_gpu) / count
        summary[compiler] = {"gpu_busy_ms": busy_ms, "kernels": launches}
        gpu = f": GPU busy {busy_ms:.2f} ms a step, {launches:.0f} kernels a step"
        text.append(f"=== {title}, {compiler}" + (gpu if device == "cuda" else ""))
        key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
        text.append(events.table(sort_by=key, row_limit=15, max_name_column_width=70))
    return "\n".join(text), summary


def time_model(name: str, device: str, dtype: str, budget_s: float, small: bool,
               profile_dir: str | None = None) -> list[dict]:
    """Check each compiler's step on ``name`` against eager, then time them all in turns."""
    model, batch, loss_of = build(name, device, small)
    with gpu_to_myself():
        want64 = float64_step(model, batch, loss_of, device)
        eager_model = copy.deepcopy(model)
        want = train_step(eager_model, eager_model, batch, loss_of, device, dtype)

    def lean(m, forward):
        def step():
            m.zero_grad(set_to_none=True)
            with autocast(device, dtype):
                loss = loss_of(forward, batch)
            loss.backward()
        return step

    results, steps, peer = [], {"eager": lean(eager_model, eager_model)}, None
    for compiler in COMPILERS:
        result = {"model": name, "dtype": dtype, "compiler": compiler}
        mine = copy.deepcopy(model)
        try:
            compiled = compile_model(mine, compiler)
            start = time.perf_counter()
            got = train_step(mine, compiled, batch, loss_of, device, dtype)
            timing.synchronize(device)
            result["first_call_s"] = time.perf_counter() - start
            problem = models.rounding_mismatch(got, want, want64, peer)
            if compiler == "inductor":  # the baseline: timed, its check reported
                peer, result["check"], problem = got, problem or "ok", None
        except Exception as e:  # reported in the table
            problem = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            result["status"] = "error"
        if problem:
            result.setdefault("status", "FAILED")
            result["message"] = problem
        else:
            result["status"] = "ok"
            steps[compiler] = lean(mine, compiled)
        results.append(result)
        print(f"  {name} {dtype}, {compiler}: {result['status']} {result.get('message', '')}",
              file=sys.stderr, flush=True)
    del want64, want, peer
    with gpu_to_myself():
        calls = timing.per_call_seconds_in_turns(steps, device, budget_s * len(steps))
        if profile_dir:
            text, profiled = profile_steps(steps, device, f"{name} {dtype}")
            os.makedirs(profile_dir, exist_ok=True)
            with open(os.path.join(profile_dir, f"{name}-{dtype}.txt"), "w") as f:
                f.write(text + "\n")
    measured = {c: {"call_s": statistics.median(calls[c]), "call_s_rounds": calls[c]}
                | ({"profile": profiled[c]} if profile_dir else {}) for c in steps}  # fmt: skip
    return [r | {"eager": measured["eager"], "compiled": measured[r["compiler"]]}
            if r["status"] == "ok" else r for r in results]  # fmt: skip


def time_one(args) -> None:
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if threads := int(os.environ.get("REAL_MODELS_COMPILE_THREADS", 0)):  # (see run_all)
        from torch._inductor import config as inductor_config

        import toycomp

        toycomp.config.compile_threads = inductor_config.compile_threads = threads
    try:
        results = time_model(args.time, args.device, args.dtype, args.budget, args.small,
                             args.profile)
    except Exception as e:  # reported in the table
        message = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        results = [{"model": args.time, "dtype": args.dtype, "compiler": c, "status": "error",
                    "message": message} for c in COMPILERS]  # fmt: skip
    with open(args.out, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in results)


def run_all(jobs, device: str, budget_s: float, small: bool, timeout_s: float, gpus: int = 1,
            on_result: Callable[[list[dict]], None] = lambda results: None, per_gpu: int = 1,
            profile_dir: str | None = None):
    """Each (model, dtype) job in its own process (``--time``); the processes share ``timeout_s``.
    With ``gpus`` > 1, one job runs on each GPU at a time (``CUDA_VISIBLE_DEVICES``), so a model's
    compilers still take turns alone on their GPU; ``per_gpu`` > 1 runs that many, taking turns
    for the GPU (see the module docstring). ``on_result`` sees the results so far after each job
    (a long run stores what finished)."""
    results, deadline = [], time.monotonic() + timeout_s
    queue, lock = list(jobs), threading.Lock()
    # Models compile side by side: each compiler gets its share of the cores for its workers.
    compile_threads = max(2, min(32, (os.cpu_count() or 2) // (gpus * per_gpu)))

    def worker(gpu: int, tmp: str) -> None:
        while True:
            with lock:
                if not queue:
                    return
                name, dtype = queue.pop(0)
            on_gpu = gpu % gpus if gpus > 1 else None
            done = _run_job(name, dtype, device, budget_s, small, deadline, on_gpu, tmp,
                            per_gpu > 1, profile_dir, compile_threads)
            with lock:
                results.extend(done)
                on_result(results)

    with tempfile.TemporaryDirectory() as tmp:
        threads = [threading.Thread(target=worker, args=(k, tmp)) for k in range(gpus * per_gpu)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def _run_job(name, dtype, device, budget_s, small, deadline, gpu, tmp, share=False,
             profile_dir=None, compile_threads=2) -> list[dict]:
    if not have_package(name):
        print(f"  {name}: its package is not installed here; skipped", file=sys.stderr)
        return []
    out = os.path.join(tmp, f"{name}-{dtype}.jsonl")
    limit = max(30.0, deadline - time.monotonic())
    cmd = [sys.executable, os.path.abspath(__file__), "--time", name, "--out", out,
           "--device", device, "--dtype", dtype, "--budget", str(budget_s)]
    cmd += ["--profile", profile_dir] if profile_dir else []
    env = os.environ | ({} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)})
    env["REAL_MODELS_COMPILE_THREADS"] = str(compile_threads)
    if share:
        env["REAL_MODELS_GPU_LOCK"] = os.path.join(tmp, f"gpu{gpu or 0}.lock")
    try:
        subprocess.run(cmd + (["--small"] if small else []), timeout=limit, check=False, env=env)
    except subprocess.TimeoutExpired:
        print(f"  {name} {dtype}: stopped after {limit:.0f}s", file=sys.stderr)
    if os.path.exists(out):
        with open(out) as f:
            done = [json.loads(line) for line in f if line.strip()]
        if done:
            return done
    return [{"model": name, "dtype": dtype, "compiler": c, "status": "timeout"} for c in COMPILERS]


def print_table(results: list[dict], device: str) -> None:
    by = {(r["model"], r["compiler"]): r for r in results}
    names = list(dict.fromkeys(r["model"] for r in results))
    ours = [c for c in COMPILERS if c != "inductor"]
    dtype = results[0]["dtype"] if results else "-"
    print(f"\none training step ({device}, {dtype}, train mode), speed-up over eager, and step "
          "time over Inductor's (a model's steps take turns in one process)")
    print(f"{'model':<30}{'eager':>10}" + "".join(f"{c:>17}" for c in COMPILERS)
          + "".join(f"{c + ' / inductor':>27}" for c in ours))  # fmt: skip
    for m in names:
        eager = next((r["eager"]["call_s"] for c in COMPILERS
                      if "eager" in (r := by.get((m, c)) or {})), None)  # fmt: skip
        print(f"{m:<30}{'-' if eager is None else f'{eager * 1e3:.1f}ms':>10}"
              + "".join(f"{models.speedup(by.get((m, c))):>17}" for c in COMPILERS)
              + "".join(f"{models.against_inductor(by, m, c):>27}" for c in ours))
    ratios = {c: [by[(m, c)]["compiled"]["call_s"] / by[(m, "inductor")]["compiled"]["call_s"]
                  for m in names if models.against_inductor(by, m, c) != "-"] for c in ours}
    for c, values in ratios.items():
        if values:
            gmean = statistics.geometric_mean(values)
            print(f"geometric mean of {c} / inductor over {len(values)} models: {gmean:.3f}")
    for r in results:
        if r.get("status") != "ok":
            print(f"  {r['model']}, {r['compiler']}: {r['status']} {r.get('message', '')}")
        elif "first_call_s" in r:
            print(f"  {r['model']}, {r['compiler']}: first call (compile + step) "
                  f"{r['first_call_s']:.1f}s")
        if r.get("check", "ok") != "ok":
            print(f"  {r['model']}, {r['compiler']}: timed, though its check found {r['check']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", nargs="+", choices=("fp32", "bf16"), default=["fp32"],
                        help="one or both; --time takes one")
    parser.add_argument("--small", action="store_true", help="tiny configs and batches (a smoke run)")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds a timing")
    parser.add_argument("--timeout", type=float, default=3000.0, help="seconds for all models")
    parser.add_argument("--json", help="store the results here (rewritten after each model)")
    parser.add_argument("--gpus", type=int, default=1, help="models run side by side, one a GPU")
    parser.add_argument("--per-gpu", type=int, default=1,
                        help="models at once on each GPU, taking turns for it (see above)")
    parser.add_argument("--profile", metavar="DIR", help="profile each model's steps into DIR")
    parser.add_argument("--time", choices=MODELS, help="one model in this process")
    parser.add_argument("--out", help="--time: append one JSON line per compiler here")
    args = parser.parse_args()
    if args.time:
        args.dtype = args.dtype[0]
        time_one(args)
        return
    meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "torch": torch.__version__, "dtypes": args.dtype, "small": args.small}

    def store(results: list[dict]) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(meta | {"results": results}, f, indent=1)

    jobs = [(name, dtype) for dtype in args.dtype for name in args.models]
    results = run_all(jobs, args.device, args.budget, args.small, args.timeout, args.gpus, store,
                      args.per_gpu, args.profile)
    for dtype in args.dtype:
        order = {name: k for k, name in enumerate(args.models)}
        mine = sorted((r for r in results if r["dtype"] == dtype), key=lambda r: order[r["model"]])
        print_table(mine, args.device)
    store(results)


if __name__ == "__main__":
    main()
