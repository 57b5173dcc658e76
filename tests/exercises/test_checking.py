"""The verdict module every notebook checker shares: statuses, messages, line widths."""

from __future__ import annotations

import torch

from toycomp.exercises import checking
from toycomp.exercises.checking import call, exercise, expect_close, expect_equal


@exercise("99", 1, "double", points=2)
def check_double(double):
    for name, t in [("ones", torch.ones(3)), ("long", torch.arange(50.0))]:
        got = call(name, double, t)
        expect_close(name, got, 2 * t, hint="multiply every element by 2")


@exercise("99", 2, "names", points=1)
def check_names(names):
    expect_equal("three", call("three", names, 3), ["a0", "a1", "a2"], hint="use f-strings")


def test_passed_verdict_is_one_line(capsys):
    verdict = check_double(lambda t: t + t)
    assert verdict.passed and verdict.score == 2 and verdict.cases == 2
    assert capsys.readouterr().out == "✓ nb99 ex1 double: passed (2 cases)\n"
    assert checking.RESULTS["nb99.double"] is verdict


def test_failed_verdict_names_case_expected_got_and_hint(capsys):
    verdict = check_double(lambda t: t * 2 + (t > 10))
    assert verdict.status == "failed" and verdict.score == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "✗ nb99 ex1 double: wrong on case 'long'"
    assert lines[1] == "    expected: float32[50], element [11]: 22"
    assert lines[2] == "    got:      float32[50], element [11]: 23"
    assert lines[3] == "    hint:     multiply every element by 2"


def test_wrong_shape_or_dtype_is_described():
    verdict = check_double(lambda t: (2 * t).double())
    assert "expected: float32[3]\n" in verdict.text and "got:      float64[3]\n" in verdict.text


def test_stub_is_not_solved_without_traceback(capsys):
    def stub(t):
        raise NotImplementedError()

    verdict = check_double(stub)
    assert verdict.status == "not solved" and verdict.score == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "not solved yet" in out and "Traceback" not in out


def test_student_exception_names_case_and_error():
    verdict = check_names(lambda n: [f"a{i}" for i in range(n)][n])
    assert verdict.status == "error"
    assert "raised IndexError on case 'three'" in verdict.text
    assert "list index out of range" in verdict.text


def test_lines_are_at_most_100_characters():
    verdict = check_names(lambda n: ["x" * 300] * n)
    assert verdict.status == "failed"
    assert all(len(line) <= checking.WIDTH for line in verdict.text.splitlines())
    assert verdict.text.splitlines()[2].endswith("...")


def test_record_carries_the_grade():
    verdict = check_names(lambda n: [f"a{i}" for i in range(n)])
    assert verdict.record() == {"id": "nb99.names", "notebook": "99", "number": 2,
                                "name": "names", "points": 1, "status": "passed", "score": 1}
    bundle = verdict._repr_mimebundle_()
    assert bundle["text/plain"] == verdict.text
    assert bundle[checking.VERDICT_MIMETYPE]["score"] == 1


# -- predictions: the expected value is hidden until a correct answer or a few wrong tries -----
@exercise("99", 3, "guess", points=1)
def check_guess(guess):
    checking.expect_prediction("seven", call("seven", guess), 7, hint="count again")


def fresh_tries(exercise_id="nb99.guess"):
    checking.TRIES.pop(exercise_id, None)


def test_prediction_accepts_the_right_value():
    fresh_tries()
    assert check_guess(lambda: 7).passed


def test_wrong_prediction_hides_the_expected_value_until_the_last_tries():
    fresh_tries()
    for attempt in range(1, checking.REVEAL_AFTER):
        verdict = check_guess(lambda: 6)
        assert verdict.status == "failed" and "got:      6" in verdict.text
        assert "7" not in verdict.text and f"wrong tries so far: {attempt}" in verdict.text
    verdict = check_guess(lambda: 5)
    assert verdict.status == "failed" and "expected: 7" in verdict.text


def test_prediction_is_shown_after_a_correct_answer():
    fresh_tries()
    assert check_guess(lambda: 7).passed
    assert "expected: 7" in check_guess(lambda: 8).text


def test_a_not_implemented_error_with_a_message_is_an_error_not_the_stub():
    def unfinished(t):
        raise NotImplementedError("opcode TO_BOOL (line 1 of f)")

    verdict = check_double(unfinished)
    assert verdict.status == "error" and "opcode TO_BOOL" in verdict.text
