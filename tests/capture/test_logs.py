"""TOYCOMP_LOGS and toycomp.set_logs (toycomp/_logging.py): what each log prints, and when."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import toycomp
from toycomp import _logging

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def logs(caplog):
    """Turn logs on with ``logs(name=True...)``; all off again after the test."""
    caplog.set_level(logging.DEBUG, logger="toycomp")

    def turn_on(**names):
        toycomp.set_logs(**names)
        return caplog

    yield turn_on
    toycomp.set_logs()


def messages(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == f"toycomp.{name}"]


def with_break(x):
    y = torch.sin(x) * 2
    print("side effect")
    return y.cos()


def run_python(code: str, env_logs: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOYCOMP_LOGS=env_logs, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, *code], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=240)


def test_env_var_prints_each_break_with_reason_and_source_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch, toycomp
        def f(x):
            y = torch.sin(x) * 2
            print("side effect")
            return y.cos() + len(str(y.shape))
        toycomp.compile(f)(torch.randn(4))
    """))
    proc = run_python([str(script)], "graph_breaks", tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[toycomp.")]
    assert len(lines) == 1, proc.stderr  # one break, one message
    assert lines[0].startswith("[toycomp.graph_breaks] Graph break in f: print()")
    assert f'{script}:4: print("side effect")' in lines[0]
    assert proc.stdout == "side effect\n"  # the program's own output is untouched


def test_env_var_with_python_c(tmp_path):
    code = ("import torch, toycomp\n"
            "def f(x):\n    y = x.sin()\n    print('hi')\n    return y\n"
            "toycomp.compile(f)(torch.randn(3))")
    proc = run_python(["-c", code], "graph_breaks,recompiles", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[toycomp.graph_breaks] Graph break in f: print()" in proc.stderr
    assert "<string>:4" in proc.stderr  # where the break is, without source text to show


def test_unknown_log_name_is_an_error(tmp_path):
    proc = run_python(["-c", "import toycomp"], "graph_breaks,no_such_log", tmp_path)
    assert proc.returncode != 0 and "no_such_log" in proc.stderr
    with pytest.raises(ValueError, match="no_such_log"):
        toycomp.set_logs(no_such_log=True)


def test_logs_are_off_by_default(caplog):
    caplog.set_level(logging.DEBUG, logger="toycomp")
    toycomp.compile(with_break)(torch.randn(4))
    assert [r for r in caplog.records if r.name.startswith("toycomp.")] == []


def test_graph_breaks_and_recompiles(logs):
    caplog = logs(graph_breaks=True, recompiles=True)
    f = toycomp.compile(with_break)
    f(torch.randn(4))
    assert len(messages(caplog, "graph_breaks")) == 1 and not messages(caplog, "recompiles")
    f(torch.randn(4, dtype=torch.float64))  # a dtype guard fails: both frames recompile
    recompiles = messages(caplog, "recompiles")
    assert len(recompiles) == 2 and "with_break" in recompiles[0]
    assert "dtype" in recompiles[0] or "float32" in recompiles[0], recompiles[0]
    assert messages(caplog, "guards") == []  # only what was asked for


def test_guards_and_graph_code(logs):
    caplog = logs(guards=True, graph_code=True)
    toycomp.compile(lambda x: torch.sin(x) + 1)(torch.randn(3))
    (guards,), (code,) = messages(caplog, "guards"), messages(caplog, "graph_code")
    assert "L['x']" in guards and "torch.float32" in guards
    assert "torch.sin" in code and "def forward" in code


def test_aot_graphs_output_code_and_fallbacks(logs):
    caplog = logs(aot_graphs=True, output_code=True, fallbacks=True)
    x = torch.randn(4, 3, requires_grad=True)
    f = toycomp.compile(lambda x: torch.cumsum(x.sin(), 0).sum())  # cumsum runs eagerly
    with pytest.warns(UserWarning, match="cumsum"):
        f(x).backward()
    aot = messages(caplog, "aot_graphs")
    assert [m.split(":")[0] for m in aot] == ["AOT FORWARD GRAPH", "AOT BACKWARD GRAPH"]
    assert "aten.sin" in aot[0] and "tangents_1" in aot[1] and "aten.cumsum" in aot[1]
    code = messages(caplog, "output_code")
    assert len(code) == 2 and all("def call" in m or "call(" in m for m in code), code
    assert any("aten.cumsum" in m for m in messages(caplog, "fallbacks"))


def test_set_logs_off_again(logs):
    caplog = logs(graph_breaks=True)
    toycomp.set_logs()
    toycomp.compile(with_break)(torch.randn(4))
    assert messages(caplog, "graph_breaks") == []
    assert not _logging.log_enabled("graph_breaks")
