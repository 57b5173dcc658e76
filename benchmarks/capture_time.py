"""Capture time of real models: toycomp's mini-Dynamo against Dynamo, graph and break counts too.

    python benchmarks/capture_time.py                              # every model of real_models.py
    python benchmarks/capture_time.py --models gpt2 resnet50 --small --json out.json

One training step of each model of ``real_models.py`` (transformers and timm, train mode) is
captured by each side, with the graphs run as captured (no compiler behind either): toycomp
through ``CompileContext(lambda gm, example_inputs: gm.forward)``, Dynamo through
``torch._dynamo.explain``. Each time is the capture call's (bytecode analysis, tracing on fake
tensors, guards, plus one eager run of the captured graphs); a second eager step is timed alone
so that the capture's own cost can be read off. Each side captures a fresh copy of the model,
after a warm-up on a tiny model so that neither pays the other's first imports. The loss of each
capture is checked against eager's (a capture that computes something else is not timed).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ modules
import real_models  # noqa: E402
import timing  # noqa: E402
from toycomp.capture.convert_frame import CompileContext, summarize  # noqa: E402


def make_step(loss_of, batch):
    def step(model):
        loss = loss_of(model, batch)
        loss.backward()
        return loss.detach()
    return step


def capture_toycomp(model, step, device):
    context = CompileContext(lambda gm, example_inputs: gm.forward)  # graphs run as captured
    start = time.perf_counter()
    out = context.frame_for(step)(model)
    timing.synchronize(device)
    seconds = time.perf_counter() - start
    ex = summarize(context, out)
    return seconds, out, ex.graph_count, ex.graph_break_count


def capture_dynamo(model, step, device):
    torch._dynamo.reset()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = torch._dynamo.explain(step)(model)
    timing.synchronize(device)
    seconds = time.perf_counter() - start
    torch._dynamo.reset()
    return seconds, ex.graph_count, len(ex.break_reasons)


def measure(name: str, device: str, small: bool) -> dict:
    model, batch, loss_of = real_models.build(name, device, small)
    step = make_step(loss_of, batch)
    want = step(copy.deepcopy(model))
    eager_model = copy.deepcopy(model)
    timing.synchronize(device)
    start = time.perf_counter()
    step(eager_model)
    timing.synchronize(device)
    row = {"model": name, "eager_step_s": time.perf_counter() - start}
    seconds, got, graphs, breaks = capture_toycomp(copy.deepcopy(model), step, device)
    close = torch.allclose(got.float(), want.float(), rtol=1e-3, atol=1e-4)
    row["toycomp"] = {"capture_s": seconds, "graphs": graphs, "breaks": breaks, "loss_ok": close}
    seconds, graphs, breaks = capture_dynamo(copy.deepcopy(model), step, device)
    row["dynamo"] = {"capture_s": seconds, "graphs": graphs, "breaks": breaks}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(real_models.MODELS),
                        choices=real_models.MODELS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny configs and batches")
    parser.add_argument("--json", help="store the results here")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    warm = torch.nn.Linear(4, 4).to(args.device)  # both sides' first imports, off the clock
    x = torch.randn(2, 4, device=args.device)
    warm_step = make_step(lambda m, b: m(b).sum(), x)
    capture_toycomp(warm, warm_step, args.device), capture_dynamo(warm, warm_step, args.device)

    rows = []
    print(f"capture of one training step ({args.device}): seconds (graphs / breaks)")
    print(f"{'model':<30}{'eager step':>12}{'toycomp':>20}{'Dynamo':>20}{'ratio':>8}")
    for name in args.models:
        if not real_models.have_package(name):
            print(f"{name:<30} its package is not installed here; skipped")
            continue
        try:
            row = measure(name, args.device, args.small)
        except Exception as e:  # reported in the table
            row = {"model": name, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(f"{name:<30} {row['error']}")
            rows.append(row)
            continue
        rows.append(row)
        t, d = row["toycomp"], row["dynamo"]
        mark = "" if t["loss_ok"] else "  (loss differs from eager's!)"
        print(f"{name:<30}{row['eager_step_s']:>11.2f}s"
              f"{t['capture_s']:>11.2f}s ({t['graphs']} / {t['breaks']})"
              f"{d['capture_s']:>11.2f}s ({d['graphs']} / {d['breaks']})"
              f"{t['capture_s'] / d['capture_s']:>8.2f}{mark}", flush=True)
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
