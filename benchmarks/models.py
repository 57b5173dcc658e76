"""torchvision models trained one step by toycomp, checked against eager (for the lent GPU).

    python benchmarks/models.py                       # resnet50, mobilenet_v2, vit_b_16, batch 8
    python benchmarks/models.py --models resnet50 --batch 32

Each model (random weights, fixed seed, train mode: BatchNorm updates its running stats) runs
one training step (forward, cross-entropy, backward) eagerly and through ``toycomp.compile``
from the same initial state; the script prints the loss difference, the worst relative error
over all parameter gradients and buffers, the compile time and the fallbacks toycomp reported.
It needs torchvision (installed on the GPU machine, not a toycomp dependency). A measurement
and a check, not a test: it prints, and exits non-zero when a model disagrees with eager.

In fp32 on CUDA, BatchNorm's bias gradients early in a deep network are sums with heavy
cancellation, so two correct programs that reduce in another order (cuDNN's BatchNorm in eager,
the native kernel in toycomp's graph) differ there by percents. ``--float64`` tells rounding
from a wrong program: then every gradient and buffer must agree to 1e-9.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F

import toycomp


def relative_errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    """name -> ||got - want|| / (||want|| + 1e-6 sqrt(n)), for every gradient and float buffer.

    The floor keeps tensors that are rounding noise in both runs (a BatchNorm's running mean
    after a BatchNorm: about 1e-9) from reading as large relative errors."""
    return {
        name: ((got[name].double() - w.double()).norm() / (w.double().norm() + 1e-6 * w.numel() ** 0.5)).item()
        for name, w in want.items()
    }


def train_step(model: torch.nn.Module, step, x: torch.Tensor, y: torch.Tensor):
    model.zero_grad(set_to_none=True)
    loss = step(model, x, y)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: b for n, b in model.named_buffers() if b.is_floating_point()}
    return loss.detach(), grads | buffers


def check(name: str, batch: int, device: str, dtype: torch.dtype = torch.float32) -> bool:
    import torchvision

    torch.manual_seed(0)
    eager_model = getattr(torchvision.models, name)(weights=None).to(device, dtype).train()
    ours_model = copy.deepcopy(eager_model)
    x = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)
    y = torch.randint(0, 1000, (batch,), device=device)

    def loss_of(model, x, y):
        return F.cross_entropy(model(x), y)

    torch.manual_seed(1)
    want_loss, want = train_step(eager_model, loss_of, x, y)
    compiled = toycomp.compile(loss_of)
    torch.manual_seed(1)
    start = time.perf_counter()
    got_loss, got = train_step(ours_model, compiled, x, y)
    seconds = time.perf_counter() - start
    errors = relative_errors(got, want)
    error = max(errors.values())
    loss_diff = abs(got_loss.item() - want_loss.item())
    fallbacks = sorted({f for e in compiled.entries for g in getattr(e, "graphs", []) for f in g.fallbacks})
    ok = error < (1e-3 if dtype == torch.float32 else 1e-9) and loss_diff < 1e-4 * max(1.0, abs(want_loss.item()))
    print(
        f"{name:14} batch {batch:3}  loss {want_loss.item():.5f} diff {loss_diff:.1e}  "
        f"worst grad/buffer rel. error {error:.1e}  first call {seconds:5.1f}s  "
        f"graphs {compiled.compile_count}  {'OK' if ok else 'MISMATCH'}"
    )
    print(f"{'':14} fallbacks: {', '.join(fallbacks) or 'none'}")
    if not ok:
        worst = sorted(errors, key=errors.get, reverse=True)[:4]
        print(f"{'':14} worst: " + ", ".join(f"{n} {errors[n]:.1e}" for n in worst))
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v2", "vit_b_16"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--tf32", action="store_true", help="leave TF32 on (cuDNN's default for convolutions)"
    )
    parser.add_argument(
        "--no-cudnn", action="store_true", help="eager without cuDNN (native BatchNorm kernels)"
    )
    parser.add_argument("--float64", action="store_true", help="check in double precision")
    args = parser.parse_args()
    # TF32 rounds convolution inputs to 10-bit mantissas; two correct programs that pick
    # different cuDNN algorithms then differ by far more than fp32 rounding, and BatchNorm's
    # bias gradients (sums with heavy cancellation) show it most. Compare in full fp32.
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.enabled = not args.no_cudnn
    print(f"torch {torch.__version__}, device {args.device}, TF32 {'on' if args.tf32 else 'off'}")
    dtype = torch.float64 if args.float64 else torch.float32
    results = [check(name, args.batch, args.device, dtype) for name in args.models]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
