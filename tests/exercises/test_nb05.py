"""Notebook 05's checkers: each accepts the reference solution (the solved notebook's) and rejects
plausible wrong ones with a message that names the case and helps."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.exercises import reference
from toycomp.exercises import nb05

one_hot_embedding = reference.solution("05", "nb05_ex1_one_hot_embedding", "one_hot_embedding",
                                       torch=torch)  # fmt: skip
causal_softmax = reference.solution("05", "nb05_ex2_causal_softmax", "causal_softmax", torch=torch)


def lines_of(verdict) -> list[str]:
    lines = verdict.text.splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    return lines


def not_solved(*args):
    raise NotImplementedError()


# --- exercise 1: an embedding without a gather ---------------------------------------------------
def test_one_hot_embedding_reference_is_the_embedding():
    idx, weight = torch.tensor([[4, 0], [4, 2]]), torch.randn(5, 3)
    assert torch.equal(one_hot_embedding(idx, weight), F.embedding(idx, weight))


def test_one_hot_embedding_accepts_the_reference():
    assert nb05.check_one_hot_embedding(one_hot_embedding).passed


def test_one_hot_embedding_rejects_a_gather():
    lines = lines_of(nb05.check_one_hot_embedding(lambda idx, weight: weight[idx]))
    assert lines[:3] == ["✗ nb05 ex1 one_hot_embedding: wrong on case "
                         "'idx [3, 0, 9] (1-D), weight 10 x 4'",
                         "    expected: 'no gather'", "    got:      'aten.index'"]  # fmt: skip
    assert "torch.arange" in lines[3]


def test_one_hot_embedding_rejects_a_one_hot_matmul():  # 0 * inf is nan in the other rows
    def one_hot_matmul(idx, weight):
        return (idx[..., None] == torch.arange(weight.shape[0])).to(weight.dtype) @ weight

    assert torch.allclose(one_hot_matmul(torch.tensor([1, 2]), torch.ones(3, 2)), torch.ones(2, 2))
    lines = lines_of(nb05.check_one_hot_embedding(one_hot_matmul))
    assert lines[0].endswith("wrong on case 'an inf in row 7, which no index selects'")
    assert "0 * inf is nan" in lines[-1]


def test_one_hot_embedding_rejects_summing_the_wrong_dim():
    def wrong_dim(idx, weight):
        hit = idx[..., None, None] == torch.arange(weight.shape[0])[:, None]
        return torch.where(hit, weight, 0.0).sum(-1)

    verdict = nb05.check_one_hot_embedding(wrong_dim)
    assert verdict.status == "failed" and "idx.shape + (embedding dim,)" in verdict.text


def test_one_hot_embedding_rejects_a_detached_result_and_stub():
    def detached(idx, weight):
        return one_hot_embedding(idx, weight.detach())

    verdict = nb05.check_one_hot_embedding(detached)
    assert "the weight's gradient" in lines_of(verdict)[0] and "no gradient" in verdict.text
    assert nb05.check_one_hot_embedding(not_solved).status == "not solved"


# --- exercise 2: the causal softmax ----------------------------------------------------------------
def test_causal_softmax_accepts_the_reference():
    att = torch.randn(3, 6, 6)
    assert torch.allclose(causal_softmax(att), nb05.causal_reference(att))
    assert nb05.check_causal_softmax(causal_softmax).passed


def test_causal_softmax_rejects_masking_the_diagonal():
    def strict(att):
        i, j = torch.arange(att.shape[-1])[:, None], torch.arange(att.shape[-1])[None, :]
        return torch.where(j < i, att, float("-inf")).softmax(-1)

    lines = lines_of(nb05.check_causal_softmax(strict))
    assert lines[0] == "✗ nb05 ex2 causal_softmax: wrong on case '1 x 1 (t = 1)'"
    assert "j = i itself" in lines[-1]


def test_causal_softmax_rejects_the_transposed_mask():
    def anti_causal(att):
        i, j = torch.arange(att.shape[-1])[:, None], torch.arange(att.shape[-1])[None, :]
        return torch.where(j >= i, att, float("-inf")).softmax(-1)

    lines = lines_of(nb05.check_causal_softmax(anti_causal))
    assert lines[0] == "✗ nb05 ex2 causal_softmax: wrong on case '5 x 5'"
    assert "when j <= i" in lines[-1]


def test_causal_softmax_stub_is_not_solved():
    assert nb05.check_causal_softmax(not_solved).status == "not solved"
