"""Stage 4's optimisations: every measure that exists only for speed, one pass a file.

Input -> output: each pass takes what a core step made and returns the same IR, only faster to
run; each sits behind a flag of ``toycomp.config`` and is entered at a named hook point of the
core, which otherwise knows nothing of it. With ``toycomp.config.teach`` none of them runs, and the
values and gradients are the same (docs/passes.md lists the passes, flags and hooks)::

    hook                      flag                          pass
    after lowering            split_reductions              split_reduction.py (+ mix-order
                              triton.mix_order_reduction      reductions)
    lowering a convolution    layout_optimization           layout_optimization.py (CUDA:
                                                              channels-last activations;
    lowering a graph's output                                   outputs in eager's layout)
    C++ code generation       cpp.simdlen                   libmvec.py (vector libm, toycomp's
                                                              one sincos), cpp_vector_prefix.py
                              cpp.layouts                   cpp_layout.py (columns, planes)
                              cpp.row_buffers               cpp_row_buffers.py
    Triton code generation    triton.eviction_hints,        codegen/triton.py (hooks there)
                              triton.divisible_by_16
    at launch (CUDA)          triton.lean_launch            codegen/triton.py, _triton_compat.py
    in the wrapper            memory_planning               memory_planning.py
                              compile_threads               async_compile.py (kernels compiled
                                                              in a pool of threads; Triton's
                                                              ahead of the first run)
    as AOT starts (CUDA)      triton.compile_workers        triton_worker.py (Triton's compiles
                                                              in worker processes)
                              cpp.batch_kernels             async_compile.py (one file a thread)
                              kernel_cache                  cache.py (libraries kept on disk)
    at launch (CUDA)          max_autotune                  autotune.py
    around the compiled graph triton.cudagraphs             cudagraphs.py

``ladder.py`` compiles an example with the passes switched on one at a time (notebook 04).

NB: in PyTorch these are Inductor's passes and backend subclasses, each switched by a flag of
torch/_inductor/config.py (split_reductions, memory_planning, max_autotune, cpp.simdlen,
triton.cudagraphs, triton.mix_order_reduction); tinygrad keeps its own in codegen/opt/.
"""
