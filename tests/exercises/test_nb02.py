"""Notebook 02's checkers accept the reference solutions and reject plausible wrong ones.

The reference answers come from the solved notebook (tests/exercises/reference.py); the wrong
answers (and a right one in another form) are written here.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from tests.exercises import reference
from toycomp.aot.partitioners import extract_graph
from toycomp.exercises import nb02

aten = torch.ops.aten


def solution(name: str):
    names = {"aten": aten, "torch": torch, "fx": fx, "extract_graph": extract_graph}
    return reference.solution("02", name, **names)


# -- 1. tanh's joint graph --------------------------------------------------------------------
def tanh_joint_by_formula(primals_1, tangents_1):  # also right: 1 - tanh**2 from the result
    tanh = aten.tanh.default(primals_1)
    return tanh, aten.mul.Tensor(tangents_1, aten.rsub.Scalar(aten.mul.Tensor(tanh, tanh), 1))


def tanh_joint_recomputes(primals_1, tangents_1):  # right values, but tanh computed twice
    again = aten.tanh.default(primals_1)
    return aten.tanh.default(primals_1), aten.tanh_backward.default(tangents_1, again)


def tanh_joint_wrong_formula(primals_1, tangents_1):  # 1 - x**2 instead of 1 - tanh(x)**2
    square = aten.mul.Tensor(primals_1, primals_1)
    return aten.tanh.default(primals_1), aten.mul.Tensor(tangents_1, aten.rsub.Scalar(square, 1))


def test_tanh_joint_accepts_the_reference_and_the_formula():
    assert nb02.check_tanh_joint(solution("tanh_joint")).passed
    assert nb02.check_tanh_joint(tanh_joint_by_formula).passed


def test_tanh_joint_rejects_a_wrong_formula_and_a_second_tanh():
    verdict = nb02.check_tanh_joint(tanh_joint_wrong_formula)
    assert verdict.status == "failed" and "case 'f32[5]'" in verdict.text
    assert "1 - tanh(x)**2" in verdict.text
    verdict = nb02.check_tanh_joint(tanh_joint_recomputes)
    assert verdict.status == "failed" and "2 aten.tanh" in verdict.text
    assert "TanhBackward0 saves" in verdict.text


# -- 2. a default partitioner ------------------------------------------------------------------
def ancestors(roots, stop=frozenset()):
    seen, todo = set(), [r for r in roots if r is not None]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            if node not in stop:
                todo.extend(node.all_input_nodes)
    return seen


def partition_saving_only_primals(joint):  # wrong: the backward recomputes from the inputs
    nodes = list(joint.graph.nodes)
    primals = [n for n in nodes if n.op == "placeholder" and n.name.startswith("primals")]
    tangents = [n for n in nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    outputs = list(joint.graph.output_node().args[0])
    n_fwd = joint.meta["num_fwd_outputs"]
    fwd_outputs, grads = outputs[:n_fwd], [g for g in outputs[n_fwd:] if g is not None]
    reached = ancestors(grads, stop=set(primals))
    saved = [n for n in primals if n in reached]
    fwd_nodes = ancestors(fwd_outputs) | set(primals)
    forward = extract_graph(joint, primals, fwd_outputs + saved, fwd_nodes)
    backward = extract_graph(joint, saved + tangents, grads, (reached - set(saved)) | set(tangents))
    return forward, backward, [n.name for n in saved]


def reference_with_saved_reversed(joint):  # also right: the saved values in another order
    forward, backward, saved = solution("naive_partition")(joint)
    n_fwd, n_saved = joint.meta["num_fwd_outputs"], len(saved)

    def forward_reversed(*primals):
        out = forward(*primals)
        return (*out[:n_fwd], *out[n_fwd:][::-1])

    def backward_reversed(*args):
        return backward(*args[:n_saved][::-1], *args[n_saved:])

    return forward_reversed, backward_reversed, saved[::-1]


def test_naive_partition_accepts_the_reference():
    verdict = nb02.check_naive_partition(solution("naive_partition"))
    assert verdict.passed and verdict.cases == 4


def test_naive_partition_accepts_the_saved_values_in_any_order():
    verdict = nb02.check_naive_partition(reference_with_saved_reversed)
    assert verdict.passed and verdict.cases == 4


def test_naive_partition_rejects_saving_only_the_primals():
    verdict = nb02.check_naive_partition(partition_saving_only_primals)
    assert verdict.status == "failed" and "case 'sin**2 + cos**2'" in verdict.text
    assert "expected: ['cos', 'primals_1', 'sin']" in verdict.text
    assert "got:      ['primals_1']" in verdict.text
    assert "also reads ['sin', 'cos']" in verdict.text
    assert all(len(line) <= 100 for line in verdict.text.splitlines())


def test_naive_partition_rejects_a_saved_value_the_backward_does_not_read():
    def saves_the_output(joint):  # sin**2 + cos**2's output is never read by its backward
        forward, backward, saved = solution("naive_partition")(joint)
        return forward, backward, saved + [joint.graph.output_node().args[0][0].name]

    verdict = nb02.check_naive_partition(saves_the_output)
    assert verdict.status == "failed" and "never reads ['add']" in verdict.text


# -- 3. size_of ------------------------------------------------------------------------------
def test_size_of_accepts_the_reference():
    assert nb02.check_size_of(solution("size_of")).passed


def test_size_of_rejects_four_bytes_per_element_and_a_crash_on_tuples():
    verdict = nb02.check_size_of(lambda node: node.meta["val"].numel() * 4)
    assert verdict.status == "failed" and "int64[6]" in verdict.text
    assert "element_size()" in verdict.text
    tensors_only = lambda node: node.meta["val"].numel() * node.meta["val"].element_size()
    verdict = nb02.check_size_of(tensors_only)
    assert verdict.status == "error" and "raised AttributeError" in verdict.text
    assert "nll_loss_forward" in verdict.text


# -- 4. functionalisation --------------------------------------------------------------------
def functional_variant(op):
    name, _, overload = op.name().removeprefix("aten::").partition(".")
    return getattr(getattr(aten, name[:-1]), overload or "default")


def functionalize_rewriting_earlier_uses(gm):  # wrong: uses before the op see the new value
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.target.name().split(".")[0].endswith("_"):
            continue
        with graph.inserting_after(node):
            new = graph.call_function(functional_variant(node.target), node.args, node.kwargs)
        node.replace_all_uses_with(new)
        node.args[0].replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
        graph.erase_node(node)
    graph.lint()
    return fx.GraphModule(gm, graph)


def test_functionalize_accepts_the_reference():
    verdict = nb02.check_functionalize(solution("functionalize_inplace"))
    assert verdict.passed and verdict.cases == 4


def test_functionalize_rejects_rewriting_earlier_uses_and_keeping_the_old_value():
    verdict = nb02.check_functionalize(functionalize_rewriting_earlier_uses)
    assert verdict.status == "error" and "on case 'read_before'" in verdict.text
    assert "used before it has been defined" in verdict.text
    assert len(verdict.text.splitlines()) == 1 + 4  # the message cut to 4 lines

    def swap_targets_only(gm):
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target.name().split(".")[0].endswith("_"):
                node.target = functional_variant(node.target)
        gm.recompile()
        return gm

    verdict = nb02.check_functionalize(swap_targets_only)
    assert verdict.status == "failed" and "case 'scale_'" in verdict.text
    assert "read the new value" in verdict.text
