"""Stage 4, code generation: one fused ``ir.Kernel`` -> the source text of one kernel.

Input IR -> output: a ``Kernel`` (loops of ``Store`` / ``Reduce`` over the flat variables ``x``
and ``r``) -> a ``common.GeneratedKernel``: C++ source (an OpenMP loop nest, compiled by
``cache.py`` and called through ``ctypes``) or a Python module with one ``@triton.jit`` kernel,
plus the wrapper line that launches it. The body of ``sin(x)**2 + cos(x)**2`` in both::

    float tmp1, tmp3;                       tmp1 = tl.sin(tmp0)
    toycomp_sincosf(tmp0, &tmp1, &tmp3);    tmp2 = tmp1 * tmp1
    float tmp2 = tmp1 * tmp1;               tmp3 = tl.cos(tmp0)

(``cpp.py`` and ``triton.py`` print whole kernels in their docstrings, run as doctests.)

Files, in reading order:

* ``common.py``: what both languages share: ``IndentedBuffer``, the ten-line ``CSE``, the index
  printer, and ``KernelCodegen``, which walks a kernel into loads / compute / stores sections;
* ``cpp_prefix.py``: the C++ text every C++ kernel starts with (helpers, vector libm macros);
* ``cpp_utils.py``: C++ spellings of dtypes, indices and prims (the rule table ``CPP_OPS``);
* ``cpp.py``: the C++ backend;
* ``cpp_layout.py``: the loop order of each part of a C++ reduction kernel (rows or columns);
  sibling reductions merged, kernels mixing both split;
* ``cpp_reduction.py``: the loop nests of C++ reductions: row layout, or the column layout
  (tiles of outputs, r outside);
* ``cpp_row_buffers.py``: values a row reduction would compute twice, kept in an array;
* ``triton_helpers.py``: the Triton rule table ``TRITON_OPS`` and its ``tl.*``-only helpers;
* ``triton_heuristics.py``: Triton block sizes and index dtype (per call with dynamic shapes);
* ``triton.py``: the Triton backend (masks, persistent and looped reductions).

NB: in PyTorch this lives in torch/_inductor/codegen/common.py (IndentedBuffer, CSE, Kernel),
codegen/cpp.py (CppKernel, CppVecKernel), codegen/triton.py (TritonKernel) and
codegen/simd.py (what the Triton and Halide backends share).
"""
