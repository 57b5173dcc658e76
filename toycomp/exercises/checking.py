"""Verdicts for the notebooks' coding exercises: one small module that every checker shares.

A notebook's checks live in ``toycomp/exercises/nb0N.py``. A check is a function decorated with
:func:`exercise`; it receives the student's function (or value), runs it on several cases with
:func:`call`, compares with toycomp's reference and with real PyTorch where there is a
counterpart, and fails with :func:`expect` (or :class:`Failure`). The decorator turns what happens
into a short :class:`Verdict`, shows it (one line on success), records it for grading, and
returns it. It never lets an exception out, so a student notebook runs to the end:

- every case passed: ``✓ nb02 ex1 default_partition: passed (3 cases)``;
- a case failed: ``✗ ...: wrong on case 'mlp'`` then ``expected:``, ``got:`` and ``hint:`` lines;
- the student's code raised a bare ``NotImplementedError()`` (the stub): ``… ...: not solved yet``;
- the student's code raised another exception: the case, the exception's type and message,
  and a hint where the check gives one (:func:`hint_on_error`).

A prediction ("how many graphs does this make?") is checked with :func:`expect_prediction`,
which names a wrong prediction but shows the expected value only after a correct answer or
``REVEAL_AFTER`` wrong tries of that exercise in the kernel.

Example (a check for ``double(t) = 2 * t``, written as in ``nb0N.py``):

>>> import torch
>>> from toycomp.exercises.checking import exercise, call, expect_close
>>> @exercise("00", 1, "double", points=1)
... def check_double(double):
...     for name, t in [("ones", torch.ones(3)), ("arange", torch.arange(4.0))]:
...         got = call(name, double, t)
...         expect_close(name, got, 2 * t, hint="multiply every element by 2")
>>> check_double(lambda t: t + t).passed
✓ nb00 ex1 double: passed (2 cases)
True
>>> _ = check_double(lambda t: t * t)
✗ nb00 ex1 double: wrong on case 'ones'
    expected: tensor([2., 2., 2.])
    got:      tensor([1., 1., 1.])
    hint:     multiply every element by 2
>>> def stub(t):
...     raise NotImplementedError()
>>> check_double(stub).status
… nb00 ex1 double: not solved yet (the exercise cell raises NotImplementedError)
'not solved'

In a notebook the check cell is one call, ``nb02.check_default_partition(default_partition)``.
In a Jupyter kernel the verdict is shown as a display output that carries, beside its text, a
JSON record (mimetype :data:`VERDICT_MIMETYPE`) that ``python -m toycomp.exercises grade`` reads;
elsewhere (tests, doctests, scripts) it is printed. Verdicts are deterministic (no addresses, no
timings), as nbval's strict mode needs. Every line is at most 100 characters: long values are
shortened with ``...``.

NB: PyTorch has no counterpart; this plays the part of nbgrader's autograded test cells.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import torch

VERDICT_MIMETYPE = "application/vnd.toycomp.verdict+json"
WIDTH = 100  # the longest line a verdict prints
MAX_LINES = 4  # the most lines a hint or an error message takes

# Every exercise defined so far, by id ("nb02.default_partition"), in definition order.
EXERCISES: dict[str, Exercise] = {}
# The last verdict of each exercise checked in this process (what a grader reads in-process).
RESULTS: dict[str, Verdict] = {}
# Wrong answers so far to each prediction exercise in this process (see expect_prediction).
TRIES: dict[str, int] = {}
REVEAL_AFTER = 3  # a prediction's expected value is shown from this wrong try on


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One graded exercise: ``notebook`` "02", its number there, a short ``name``, ``points``."""

    notebook: str
    number: int
    name: str
    points: int

    @property
    def id(self) -> str:
        return f"nb{self.notebook}.{self.name}"

    @property
    def label(self) -> str:
        return f"nb{self.notebook} ex{self.number} {self.name}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of one check: ``status`` is "passed", "failed", "error" or "not solved"."""

    exercise: Exercise
    status: str
    text: str
    cases: int = 0

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def score(self) -> int:
        return self.exercise.points if self.passed else 0

    def record(self) -> dict[str, Any]:
        """The JSON record that the grader reads from a notebook's outputs."""
        ex = self.exercise
        return {"id": ex.id, "notebook": ex.notebook, "number": ex.number, "name": ex.name,
                "points": ex.points, "status": self.status, "score": self.score}  # fmt: skip

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": self.text, VERDICT_MIMETYPE: self.record()}

    def _ipython_display_(self) -> None:
        """Nothing: the check displayed this verdict when it ran (a check cell's value would
        otherwise show it a second time)."""

    def __repr__(self) -> str:
        return self.text


