"""The optimisation ladder (toycomp/inductor/opt/ladder.py): rungs from teach to fast, each
compiled with its flags; the code it measures is the code those flags generate."""

from __future__ import annotations

import pytest
import torch

import toycomp
from toycomp.inductor.opt.ladder import COMPILE_TIME_PASSES, STEPS, ladder


def sincos(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_rungs_add_one_pass_each_from_teach(backend):
    rungs = ladder(sincos, torch.randn(64, requires_grad=True), backend=backend, repeat=1)
    steps = [name for name, _, backends in STEPS if backend in backends]
    assert [r.name for r in rungs] == ["teach", *(f"+ {s}" for s in steps)]
    assert rungs[0].flags == toycomp.config.teach
    for before, after in zip(rungs, rungs[1:]):
        changed = {k for k in after.flags if after.flags[k] != before.flags[k]}
        assert changed == {after.name.removeprefix("+ ")}
    assert all(r.kernels == 2 and r.ms > 0 for r in rungs)  # forward and backward: one each
    other_backend = {name for name, _, backends in STEPS if backend not in backends}
    differ = {k for k, v in toycomp.config.fast.items() if rungs[-1].flags[k] != v}
    assert differ - other_backend == set(COMPILE_TIME_PASSES)  # fast, but for compile time


def test_vector_math_rung_adds_its_preamble():
    rungs = {r.name: r for r in ladder(sincos, torch.randn(64), backend="cpp", repeat=1)}
    assert rungs["+ cpp.simdlen"].code_lines > rungs["+ cpp.row_buffers"].code_lines + 100
    assert rungs["teach"].kernels == 1
