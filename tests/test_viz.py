"""viz.draw: saved values, fused groups and stored buffers are visible in the DOT and the text."""

import torch
import torch.fx

import toycomp


def sin_twice(x):
    return torch.sin(x) * 2


def test_stored_values_are_outlined_and_named():
    gm = torch.fx.symbolic_trace(sin_twice)
    drawing = toycomp.viz.draw(gm, title="t", stored={"sin": "buf0"})
    assert "stored: buf0" in drawing.source and "stored: buf0" in drawing.text
    plain = toycomp.viz.draw(gm, title="t")
    assert "buf0" not in plain.source and "penwidth" not in plain.source


def test_groups_are_clusters_and_saved_values_are_coloured():
    gm = torch.fx.symbolic_trace(sin_twice)
    drawing = toycomp.viz.draw(gm, title="t", groups={"kernel_0": ["sin", "mul"]}, saved=["sin"])
    assert "subgraph cluster_kernel_0" in drawing.source
    sin_line = next(line for line in drawing.source.splitlines() if line.strip().startswith("sin "))
    assert "#f5a623" in sin_line
