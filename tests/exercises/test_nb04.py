"""Notebook 04's checkers: each accepts the reference solution (the solved notebook's) and rejects
plausible wrong ones with a message that names the case and helps."""

from __future__ import annotations

import linecache

import sympy
import torch
import triton
import triton.language as tl

from tests.exercises import reference
from toycomp.exercises import checking, nb04
from toycomp.inductor import indexing, ir
from toycomp.inductor.tensor_value import reindex


def solved(grade_id: str, name: str):
    """The solved notebook's answer ``name``, defined by running its solution cell. The cell's
    source is registered with ``linecache``, so that ``@triton.jit`` can read it back."""
    source = reference.solution_source("04", grade_id)
    filename = f"<04 solution {grade_id}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"indexing": indexing, "ir": ir, "reindex": reindex, "sympy": sympy,
                 "triton": triton, "tl": tl}  # fmt: skip
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


lower_rev = solved("nb04_ex1_lowering", "lower_rev")
can_fuse = solved("nb04_ex2_can_fuse", "can_fuse")
softmax_kernel = solved("nb04_ex3_triton_softmax", "softmax_kernel")
predict_kernel_counts = solved("nb04_ex4_kernel_counts", "predict_kernel_counts")


def lines_of(verdict) -> list[str]:
    lines = verdict.text.splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    return lines


def not_solved(*args):
    raise NotImplementedError()


# --- exercise 1: lowering prims.rev --------------------------------------------------------------
def lower_rev_off_by_one(g, out, a, dims):
    index = list(indexing.index_vars("i", len(a.size)))
    for d in dims:
        index[d] = a.size[d] - index[d]
    return reindex(a, a.size, tuple(index))


def lower_rev_flips_everything(g, out, a, dims):
    index = [n - 1 - i for n, i in zip(a.size, indexing.index_vars("i", len(a.size)))]
    return reindex(a, a.size, tuple(index))


def lower_rev_ignores_strides(g, out, a, dims):  # rebuilds the load as if a were contiguous
    (load,) = [e for e in ir.walk(a.body) if isinstance(e, ir.Load)]
    ivars = indexing.index_vars("i", len(a.size))
    index = list(ivars)
    for d in dims:
        index[d] = a.size[d] - 1 - index[d]
    flat = indexing.linear_index(index, indexing.contiguous_strides(a.size))
    return type(a)(a.size, a.dtype, ir.Load(load.buffer, sympy.expand(flat), a.dtype))


def test_lowering_accepts_the_reference():
    assert nb04.check_lowering(lower_rev).passed


def test_lowering_rejects_off_by_one_with_bounds_message():
    verdict = nb04.check_lowering(lower_rev_off_by_one)
    lines = lines_of(verdict)
    assert verdict.status == "failed"
    assert lines[0] == "✗ nb04 ex1 lowering: wrong on case '1-D, dims [0]'"
    assert "reads elements (1, 5) of 0..4" in lines[2]
    assert "n - 1 - i" in lines[3]


def test_lowering_rejects_flipping_every_dim():
    verdict = nb04.check_lowering(lower_rev_flips_everything)
    lines = lines_of(verdict)
    assert lines[0] == "✗ nb04 ex1 lowering: wrong on case '2-D, dims [1]'"
    assert lines[3].startswith("    hint:     your body is load(a, ")


def test_lowering_rejects_ignoring_strides():
    verdict = nb04.check_lowering(lower_rev_ignores_strides)
    assert lines_of(verdict)[0] == "✗ nb04 ex1 lowering: wrong on case 'transposed input, dims [0]'"


def test_lowering_not_solved_and_wrong_type():
    assert nb04.check_lowering(not_solved).status == "not solved"
    verdict = nb04.check_lowering(lambda g, out, a, dims: a.body)
    assert verdict.status == "failed" and "a TensorValue" in verdict.text


# --- exercise 2: fusion legality --------------------------------------------------------------
def can_fuse_by_sizes(producer, consumer):  # "same leading sizes" forgets the index
    return tuple(consumer.size[: len(producer.size)]) == tuple(producer.size)


def can_fuse_first_load_only(producer, consumer):
    row = can_fuse_row(producer, consumer)
    loads = [e for e in ir.walk(consumer.body) if isinstance(e, ir.Load)]
    first = next(e for e in loads if e.buffer == producer.name)
    return row is not None and sympy.expand(first.index - row) == 0


def can_fuse_row(producer, consumer):
    rows = indexing.numel(producer.size)
    ivars = indexing.index_vars("i", len(consumer.size))
    for k in range(len(consumer.size) + 1):
        if indexing.numel(consumer.size[:k]) == rows:
            return indexing.linear_index(ivars[:k], indexing.contiguous_strides(consumer.size[:k]))
    return None


def can_fuse_reads_i0(producer, consumer):  # the row is i0, forgetting 3-D consumers
    loads = [e for e in ir.walk(consumer.body) if isinstance(e, ir.Load)]
    i0 = indexing.index_vars("i", 1)[0]
    return all(e.index == i0 for e in loads if e.buffer == producer.name)


