"""capture_graph: one function's one graph, with the real inputs it reads (notebooks 02, 03)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from toycomp.capture.captured_graph import capture_graph


def test_graph_of_a_module_reads_its_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))

    def loss_fn(x, y):
        return F.cross_entropy(model(x), y)

    x, y = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    captured = capture_graph(loss_fn, x, y)
    assert sum(n.op == "placeholder" for n in captured.gm.graph.nodes) == 6  # x, y, 4 params
    params = {id(p) for p in model.parameters()}
    assert sum(id(t) in params for t in captured.example_inputs) == 4
    (out,) = captured.gm(*captured.example_inputs)
    torch.testing.assert_close(out, loss_fn(x, y))
    x2, y2 = torch.randn(5, 4), torch.tensor([1, 1, 2, 0, 0])  # same guards, new values
    (out2,) = captured.gm(*captured.flatten_inputs(x2, y2))
    torch.testing.assert_close(out2, loss_fn(x2, y2))
    assert "L['x']" in captured.guards


def test_capturing_runs_nothing_of_fn():
    log = []

    def f(x):
        log.append(1)
        return x.add_(1) * 2

    x = torch.zeros(3)
    captured = capture_graph(f, x)
    assert log == [] and x.tolist() == [0.0, 0.0, 0.0]  # traced on fakes, side effects not run
    assert [n.op for n in captured.gm.graph.nodes].count("call_method") == 1


def test_a_graph_break_is_refused_with_its_reason():
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x

    with pytest.raises(RuntimeError, match="capture_graph: .*toycomp.explain"):
        capture_graph(f, torch.ones(3))
