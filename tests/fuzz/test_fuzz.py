"""CI part of the random-program fuzzer: a fixed range of seeds on both backends, plus the
generator's own checks. ``python -m tests.fuzz`` runs any range and minimises failures.

Every seed renders to a standalone program (tests/fuzz/programs.py) that is compiled with
``toycomp.compile`` and compared with eager PyTorch, values and gradients. A failing seed prints
its reproducer; ``python -m tests.fuzz --seeds N --backend B`` prints it minimised.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any

import pytest
import torch

import toycomp
from tests.fuzz import programs

# Seeds that fail today, keyed (backend, seed), valued by the failure's signature ("restride":
# the wrapper's restride of a stride-0 result raises "unsupported operation: more than one
# element of the written-to tensor refers to a single memory location"). Others are
# fixing these bugs now; the xfails are strict, so a fix makes its seed XPASS and fail the run:
# then delete the entry (the list should end up empty).
KNOWN_FAILURES: dict[tuple[str, int], str] = {
}

# About 200 programs: 150 on C++, 50 on Triton's interpreter. Measured on 2 cores with an empty
# kernel cache: this file takes about 2.5 minutes, test_opinfo_sweep.py about 1.3.
CPP_SEEDS = range(0, 150)
TRITON_SEEDS = range(0, 50)
# The teach preset (toycomp.config.teach: every optimisation off) must be as correct: a share of
# the same seeds, to keep CI time (about a minute more).
TEACH_SEEDS = {"cpp": range(0, 50), "triton": range(0, 20)}


def _cases() -> list:
    cases = []
    fast = {"cpp": CPP_SEEDS, "triton": TRITON_SEEDS}
    for preset, table in (("fast", fast), ("teach", TEACH_SEEDS)):
        for backend, seeds in table.items():
            for seed in seeds:
                reason = KNOWN_FAILURES.get((backend, seed))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                name = f"{backend}-{seed}" if preset == "fast" else f"{backend}-teach-{seed}"
                cases.append(pytest.param(backend, seed, preset, marks=marks, id=name))
    return cases


@pytest.mark.parametrize("backend, seed, preset", _cases())
def test_random_program(backend: str, seed: int, preset: str) -> None:
    program = programs.generate(seed)
    with toycomp.config.patch(**getattr(toycomp.config, preset)):
        outcome = programs.check(program, backend)
    if outcome.cls in programs.FAILURES:
        pytest.fail(
            f"{outcome.cls}: {outcome.signature}\n{outcome.detail[:3000]}\n\n"
            f"Reproducer (minimise it with `python -m tests.fuzz --seeds {seed} "
            f"--backend {backend}`):\n\n{programs.render(program, backend)}",
            pytrace=False,
        )
    if outcome.cls in ("clear error", "fallback", "signed zero"):
        warnings.warn(f"fuzz seed {seed} [{backend}, {preset}]: {outcome.cls}: {outcome.signature}")


# --- the generator itself (no compilation) ------------------------------------------------------
def test_programs_are_reproducible_from_the_seed() -> None:
    for seed in (0, 1, 123, 4567):
        assert programs.generate(seed) == programs.generate(seed)
        assert programs.render(programs.generate(seed)) == programs.render(programs.generate(seed))
    assert programs.generate(1) != programs.generate(2)


def test_programs_are_valid_and_cover_every_op_kind() -> None:
    """Shape-correct by construction, finite in eager (fp32 and fp64), all kinds in CI seeds."""
    seen: collections.Counter = collections.Counter()
    for seed in CPP_SEEDS:
        program = programs.generate(seed)
        assert 3 <= len(program.ops) <= 8, seed
        assert programs.reference(program) is not None, programs.render(program)
        seen.update(program.kinds())
    assert set(programs.KINDS) - set(seen) == set()


def test_reproducer_runs_as_a_script(capsys: pytest.CaptureFixture) -> None:
    program = programs.generate(3)
    assert programs.check(program, "cpp").cls == "ok"
    exec(compile(programs.render(program, "cpp"), "<reproducer>", "exec"), {})  # noqa: S102
    assert capsys.readouterr().out.strip().endswith("ok")


def test_rendered_reproducer_is_the_program_checked() -> None:
    program = programs.generate(3)
    namespace = programs.load(program)
    expected = programs.reference(program)
    assert expected is not None
    for got, want in zip(namespace["run"](namespace["fn"]), expected[0]):
        assert (got is None and want is None) or got.equal(want)
    assert "toycomp.compile(fn, backend='cpp')" in programs.render(program, "cpp")


def test_minimize_drops_ops_and_shrinks_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a stand-in bug ("any program with an amin fails"), minimise keeps one amin."""
    seed = next(s for s in range(1000) if programs.generate(s).kinds().count("amin") == 1
                and len(programs.generate(s).ops) >= 5)
    bug = programs.Outcome("wrong", "wrong grads (NaN)")

    def fake_check(program: programs.Program, backend: str) -> programs.Outcome:
        return bug if "amin" in program.kinds() else programs.Outcome("ok", "ok")

    monkeypatch.setattr(programs, "check", fake_check)
    small, _ = programs.minimize(programs.generate(seed), "cpp", bug, budget=200)
    assert small.kinds() == ["amin"], programs.render(small)
    assert all(size <= 3 for i in small.inputs for size in i.shape)


def test_errors_are_classified_by_whether_they_name_the_construct() -> None:
    clear = [
        NotImplementedError("toycomp.aot: aten.add_.Tensor (in-place) is not supported"),
        NotImplementedError("Triton backend: dtype torch.float64 is not supported"),
    ]
    unclear = [
        RuntimeError("unsupported operation: more than one element of the written-to tensor "
                     "refers to a single memory location. Please clone() the tensor"),
        RuntimeError("toycomp.aot: aten.squeeze.dim changed shape torch.Size([3])"),
        IndexError("index 3 is out of bounds"),
        NotImplementedError(""),
    ]
    assert [programs.classify_error(e).cls for e in clear] == ["clear error"] * len(clear)
    assert [programs.classify_error(e).cls for e in unclear] == ["unclear error"] * len(unclear)
    sig = programs.classify_error(RuntimeError("buf12 has shape [3, 4], not [5, 4]")).signature
    assert sig == "RuntimeError: buf# has shape (shape), not (shape)"


def test_check_catches_wrong_values_gradients_and_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in compilers that are slightly off, off in the backward only, or NaN are caught."""
    import toycomp  # noqa: PLC0415

    def add(delta: float, backward_only: bool = False) -> Any:
        class Shift(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
                return x.clone() if backward_only else x + delta

            @staticmethod
            def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
                return g + delta if backward_only else g

        def compile_(fn: Any, backend: Any = None) -> Any:
            def run(*args: Any) -> Any:
                out = fn(*args)
                return tuple(map(Shift.apply, out)) if isinstance(out, tuple) else Shift.apply(out)
            return run

        return compile_

    program = programs.Program(
        seed=0,
        inputs=(programs.Input("x0", (4, 5), "transposed", (0, 1)), programs.Input("x1", (5,))),
        ops=(programs.Op("v0", "sin", ("x0",)), programs.Op("v1", "mul", ("v0", "x1"))),
        outputs=("v1",),
    )
    cases = [(add(1e-3), "wrong values"), (add(1e-3, True), "wrong grads"),
             (add(float("nan")), "wrong values (NaN)")]
    for compile_, signature in cases:
        monkeypatch.setattr(toycomp, "compile", compile_)
        assert programs.check(program, "cpp").signature == signature
