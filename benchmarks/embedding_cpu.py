"""GPT-2's token embedding on the CPU, forward and backward: eager vs toycomp, in one run.

An embedding of a 50,257 x 768 table looked up by 1,024 tokens, the step ``(embedding(idx, w) *
g).sum().backward()``: toycomp's forward is one gather kernel and its backward a scatter-add
(see [Note: indirect indexing] in toycomp/inductor/loop_body.py). Prints the compile time, the
median step times and their ratio, after checking the loss and the gradient against eager.

    python benchmarks/embedding_cpu.py [--vocab 50257] [--dim 768] [--tokens 1024] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import toycomp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--vocab", 50257), ("--dim", 768), ("--tokens", 1024), ("--steps", 20)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args()
    torch.manual_seed(0)
    w = torch.randn(args.vocab, args.dim, requires_grad=True)
    idx, g = torch.randint(0, args.vocab, (args.tokens,)), torch.randn(args.tokens, args.dim)

    def loss(w, idx, g):
        return (F.embedding(idx, w) * g).sum()

    compiled = toycomp.compile(loss)

    def step(fn):
        w.grad = None
        fn(w, idx, g).backward()
        return w.grad

    start = time.perf_counter()
    got = step(compiled).clone()
    compile_s = time.perf_counter() - start
    torch.testing.assert_close(got, step(loss), rtol=1e-4, atol=1e-5)  # correct, then timed
    times = {"eager": [], "toycomp": []}
    for _ in range(3):
        step(loss), step(compiled)  # warm-up
    for _ in range(args.steps):  # the two take turns: the same machine state for both
        for name, fn in (("eager", loss), ("toycomp", compiled)):
            t = time.perf_counter()
            step(fn)
            times[name].append(time.perf_counter() - t)
    eager, mine = (statistics.median(times[k]) * 1e3 for k in ("eager", "toycomp"))
    print(f"embedding {args.vocab} x {args.dim}, {args.tokens} tokens, forward + backward (CPU)")
    print(f"compile (first call) {compile_s:.2f} s; step eager {eager:.1f} ms, "
          f"toycomp {mine:.1f} ms: {mine / eager:.2f}x eager")  # fmt: skip


if __name__ == "__main__":
    main()
