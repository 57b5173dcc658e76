"""``python -m toycomp``: f(x) = sin(x)**2 + cos(x)**2 through every stage, in a terminal.

Prints the captured graph and guards, the joint / forward / backward ATen graphs, the prims
graphs, the generated kernels and wrapper code, then checks values and gradients against eager
PyTorch and exits non-zero on a mismatch.
"""

from __future__ import annotations

import argparse
import sys

import torch

import toycomp


def f(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def check_against_eager(backend: str | None, size: int) -> bool:
    """Compile ``f``, run forward and backward, compare with eager; print the errors."""
    x = torch.randn(size, requires_grad=True)
    x_eager = x.detach().clone().requires_grad_(True)
    out = toycomp.compile(f, backend=backend)(x)
    out.sum().backward()
    expected = f(x_eager)
    expected.sum().backward()
    ok = torch.allclose(out, expected, rtol=1e-4, atol=1e-5) and torch.allclose(
        x.grad, x_eager.grad, rtol=1e-4, atol=1e-5
    )
    print(f"max |toycomp - eager|: value {(out - expected).abs().max().item():.2e}, "
          f"gradient {(x.grad - x_eager.grad).abs().max().item():.2e}")
    print("OK: values and gradients match eager" if ok else "MISMATCH against eager")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toycomp", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["cpp", "triton"], default=None,
                        help="code generator (default: C++ on CPU, Triton on CUDA)")
    parser.add_argument("--size", type=int, default=1000, help="length of x (default 1000)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    x = torch.randn(args.size, requires_grad=True)
    print(toycomp.explain(f, x, backend=args.backend))
    print()
    return 0 if check_against_eager(args.backend, args.size) else 1


if __name__ == "__main__":
    sys.exit(main())