def test_fusion_cases_cover_both_answers():
    answers = [nb04.fusion_case(program, size)[1] for _, program, size in nb04.FUSION_CASES]
    assert answers.count(True) >= 3 and answers.count(False) >= 3


def test_can_fuse_accepts_the_reference():
    assert nb04.check_can_fuse(can_fuse).passed


def test_can_fuse_rejects_comparing_sizes():
    lines = lines_of(nb04.check_can_fuse(can_fuse_by_sizes))
    assert lines[0] == "✗ nb04 ex2 can_fuse: wrong on case 'x / x.sum(1)[None, :]'"
    assert lines[1:3] == ["    expected: False", "    got:      True"]
    assert lines[3] == "    hint:     buf0 has 6 rows; the consumer [6, 6] reads load(buf0, i1)"


def test_can_fuse_rejects_checking_one_load():
    lines = lines_of(nb04.check_can_fuse(can_fuse_first_load_only))
    assert lines[0].endswith("wrong on case 's[:, None] + s[None, :], s = x.sum(1)'")
    assert "load(buf0, i0), load(buf0, i1)" in lines[3]


def test_can_fuse_rejects_i0_as_the_row():
    lines = lines_of(nb04.check_can_fuse(can_fuse_reads_i0))
    assert lines[0].endswith("wrong on case 'x / x.sum(2, keepdim=True), x 3-D'")


def test_can_fuse_wants_a_bool():
    verdict = nb04.check_can_fuse(lambda p, c: 1)
    assert verdict.status == "failed" and "return a bool" in verdict.text


# --- exercise 3: softmax in Triton -------------------------------------------------------------
@triton.jit
def softmax_no_max(in_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    num = tl.exp(tl.load(in_ptr + row * n_cols + cols, mask, other=float("-inf")))
    tl.store(out_ptr + row * n_cols + cols, num / tl.sum(num, 0), mask)


@triton.jit
def softmax_other_zero(in_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * n_cols + cols, mask, other=0.0)
    num = tl.exp(x - tl.max(x, 0))
    tl.store(out_ptr + row * n_cols + cols, num / tl.sum(num, 0), mask)


@triton.jit
def softmax_stub(in_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    raise NotImplementedError()


def test_triton_softmax_accepts_the_reference():
    assert nb04.check_triton_softmax(softmax_kernel).passed


def test_triton_softmax_rejects_no_max_subtraction():
    lines = lines_of(nb04.check_triton_softmax(softmax_no_max))
    assert lines[0].endswith("wrong on case '4 x 16, values up to 1000 (exp overflows)'")
    assert "subtract the row max" in lines[3]


def test_triton_softmax_rejects_masked_lanes_loaded_as_zero():
    lines = lines_of(nb04.check_triton_softmax(softmax_other_zero))
    assert lines[0].endswith("wrong on case '8 x 1000, as in section 3'")
    assert lines[3] == ("    hint:     masked lanes (cols >= n_cols) must not count: "
                        "load them as -inf (exp gives 0)")


def test_triton_softmax_stub_is_not_solved():
    assert nb04.check_triton_softmax(softmax_stub).status == "not solved"


# --- exercise 4: kernel counts ------------------------------------------------------------------
def test_kernel_counts_accepts_the_reference():
    assert nb04.check_kernel_counts(predict_kernel_counts).passed


def test_kernel_count_programs_are_counted_by_toycomp_on_both_backends():
    counts = {name: {b: nb04.toycomp_kernel_count(p, b) for b in ("cpp", "triton")}
              for name, p in nb04.KERNEL_COUNT_PROGRAMS.items()}  # fmt: skip
    assert all(c["cpp"] == c["triton"] for c in counts.values()), counts
    assert {c["cpp"] for c in counts.values()} == {1, 2}  # both answers occur
    assert nb04.program_inputs(nb04.KERNEL_COUNT_PROGRAMS["both_sums"])[0].shape == (64, 32)


def test_kernel_counts_rejects_one_kernel_for_both_sums():  # what a square input would give
    checking.TRIES.clear()
    wrong = {**predict_kernel_counts(), "both_sums": 1}
    lines = lines_of(nb04.check_kernel_counts(lambda: wrong))
    assert lines[0] == "✗ nb04 ex4 kernel_counts: wrong on case 'both_sums, cpp'"
    assert lines[1].startswith("    expected: (shown after a correct answer or 3 wrong tries")
    assert lines[2] == "    got:      1" and "one (numel, rnumel)" in lines[3]
    for _ in range(2):  # the expected count is shown from the third wrong try on
        lines = lines_of(nb04.check_kernel_counts(lambda: wrong))
    assert lines[1] == "    expected: 2"
    checking.TRIES.clear()


def test_kernel_counts_rejects_counting_the_matmul_and_missing_names():
    wrong = {**predict_kernel_counts(), "linear_relu": 2}
    assert "extern call" in nb04.check_kernel_counts(lambda: wrong).text
    verdict = nb04.check_kernel_counts(lambda: {"chain": 1})
    assert verdict.status == "failed" and "missing ['two_outputs'" in verdict.text
    assert nb04.check_kernel_counts(not_solved).status == "not solved"
