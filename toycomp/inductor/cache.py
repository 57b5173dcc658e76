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

NB: in PyTorch this lives in torch/_inductor/codecache.py (CppCodeCache, PyCodeCache,
write_atomic) and torch/_inductor/cpp_builder.py (compiler discovery and flags).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

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


def compile_cpp(source: str) -> Path:
    """Compile ``source`` to a shared library (or find it already compiled) and return its path."""
    cxx = find_cxx()
    key = content_hash(source, cxx, " ".join(CXXFLAGS), platform.machine())
    lib = cache_dir() / "cpp" / f"{key}.so"
    if lib.exists():
        return lib
    src = lib.with_suffix(".cpp")
    write_atomic(src, source)
    tmp_out = lib.with_name(f"{key}.{os.getpid()}.tmp.so")
    cmd = [cxx, *CXXFLAGS, str(src), "-o", str(tmp_out)]
    result = _run_compiler(cmd)
    if result.returncode != 0:
        raise CppCompileError(
            f"C++ compilation failed (exit {result.returncode}): {' '.join(cmd)}\n"
            f"{result.stderr.strip()}\n(source: {src})"
        )
    os.replace(tmp_out, lib)
    return lib


def load_cpp_library(source: str) -> ctypes.CDLL:
    """Compile (cached) and ``dlopen`` ``source``; the library stays loaded for the process."""
    path = compile_cpp(source)
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
