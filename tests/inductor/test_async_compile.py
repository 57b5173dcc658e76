"""Parallel compilation (toycomp/inductor/opt/async_compile.py, ``config.compile_threads``):
compilers overlap when the flag asks for several, never in ``teach``, results as eager's, and
errors reach the caller."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import toycomp
from toycomp.inductor import cache
from toycomp.inductor.opt import async_compile


@pytest.fixture
def overlap(tmp_path, monkeypatch):
    """The most compilers seen running at once, in a fresh cache (so every kernel compiles)."""
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_LIBRARIES", {})
    real, lock, state = cache._run_compiler, threading.Lock(), {"now": 0, "most": 0, "runs": 0}

    def counting(cmd):
        with lock:
            state["now"] += 1
            state["runs"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            time.sleep(0.2)  # long enough that parallel runs overlap for sure
            return real(cmd)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(cache, "_run_compiler", counting)
    return state


def three_kernels(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A row sum, a column max and a pointwise op: two kernels at least."""
    return x.sum(1), x.amax(0), torch.tanh(x) * 2


@pytest.mark.parametrize("threads", [4, 1, False])
def test_compilers_overlap_only_when_asked(overlap, threads):
    x = torch.randn(37, 53)
    with toycomp.config.patch(compile_threads=threads, **{"cpp.simdlen": 0}):  # no probes
        out = toycomp.compile(three_kernels, backend="cpp")(x)
    for got, want in zip(out, three_kernels(x)):
        torch.testing.assert_close(got, want)
    assert overlap["runs"] >= 2 and overlap["most"] == min(threads or 1, overlap["runs"])


def test_teach_compiles_one_kernel_at_a_time():
    assert toycomp.config.teach["compile_threads"] is False
    assert toycomp.config.fast["compile_threads"] is None


def test_the_first_error_is_raised_after_the_others_finish():
    done = []

    def load(i: int) -> int:
        if i == 1:
            raise ValueError("kernel 1 failed")
        time.sleep(0.05)
        done.append(i)
        return i

    with toycomp.config.patch(compile_threads=3):
        with pytest.raises(ValueError, match="kernel 1 failed"):
            async_compile.compile_all(load, [0, 1, 2])
        assert sorted(done) == [0, 2]
        assert async_compile.compile_all(lambda i: i * i, [1, 2, 3]) == [1, 4, 9]
