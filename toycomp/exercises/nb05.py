"""Notebook 05's exercises (the capstone GPT): the checks.

Input -> output: what the student wrote in ``notebooks/05_capstone_gpt.ipynb`` -> a short verdict
(``checking.Verdict``), printed by the check cell. Both exercises rebuild, in a few lines of
PyTorch, what toycomp makes of two ops of the GPT (the table of section 2), and each check runs
the student's function on several cases against eager PyTorch, then through ``toycomp.compile``:

1. ``check_one_hot_embedding(one_hot_embedding)``: ``F.embedding`` without a gather, as a
   one-hot reduction ``sum_v where(idx[n] == v, weight[v, :], 0)``; values and the weight's
   gradient against ``F.embedding``, an ``inf`` in a row nobody selects included;
2. ``check_causal_softmax(causal_softmax)``: the attention's masked softmax with the causal mask
   built from two ``arange``s (``j <= i``); values against ``masked_fill`` with ``tril`` and a
   softmax, and toycomp's kernel count (one kernel: no mask in memory).

Each check is one call in the notebook's check cell: ``nb05.check_causal_softmax(causal_softmax)``.

NB: in PyTorch, Inductor lowers ``aten.embedding`` to an indirect load
(torch/_inductor/lowering.py, ``embedding``), and nanoGPT's attention keeps its causal mask as a
buffer (``self.bias``) that ``masked_fill`` reads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from toycomp.exercises.checking import Failure, call, exercise, expect, expect_close, expect_equal

GATHERS = {"embedding", "index", "index_select", "gather", "take", "_unsafe_index"}


class _RecordOps(TorchDispatchMode):
    """The names of the ATen ops run inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _compiled(fn: Callable, *args: torch.Tensor):
    import toycomp

    return toycomp.compile(fn)(*args)


# --- exercise 1: an embedding without a gather -------------------------------------------------
def _embedding_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 4, generator=gen)
    with_inf = weight.clone()
    with_inf[7, 2] = float("inf")  # row 7 is never selected below
    return [
        ("idx [3, 0, 9] (1-D), weight 10 x 4", torch.tensor([3, 0, 9]), weight),
        ("idx 2 x 5 with repeats, weight 10 x 4", torch.randint(0, 10, (2, 5), generator=gen),
         weight),  # fmt: skip
        ("vocabulary of 1", torch.zeros(3, dtype=torch.int64), torch.randn(1, 3, generator=gen)),
        ("an inf in row 7, which no index selects", torch.tensor([[1, 2], [3, 9]]), with_inf),
    ]


@exercise("05", 1, "one_hot_embedding", points=2)
def check_one_hot_embedding(one_hot_embedding: Callable) -> None:
    """``one_hot_embedding(idx, weight)`` == ``F.embedding(idx, weight)``, with no gather."""
    for case, idx, weight in _embedding_cases():
        with _RecordOps() as ops:
            got = call(case, one_hot_embedding, idx, weight)
        gathers = sorted(ops.names & GATHERS)
        expect(not gathers, case, "no gather", f"aten.{', aten.'.join(gathers)}",
               "compare idx with every row number (torch.arange) instead of indexing")
        expect(isinstance(got, torch.Tensor), case, "a tensor", type(got).__name__)
        expect_equal(case, tuple(got.shape), tuple(F.embedding(idx, weight).shape),
                     "one row of weight per index: idx.shape + (embedding dim,)")  # fmt: skip
        expect_close(case, got, F.embedding(idx, weight), hint=_embedding_hint(got))
    _check_embedding_gradient(one_hot_embedding)
    case = "through toycomp.compile"
    idx, weight = _embedding_cases()[1][1:]
    got = call(case, _compiled, one_hot_embedding, idx, weight)
    expect_close(case, got, F.embedding(idx, weight), hint="toycomp must give eager's values")


def _embedding_hint(got: torch.Tensor) -> str:
    if got.isnan().any():
        return "0 * inf is nan: pick the rows with torch.where, do not multiply by a one-hot"
    return "out[n, d] = sum over v of (weight[v, d] if idx[n] == v else 0)"


def _check_embedding_gradient(one_hot_embedding: Callable) -> None:
    case = "the weight's gradient, idx 2 x 5 with repeats"
    idx, weight = _embedding_cases()[1][1:]
    grad_out = torch.randn(*idx.shape, weight.shape[1], generator=torch.Generator().manual_seed(1))
    expected = torch.autograd.grad(F.embedding(idx, weight.requires_grad_()), weight, grad_out)[0]
    w = weight.detach().requires_grad_()
    out = call(case, one_hot_embedding, idx, w)
    if not out.requires_grad:
        raise Failure(case, "an output that depends on weight", "no gradient",
                      "build the output from weight with differentiable ops")  # fmt: skip
    got = call(case, lambda: torch.autograd.grad(out, w, grad_out)[0])
    expect_close(case, got, expected, hint="a repeated index adds its rows' gradients")


# --- exercise 2: the causal softmax, its mask from two aranges -----------------------------------
CAUSAL_CASES = [  # (case, shape of the attention scores (..., t, t))
    ("1 x 1 (t = 1)", (1, 1)),
    ("5 x 5", (5, 5)),
    ("batch 2, 4 heads, t = 8", (2, 4, 8, 8)),
]


def causal_reference(att: torch.Tensor) -> torch.Tensor:
    """The GPT's decomposed attention: ``masked_fill`` with a ``tril`` mask, then softmax."""
    t = att.shape[-1]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return att.masked_fill(mask.logical_not(), float("-inf")).softmax(-1)


@exercise("05", 2, "causal_softmax", points=1)
def check_causal_softmax(causal_softmax: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """``causal_softmax(att)`` against ``causal_reference``, eagerly and through toycomp."""
    gen = torch.Generator().manual_seed(0)
    for case, shape in CAUSAL_CASES:
        att = torch.randn(shape, generator=gen)
        got = call(case, causal_softmax, att)
        expect(isinstance(got, torch.Tensor), case, "a tensor", type(got).__name__)
        expect_close(case, got, causal_reference(att), hint=_causal_hint(got))
    import toycomp

    case = "through toycomp.compile, batch 2, 4 heads, t = 8"
    att = torch.randn(2, 4, 8, 8, generator=gen)
    got = call(case, _compiled, causal_softmax, att)
    expect_close(case, got, causal_reference(att), hint="toycomp must give eager's values")
    kernels = call(case, lambda: len(toycomp.explain(causal_softmax, att).kernels))
    expect_equal(case, kernels, 1, "toycomp fuses the mask's comparisons into the softmax kernel")


def _causal_hint(got: torch.Tensor) -> str:
    if got.isnan().any():
        return "a row of only -inf has no softmax: query i may see key j = i itself"
    return "query i (rows, dim -2) sees key j (columns, dim -1) when j <= i"
