"""NumPy values reaching a graph operation: scalars become numbers, arrays break the graph."""

import numpy as np
import torch

from toycomp.capture.convert_frame import explain


def tensor_from_arange(x):
    return torch.sin(x) + torch.tensor(np.arange(x.shape[0]), dtype=torch.float32)


SCALE = np.float64(2.0)


def scaled_by_numpy_scalar(x):
    return torch.sin(x) * SCALE


def test_a_numpy_array_argument_breaks_the_graph_and_matches_eager():
    x = torch.randn(5)
    out = explain(tensor_from_arange, x)
    torch.testing.assert_close(out.out, tensor_from_arange(x))
    assert any("ndarray passed to a tensor operation" in r for r in out.break_reasons)


def test_a_numpy_scalar_argument_is_a_number_in_the_graph():
    x = torch.randn(5)
    out = explain(scaled_by_numpy_scalar, x)
    torch.testing.assert_close(out.out, scaled_by_numpy_scalar(x))
    assert out.graph_count == 1 and not out.break_reasons
