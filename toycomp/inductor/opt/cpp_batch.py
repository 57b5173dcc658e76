"""Batched C++ compiles (``toycomp.config.cpp.batch_kernels``): a graph's C++ kernels compiled as
a few translation units, one per compile thread, instead of one compiler run per kernel.

Input -> output: a graph's generated C++ kernels -> their loaded functions, the same ones a
loop of ``cpp.load`` returns, in the same order. Each unit is the kernels' ``#include`` lines
once, the code they all begin with once, then the rest of each kernel's source in a namespace
of its own (its helpers stay its own; its ``extern "C"`` function keeps its plain name)::

    #include <cmath>         <the lines all the    namespace toycomp_kernel_0 {   namespace ..._1 {
    ...                      kernels begin with>   <the rest of kernel_0>         <...>
                                                   }                              }

    >>> [len(g) for g in groups(list(range(5)), 2)]
    [3, 2]

[Note: why batch the C++ compiles]
A small kernel takes the compiler about 0.37 s, of which about 0.27 s is reading the standard
headers (<algorithm>, <cmath>, <limits>...: measured with g++ 12 on a 2-core x86 machine), the
same for every kernel. With a graph's kernels in ``compile_threads`` units the headers are read
once per unit, and so is the vector prefix all kernels begin with (opt/cpp_vector_prefix.py).
A unit is compiled with the flags of all the vector-math functions its kernels ask for
(opt/libmvec.py: ``-DTOYCOMP_SIMD_expf`` changes only the kernels that test it). A kernel
whose source is not a block of includes and then code is compiled alone, as is every kernel
of a unit that fails to compile (so that an error names its kernel, as before). The cache
keys the unit's source: a second process compiling the same graph finds it.

NB: Inductor compiles each C++ kernel in a file of its own, in its worker pool
(torch/_inductor/async_compile.py, ``cpp_pybinding``); its C++ wrapper mode reads the common
headers from a precompiled header (``config.cpp_cache_precompile_headers``, cpp_builder.py).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable, Sequence, TypeVar

from toycomp.inductor import cache
from toycomp.inductor.codegen import cpp
from toycomp.inductor.codegen.common import GeneratedKernel
from toycomp.inductor.opt import libmvec

T = TypeVar("T")
_INCLUDE = re.compile(r"^\s*#\s*include\b")
_WANTED = re.compile(r"^#if defined\(TOYCOMP_SIMD_(\w+)\)", re.MULTILINE)  # as cpp.load reads
# A line such as ``TOYCOMP_SAME_LIBM_1(tanhf)`` (opt/libmvec.py) defines functions under fixed
# assembly names (``toycomp_tanhf`` and its vector clones): once per unit, outside the namespaces.
_DEFINES_SYMBOL = re.compile(r"^TOYCOMP_[A-Z0-9_]+\(\w+\)\s*$")


def groups(items: Sequence[T], n: int) -> list[list[T]]:
    """``items`` in ``min(n, len(items))`` groups of even sizes, in order."""
    k = max(min(n, len(items)), 1)
    size, extra = divmod(len(items), k)
    bounds = [i * size + min(i, extra) for i in range(k + 1)]
    return [list(items[bounds[i] : bounds[i + 1]]) for i in range(k) if bounds[i + 1] > bounds[i]]


def split_includes(source: str) -> tuple[list[str], str] | None:
    """(the leading ``#include`` lines, the rest), or None where an include comes later (inside
    an ``#if``, say: it cannot move out of the namespace)."""
    lines = source.splitlines()
    i = 0
    while i < len(lines) and (_INCLUDE.match(lines[i]) or not lines[i].strip()):
        i += 1
    rest = lines[i:]
    if any(_INCLUDE.match(line) for line in rest):
        return None
    return [line.strip() for line in lines[:i] if line.strip()], "\n".join(rest)


def unit_source(kernels: Sequence[GeneratedKernel]) -> str:
    """One translation unit holding ``kernels`` (each must pass ``split_includes``): their
    includes, the code they all begin with (the vector prefix: opt/cpp_vector_prefix.py) once,
    then the rest of each in its namespace."""
    includes: list[str] = []
    bodies = []
    for g in kernels:
        head, body = split_includes(g.source)  # type: ignore[misc]
        includes += [line for line in head if line not in includes]
        bodies.append(body.splitlines())
    shared = _shared_prefix(bodies)
    rests = [body[shared:] for body in bodies]
    hoisted = [line for rest in rests for line in rest if _DEFINES_SYMBOL.match(line)]
    parts = ["\n".join(includes), "\n".join(bodies[0][:shared]),
             "\n".join(dict.fromkeys(hoisted))]
    for i, (g, rest) in enumerate(zip(kernels, rests)):
        rest = "\n".join(line for line in rest if not _DEFINES_SYMBOL.match(line))
        parts.append(f"namespace toycomp_kernel_{i} {{\n{rest}\n}}  // {g.name}")
    return "\n\n".join(parts) + "\n"


def _shared_prefix(bodies: list[list[str]]) -> int:
    """How many leading lines all ``bodies`` share, cut where a namespace may open: after a
    blank line outside any brace, ``#if`` or macro continuation."""
    same = 0
    while all(same < len(b) and b[same] == bodies[0][same] for b in bodies):
        same += 1
    cut, braces, conditions, continued = 0, 0, 0, False
    for i, line in enumerate(bodies[0][:same]):
        text = line.strip()
        if continued or text.startswith("#"):
            word = text.lstrip("#").split(maxsplit=1)[0] if text.lstrip("#") else ""
            if not continued and word.startswith("if"):
                conditions += 1
            elif not continued and word == "endif":
                conditions -= 1
            continued = line.endswith("\\")
            continue
        code = line.split("//", 1)[0]
        braces += code.count("{") - code.count("}")
        if not text and braces == 0 and conditions == 0:
            cut = i + 1
    return cut


def load_unit(kernels: Sequence[GeneratedKernel]) -> list[Callable[..., None]]:
    """Compile ``kernels`` as one unit and load each; one at a time if that fails."""
    if len(kernels) > 1:
        source = unit_source(kernels)
        wanted = _WANTED.findall(source)
        try:  # with the flags cpp.load gives it (its scalar fallback is for one kernel alone)
            cache.compile_cpp(source, libmvec.vector_math_flags(wanted) if wanted else ())
        except (cache.CppCompileError, OSError):
            return [cpp.load(g) for g in kernels]  # so that an error names the kernel at fault
        return [cpp.load(replace(g, source=source)) for g in kernels]  # (found compiled)
    return [cpp.load(g) for g in kernels]


def load_all(generated: Sequence[GeneratedKernel], units: int,
             run_all: Callable[[Callable, list], list]) -> list[Callable[..., None]]:
    """The kernels' functions, in order: ``units`` units, compiled by ``run_all(load_unit,
    units)`` (the compile pool)."""
    alone = [g for g in generated if split_includes(g.source) is None]
    batched = [g for g in generated if g not in alone]
    parts = groups(batched, units) + [[g] for g in alone]
    loaded = {}
    for part, fns in zip(parts, run_all(load_unit, parts)):
        loaded.update({g.name: fn for g, fn in zip(part, fns)})
    return [loaded[g.name] for g in generated]