class Failure(Exception):
    """Raised inside a check: which ``case`` went wrong, what was expected and got, a hint."""

    def __init__(self, case: str, expected: Any = None, got: Any = None, hint: str = "",
                 message: str = ""):  # fmt: skip
        super().__init__(message or f"wrong on case {case!r}")
        self.case, self.expected, self.got, self.hint = case, expected, got, hint
        self.message = message

    def lines(self) -> list[str]:
        head = self.message or f"wrong on case {self.case!r}"
        body = []
        if self.expected is not None or self.got is not None:
            body += [labelled("expected:", self.expected), labelled("got:", self.got)]
        if self.hint:
            body.append(labelled("hint:", self.hint, raw=True))
        return [head, *body]


class WrongPrediction(Failure):
    """A wrong prediction (see :func:`expect_prediction`): counted as one try of the exercise."""


class NotSolved(Exception):
    """The student's code raised NotImplementedError: the stub is still there."""


class StudentError(Exception):
    """The student's code raised an exception (other than the stub's) on ``case``; ``hint``
    (set by :func:`hint_on_error`) says what usually causes it."""

    def __init__(self, case: str, error: BaseException, hint: str = ""):
        super().__init__(case)
        self.case, self.error, self.hint = case, error, hint


def call(case: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run the student's ``fn`` on one case; its exceptions become NotSolved / StudentError."""
    if CaseCounter.active:
        CaseCounter.active[-1].cases.add(case)
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        if str(e):  # not the stub's bare NotImplementedError(): a limit the code reports
            raise StudentError(case, e) from e
        raise NotSolved() from e
    except (Failure, NotSolved, StudentError):
        raise
    except Exception as e:  # noqa: BLE001  (any error of the student's code is a verdict)
        raise StudentError(case, e) from e


@contextlib.contextmanager
def hint_on_error(hint: str | Callable[[BaseException], str]) -> Iterator[None]:
    """Give the verdict of an exception raised by the student's code inside the block a hint:
    a text, or a function of the exception (a raw message alone rarely says what to change)."""
    try:
        yield
    except StudentError as e:
        e.hint = e.hint or (hint(e.error) if callable(hint) else hint)
        raise


def expect(ok: bool, case: str, expected: Any = None, got: Any = None, hint: str = "") -> None:
    """Fail the check on ``case`` unless ``ok``."""
    if not ok:
        raise Failure(case, expected, got, hint)


def expect_equal(case: str, got: Any, expected: Any, hint: str = "") -> None:
    """Fail unless ``got == expected`` (plain Python values: names, lists, numbers)."""
    expect(got == expected, case, expected, got, hint)


def expect_close(case: str, got: Any, expected: torch.Tensor, hint: str = "",
                 rtol: float = 1e-4, atol: float = 1e-5) -> None:  # fmt: skip
    """Fail unless ``got`` is a tensor with ``expected``'s shape and dtype and close values
    (the project's fp32 tolerances; NaNs must match)."""
    if not isinstance(got, torch.Tensor):
        raise Failure(case, expected, got, hint or "return a tensor")
    if got.shape != expected.shape or got.dtype != expected.dtype:
        want, have = Text(describe(expected)), Text(describe(got))
        raise Failure(case, want, have, hint or "check the shape and dtype of the result")
    close = torch.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    if not close.all():
        if expected.numel() <= 8:
            raise Failure(case, expected, got, hint)
        where = [int(i) for i in (~close).nonzero()[0]]  # the first element that differs
        at = f"{describe(expected)}, element {where}:"
        raise Failure(case, Text(f"{at} {expected[tuple(where)].item():.6g}"),
                      Text(f"{at} {got[tuple(where)].item():.6g}"), hint)  # fmt: skip


# [Note: predictions are not multiple choice]
# A prediction exercise asks for small numbers ("how many graphs?"). A verdict that printed the
# expected value on a wrong guess would let a student copy it without predicting anything, so
# the expected value stays hidden until the exercise was passed once in this kernel or answered
# wrongly REVEAL_AFTER times: by then the student has tried, and the answer helps them understand.
# TRIES counts the wrong checks per exercise; ``judge`` updates it.
def expect_prediction(case: str, got: Any, expected: Any, hint: str = "") -> None:
    """Fail unless the prediction ``got == expected``; the expected value is shown only after a
    correct answer or REVEAL_AFTER wrong tries (see the Note above)."""
    if got == expected:
        return
    ex = CaseCounter.active[-1].exercise if CaseCounter.active else None
    tries = TRIES.get(ex.id, 0) + 1 if ex is not None else REVEAL_AFTER
    if tries < REVEAL_AFTER:
        expected = Text(f"(shown after a correct answer or {REVEAL_AFTER} wrong tries; "
                        f"wrong tries so far: {tries})")  # fmt: skip
    raise WrongPrediction(case, expected, got, hint)


def describe(t: torch.Tensor) -> str:
    """``float32[4, 8]``: a tensor's dtype and shape."""
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def shorten(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def labelled(label: str, value: Any, raw: bool = False) -> str:
    """``    expected: value``: a value shortened to fit the line; raw text (a hint, a message)
    wrapped onto as many lines as it needs."""
    prefix = f"    {label:<9} "
    if raw and isinstance(value, str):
        lines = textwrap.wrap(" ".join(value.split()), WIDTH - len(prefix)) or [""]
        if len(lines) > MAX_LINES:  # a long error message: its start says enough
            lines = lines[: MAX_LINES - 1] + [shorten(lines[MAX_LINES - 1] + " ...", WIDTH)]
        return "\n".join(p + line for p, line in zip([prefix] + [" " * len(prefix)] * 99, lines))
    return prefix + shorten(show(value), WIDTH - len(prefix))


class Text(str):
    """A string that a verdict shows as it is (other strings are shown with their quotes)."""


def show(value: Any) -> str:
    """A short, deterministic text for a value in a verdict."""
    if isinstance(value, Text):
        return str(value)
    if isinstance(value, torch.Tensor) and value.numel() > 8:
        flat = value.detach().flatten()[:4].tolist()
        head = ", ".join(f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)
                         for v in flat)  # fmt: skip
        return f"{describe(value)} [{head}, ...]"
    return repr(value)


def exercise(notebook: str, number: int, name: str, points: int = 1) -> Callable:
    """Declare a check: ``@exercise("02", 1, "default_partition", points=2)``.

    The decorated function receives what the student wrote and returns nothing; it raises
    :class:`Failure` (through :func:`expect` and friends) on a wrong case, and runs the student's
    code through :func:`call`. The wrapper returns the :class:`Verdict` and shows it.
    """
    ex = Exercise(notebook, number, name, points)
    EXERCISES[ex.id] = ex

    def decorate(check: Callable) -> Callable[..., Verdict]:
        @functools.wraps(check)
        def wrapper(*args: Any, **kwargs: Any) -> Verdict:
            verdict = judge(ex, check, args, kwargs)
            RESULTS[ex.id] = verdict
            show_verdict(verdict)
            return verdict

        wrapper.exercise = ex  # type: ignore[attr-defined]
        return wrapper

    return decorate


def judge(ex: Exercise, check: Callable, args: tuple, kwargs: dict) -> Verdict:
    """Run ``check`` and turn its outcome into a Verdict."""
    counter = CaseCounter(ex)
    try:
        with counter:
            check(*args, **kwargs)
    except NotSolved:
        why = "not solved yet (the exercise cell raises NotImplementedError)"
        return Verdict(ex, "not solved", shorten(f"… {ex.label}: {why}", WIDTH))
    except Failure as failure:
        if isinstance(failure, WrongPrediction):
            TRIES[ex.id] = TRIES.get(ex.id, 0) + 1
        head, *body = failure.lines()
        text = "\n".join([shorten(f"✗ {ex.label}: {head}", WIDTH), *body])
        return Verdict(ex, "failed", text, counter.count)
    except StudentError as e:
        kind = type(e.error).__name__
        head = shorten(f"✗ {ex.label}: your code raised {kind} on case {e.case!r}", WIDTH)
        lines = [head, labelled("message:", str(e.error) or kind, raw=True)]
        text = "\n".join(lines + [labelled("hint:", e.hint, raw=True)] * bool(e.hint))
        return Verdict(ex, "error", text, counter.count)
    TRIES[ex.id] = max(TRIES.get(ex.id, 0), REVEAL_AFTER)  # passed: no prediction left to hide
    n = counter.count
    cases = f" ({n} case{'s' * (n != 1)})" if n else ""
    return Verdict(ex, "passed", f"✓ {ex.label}: passed{cases}", n)


class CaseCounter:
    """Counts the distinct cases passed to :func:`call` while the check of ``exercise`` runs."""

    active: list[CaseCounter] = []

    def __init__(self, exercise: Exercise | None = None) -> None:
        self.exercise = exercise
        self.cases: set[str] = set()

    @property
    def count(self) -> int:
        return len(self.cases)

    def __enter__(self) -> CaseCounter:
        CaseCounter.active.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        CaseCounter.active.pop()


def show_verdict(verdict: Verdict) -> None:
    """Display the verdict in a Jupyter kernel (text + JSON record), print it elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    shell = get_ipython() if get_ipython else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        display(verdict._repr_mimebundle_(), raw=True)
    else:
        print(verdict.text)
