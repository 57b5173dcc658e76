"""Stage 4d: source text -> loaded code, cached on disk by content hash.

Input -> output: C++ source -> a shared library loaded with ``ctypes`` (compiled once by the system
compiler); Triton/Python source -> an imported module (Triton's ``@triton.jit`` reads the source
back with ``inspect``, so it must live in a real file).

    >>> lib = load_cpp_library('extern "C" int one() { return 1; }')
    >>> lib.one()
    1

Files go to ``$TOYCOMP_CACHE_DIR`` (default ``~/.cache/toycomp``) under ``cpp/`` and ``triton/``,
named by the SHA-256 of everything that determines the result (source, compiler, flags, machine).
A second request for the same source finds the file and never starts the compiler.

``vector_math_flags`` says which glibc vector math functions (libmvec) C++ kernels may call on
this machine; see [Note: vectorised libm] in cpp.py. Setting ``TOYCOMP_VECTOR_MATH=0`` turns
them off (every kernel then calls the scalar libm).

NB: in PyTorch this lives in torch/_inductor/codecache.py (CppCodeCache, PyCodeCache,
write_atomic) and torch/_inductor/cpp_builder.py (compiler discovery and flags).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import platform
import math
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Iterable, Sequence

# [Note: C++ flags]
# -O3 -march=native: vectorise for this CPU (so -march=native is part of the cache key through
# platform.machine(); a cache shared between different CPUs of one architecture is not supported).
# -fopenmp: `#pragma omp parallel for` / `simd`. -fno-math-errno lets the compiler inline sqrt and
# friends; it changes no result. Never -ffast-math: it would break NaN propagation in max/min.
CXXFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC")

_LIBRARIES: dict[Path, ctypes.CDLL] = {}
_MODULES: dict[Path, ModuleType] = {}


class CppCompileError(RuntimeError):
    """The C++ compiler is missing or rejected the generated source (message included)."""


def cache_dir() -> Path:
    """``$TOYCOMP_CACHE_DIR`` or ``~/.cache/toycomp``, created on first use."""
    path = Path(os.environ.get("TOYCOMP_CACHE_DIR") or Path.home() / ".cache" / "toycomp")
    path.mkdir(parents=True, exist_ok=True)
    return path


def content_hash(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write via a temporary file and rename, so a concurrent reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def find_cxx() -> str:
    """The C++ compiler: ``$CXX``, else ``g++``, ``c++`` or ``clang++`` on the PATH."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    for name in ("g++", "c++", "clang++"):
        if shutil.which(name):
            return name
    raise CppCompileError(
        "toycomp's C++ backend needs a C++ compiler with OpenMP: none of $CXX, g++, c++, clang++ "
        "was found (install g++, e.g. `apt-get install g++`, or use backend='triton')"
    )


def _run_compiler(cmd: list[str]) -> subprocess.CompletedProcess:
    """The one place that starts the compiler (tests replace it to prove cache hits)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise CppCompileError(f"C++ compiler {cmd[0]!r} not found ({e})") from e


def compile_cpp(source: str, extra_flags: Sequence[str] = ()) -> Path:
    """Compile ``source`` to a shared library (or find it already compiled) and return its path.

    Args:
        source: a C++ translation unit (``extern "C"`` functions).
        extra_flags: added after ``CXXFLAGS`` and the source file (``-D...``, ``-lmvec``); part
            of the cache key, so one source compiled with other flags is another library.
    """
    cxx = find_cxx()
    key = content_hash(source, cxx, " ".join((*CXXFLAGS, *extra_flags)), platform.machine())
    lib = cache_dir() / "cpp" / f"{key}.so"
    if lib.exists():
        return lib
    src = lib.with_suffix(".cpp")
    write_atomic(src, source)
    tmp_out = lib.with_name(f"{key}.{os.getpid()}.tmp.so")
    cmd = [cxx, *CXXFLAGS, str(src), "-o", str(tmp_out), *extra_flags]
    result = _run_compiler(cmd)
    if result.returncode != 0:
        raise CppCompileError(
            f"C++ compilation failed (exit {result.returncode}): {' '.join(cmd)}\n"
            f"{result.stderr.strip()}\n(source: {src})"
        )
    os.replace(tmp_out, lib)
    return lib


def load_cpp_library(source: str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile (cached) and ``dlopen`` ``source``; the library stays loaded for the process."""
    path = compile_cpp(source, extra_flags)
    if path not in _LIBRARIES:
        _LIBRARIES[path] = ctypes.CDLL(str(path))
    return _LIBRARIES[path]


def load_python_module(source: str, prefix: str) -> ModuleType:
    """Write ``source`` to ``<cache>/<prefix>/<hash>.py`` and import it (once per process)."""
    key = content_hash(source)
    path = cache_dir() / prefix / f"{prefix}_{key}.py"
    if path in _MODULES:
        return _MODULES[path]
    if not path.exists() or path.read_text() != source:
        write_atomic(path, source)
    spec = importlib.util.spec_from_file_location(f"toycomp_{prefix}_{key}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # inspect.getsource needs to find the module again
    spec.loader.exec_module(module)
    _MODULES[path] = module
    return module


# --- vector math (glibc's libmvec), see [Note: vectorised libm] in cpp.py ----------------------
# float function -> (arity, Python reference) for the probe
_VECTOR_MATH_CANDIDATES = {
    "expf": (1, math.exp), "logf": (1, math.log), "log1pf": (1, math.log1p),
    "sinf": (1, math.sin), "cosf": (1, math.cos), "tanhf": (1, math.tanh),
    "erff": (1, math.erf), "powf": (2, math.pow),
}  # fmt: skip
_PROBE_INPUTS = [0.25 + 0.37 * i for i in range(40)]  # 40: vector iterations and a remainder
_probe_lock = threading.Lock()
_probed: dict[str, frozenset[str]] = {}  # compiler -> functions that work


def vector_math_flags(functions: Iterable[str]) -> tuple[str, ...]:
    """Compiler flags that turn the ``TOYCOMP_SIMD_<fn>`` declarations of a kernel into vector
    calls, for those of ``functions`` this machine's libmvec provides; ``()`` for none."""
    available = sorted(set(functions) & vector_math_functions())
    if not available:
        return ()
    flags = [f"-DTOYCOMP_SIMD_{fn}" for fn in available]
    flags += [f"-fno-builtin-{fn}" for fn in available]
    return (*flags, "-lmvec")


def vector_math_functions() -> frozenset[str]:
    """The float libm functions whose libmvec versions compile, load and compute correctly here
    (probed once per process and compiler; the probe library is cached on disk like a kernel).
    Empty when ``TOYCOMP_VECTOR_MATH=0``, off Linux, or when anything about the probe fails."""
    if os.environ.get("TOYCOMP_VECTOR_MATH", "1") == "0" or platform.system() != "Linux":
        return frozenset()
    try:
        cxx = find_cxx()
    except CppCompileError:
        return frozenset()
    with _probe_lock:
        if cxx not in _probed:
            _probed[cxx] = probe_vector_math(sorted(_VECTOR_MATH_CANDIDATES))
        return _probed[cxx]


def probe_vector_math(functions: Sequence[str]) -> frozenset[str]:
    """Compile, load and run a vectorised loop over each of ``functions``: all at once, and if
    that fails, one by one. Returns those that work; never raises."""
    if _probe_works(functions):
        return frozenset(functions)
    if len(functions) == 1:
        return frozenset()
    return frozenset(fn for fn in functions if _probe_works([fn]))


def _probe_works(functions: Sequence[str]) -> bool:
    lines = ["#include <math.h>"]
    for fn in functions:
        arity = _VECTOR_MATH_CANDIDATES[fn][0]
        args = ", ".join(["float"] * arity)
        call = f"{fn}(in[i], 1.5f)" if arity == 2 else f"{fn}(in[i])"
        lines += [
            f'extern "C" float {fn}({args}) __attribute__((__simd__("notinbranch")));',
            f'extern "C" void probe_{fn}(const float* in, float* out, int n) {{',
            f"    #pragma omp simd\n    for (int i = 0; i < n; i++) out[i] = {call};\n}}",
        ]
    flags = [f"-fno-builtin-{fn}" for fn in functions] + ["-lmvec"]
    try:
        lib = load_cpp_library("\n".join(lines) + "\n", flags)
        n = len(_PROBE_INPUTS)
        inputs, out = (ctypes.c_float * n)(*_PROBE_INPUTS), (ctypes.c_float * n)()
        for fn in functions:
            arity, ref = _VECTOR_MATH_CANDIDATES[fn]
            getattr(lib, f"probe_{fn}")(inputs, out, ctypes.c_int(n))
            for x, y in zip(inputs, out):
                expected = ref(x, 1.5) if arity == 2 else ref(x)
                if not math.isclose(y, expected, rel_tol=1e-5, abs_tol=1e-6):
                    return False
        return True
    except Exception:  # a missing libmvec, an old glibc, another compiler: no vector math
        return False
