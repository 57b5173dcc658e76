"""Stage 4d: source text -> loaded code.

Input -> output: C++ source -> a shared library loaded with ``ctypes`` (compiled by the system
compiler); Triton/Python source -> an imported module (Triton's ``@triton.jit`` reads the source
back with ``inspect``, so it must live in a real file).

    >>> lib = load_cpp_library('extern "C" int one() { return 1; }')
    >>> lib.one()
    1

Without ``config.kernel_cache`` (teach), each C++ source compiles once per process into a fresh
private temporary folder. With it (fast), libraries are cached per user in ``$TOYCOMP_CACHE_DIR``
(default ``~/.cache/toycomp``, 0700) as ``cpp/<key>.cpp``, ``.so``, ``.json`` (the manifest:
SHA-256 of the source and of the library, written last) and ``.lock`` (held while one thread or
process builds it), keyed by all that changes the binary: source, compiler path and
``--version``, flags, and the CPU features ``-march=native`` sees ([Note: cache security]).
Triton modules (``triton/``) and autotuning's choices (``autotune/``) are kept there too.

NB: in PyTorch this lives in torch/_inductor/codecache.py (CppCodeCache, PyCodeCache,
write_atomic) and torch/_inductor/cpp_builder.py (compiler discovery and flags).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Iterator, Sequence

import toycomp.config as config

try:
    import fcntl
except ImportError:  # not POSIX: no build lock, so concurrent misses may compile twice (safely)
    fcntl = None  # type: ignore[assignment]

# [Note: C++ flags]
# -O3 -march=native: vectorise for this CPU (so the CPU's features are part of the cache key, and
# a cache shared between machines with different CPUs keeps one entry per CPU). -fopenmp:
# `#pragma omp parallel for` / `simd`. -fno-math-errno lets the compiler inline sqrt and
# friends; it changes no result. Never -ffast-math: it would break NaN propagation in max/min.
# -ffp-contract=off -fwrapv say again what the preamble's `#pragma GCC optimize` lines say: GCC
# does not inline a function whose optimize options differ from its caller's, so without them
# <cmath>'s std::abs stayed a call and kept the loop around it scalar (log(|x| + 1) on 4M floats
# with AVX2: 190 ms instead of 2).
CXXFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-ffp-contract=off",
            "-fwrapv", "-shared", "-fPIC")  # fmt: skip

# [Note: forcing AVX2]
# A machine with AVX-512 can run the code an AVX2-only machine gets: `cpp.simdlen = 256`, or
# ATEN_CPU_CAPABILITY=avx2 as for eager PyTorch and Inductor (torch/_inductor/cpu_vec_isa.py
# reads the same variable), adds -mno-avx512f after -march=native: no AVX-512 instruction, so
# the preamble picks glibc's 8-lane vector functions (_ZGVdN8...) and GCC 8-lane loops, as on an
# AVX2-only CPU. Other values of the variable (`default`, `avx512`) leave the flags as they are.
def isa_flags() -> tuple[str, ...]:
    """The flags that narrow ``-march=native`` to the vector width asked for (x86 only)."""
    wanted = config.cpp.simdlen or {"avx2": 256}.get(os.environ.get("ATEN_CPU_CAPABILITY", ""))
    return ("-mno-avx512f",) if wanted == 256 and platform.machine() in ("x86_64", "AMD64") else ()

# [Note: cache security]
# Loading a cached library runs its code in the user's process: whoever can write the cache can
# run code as the user. So the directory is the trust boundary. It is created 0700, and a cache
# directory (or its cpp/, triton/) that another user owns or that group or others can write is
# refused with CacheDirError, which says the fix. Within it, an entry is loaded only if its files
# are ours and not group/other-writable, and its manifest names this source (full SHA-256: the
# 96-bit key is only a file name) and this library (the SHA-256 of its bytes, read just before
# dlopen). Anything else is a corrupt entry and is rebuilt: a truncated file, a crash between
# writing the library and its manifest, a plant left from before the directory was made private.
# Files appear only by os.replace of a complete temporary file, unique per thread and process,
# so no reader sees half a file. Python modules run from the source string we were given, never
# from __pycache__ (a planted .pyc whose header matches the file's mtime and size would run).
# Not covered: other processes of the same user, and the moment between hashing a library and
# dlopen-ing it by path (only the owner can write there). A cache that is not writable
# (read-only home, chmod 555) still serves hits; misses compile into a private temporary
# directory for the rest of the process, with one warning.

_LIBRARIES: dict[Path, ctypes.CDLL] = {}
_COMPILED: dict[tuple[str, tuple[str, ...]], Path] = {}  # (source, flags) -> library, no cache
_MODULES: dict[Path, ModuleType] = {}
_TEMP_DIRS: dict[Path, Path] = {}  # unwritable cache directory -> this process's stand-in
_temp_lock = threading.Lock()  # _TEMP_DIRS and _LIBRARIES


class CppCompileError(RuntimeError):
    """The C++ compiler is missing or rejected the generated source (message included)."""


class CacheDirError(RuntimeError):
    """The cache directory is not private to this user, so toycomp refuses to load code from it."""


# --- the directory -------------------------------------------------------------------------------
def cache_dir() -> Path:
    """``$TOYCOMP_CACHE_DIR`` or ``~/.cache/toycomp``: created 0700 if missing, and refused with
    ``CacheDirError`` when another user owns it or group or others can write to it."""
    path = Path(os.environ.get("TOYCOMP_CACHE_DIR") or Path.home() / ".cache" / "toycomp")
    with contextlib.suppress(OSError):  # read-only parent: every lookup misses, see _build_dir
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(path)
    return path


def check_private(path: Path) -> None:
    """Raise ``CacheDirError`` (saying how to fix it) unless ``path``, if it exists, is a
    directory owned by this user that nobody else can write to."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or others_write:
        raise CacheDirError(_refusal(path, st))


def _refusal(path: Path, st: os.stat_result) -> str:
    """What is wrong with the cache directory ``path``, and how to fix it."""
    me, planted = os.geteuid(), "so another user could plant code that runs in your process"
    if not stat.S_ISDIR(st.st_mode):
        problem, fix = "it is not a directory", "set TOYCOMP_CACHE_DIR to a directory"
    elif st.st_uid != me:
        problem = f"it belongs to uid {st.st_uid}, not to you (uid {me}), {planted}"
        fix = "set TOYCOMP_CACHE_DIR to a directory of your own, or unset it (~/.cache/toycomp)"
    else:
        mode = stat.S_IMODE(st.st_mode)
        problem = f"it is writable by group or others (mode {mode:o}), {planted}"
        fix = f"chmod 700 {path}, or set TOYCOMP_CACHE_DIR to a private directory"
    return f"toycomp refuses the kernel cache {path}: {problem}. Fix: {fix}."


def _entry_dir(kind: str) -> Path:
    """``<cache>/<kind>``, where entries are looked up (checked; it may not exist)."""
    path = cache_dir() / kind
    check_private(path)
    return path


def _build_dir(kind: str) -> Path:
    """Where a miss is built: ``<cache>/<kind>``, or while the cache is not writable a private
    temporary directory for the rest of the process (with one warning)."""
    path = _entry_dir(kind)
    with contextlib.suppress(OSError):
        path.mkdir(mode=0o700, exist_ok=True)
    if path.is_dir() and os.access(path, os.W_OK | os.X_OK):
        return path
    return _temp_build_dir(path.parent, kind)  # a read-only cache


def _temp_build_dir(root: Path, kind: str) -> Path:
    """This process's private stand-in for the unwritable cache ``root`` (warned once)."""
    with _temp_lock:
        if root not in _TEMP_DIRS:
            _TEMP_DIRS[root] = Path(tempfile.mkdtemp(prefix="toycomp-"))  # 0700
            atexit.register(shutil.rmtree, _TEMP_DIRS[root], ignore_errors=True)
            warnings.warn(
                f"toycomp: the kernel cache {root} is not writable; compiling into "
                f"{_TEMP_DIRS[root]} for this process instead (make it writable, or set "
                f"TOYCOMP_CACHE_DIR, to keep compiled kernels between runs)"
            )
    path = _TEMP_DIRS[root] / kind
    path.mkdir(mode=0o700, exist_ok=True)
    return path


# --- files: hashes, atomic writes, the build lock ------------------------------------------------
def content_hash(*parts: str) -> str:
    """The cache key of ``parts``: 24 hex digits of their SHA-256 (a file name, not a check)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write via a temporary file (unique per thread and process, mode 0600) and ``os.replace``,
    so a concurrent reader sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _read_own_file(path: Path) -> bytes:
    """``path``'s bytes, if this user owns it and nobody else can write it; else ``OSError``."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PermissionError(f"{path} is not private to this user")
        return f.read()


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Hold ``path`` (an ``flock``, released on close) against other threads and processes."""
    with open(path, "a") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


# --- the compiler --------------------------------------------------------------------------------
_NO_COMPILER = (
    "toycomp's C++ backend needs a C++ compiler with OpenMP: none of $CXX, g++, c++, clang++ "
    "was found (install g++, e.g. `apt-get install g++`, or use backend='triton')"
)


def find_cxx() -> str:
    """The C++ compiler: ``$CXX``, else ``g++``, ``c++`` or ``clang++`` on the PATH."""
    cxx = os.environ.get("CXX") or next(filter(shutil.which, ("g++", "c++", "clang++")), None)
    if cxx is None:
        raise CppCompileError(_NO_COMPILER)
    return cxx


@functools.lru_cache(maxsize=None)
def compiler_id(cxx: str) -> str:
    """``cxx``'s resolved path and ``--version`` text, for the key (once per process)."""
    path = os.path.realpath(shutil.which(cxx) or cxx)
    try:
        result = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise CppCompileError(f"C++ compiler {cxx!r} not found or not runnable ({e})") from e
    return f"{path}\n{result.returncode}\n{result.stdout}{result.stderr}"


@functools.lru_cache(maxsize=None)
def cpu_features() -> str:
    """The instruction sets ``-march=native`` may use here: the ``flags`` (x86) or ``Features``
    (Arm) line of /proc/cpuinfo, else the processor's name (once per process)."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    return f"{platform.machine()}: {value.strip()}"
    return f"{platform.machine()}: {platform.processor()}"


def _run_compiler(cmd: list[str]) -> subprocess.CompletedProcess:
    """The one place that starts the compiler (tests replace it to prove cache hits)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise CppCompileError(f"C++ compiler {cmd[0]!r} not found ({e})") from e


# --- C++ libraries -------------------------------------------------------------------------------
def compile_cpp(source: str, extra_flags: Sequence[str] = ()) -> Path:
    """Compile ``source`` with ``extra_flags`` into a shared library; return its path."""
    extra_flags = (*isa_flags(), *extra_flags)
    if config.kernel_cache:  # the content-hash cache: [Note: cache security]
        return _compile_cached(source, extra_flags)
    if (source, extra_flags) not in _COMPILED:  # (once per process, in a private folder)
        folder = Path(tempfile.mkdtemp(prefix="toycomp-"))  # mode 0700, removed at exit
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        (folder / "kernel.cpp").write_text(source)
        _run_cxx(find_cxx(), folder / "kernel.cpp", folder / "kernel.so", extra_flags)
        _COMPILED[source, extra_flags] = folder / "kernel.so"
    return _COMPILED[source, extra_flags]


def _run_cxx(cxx: str, src: Path, out: Path | str, extra_flags: Sequence[str]) -> None:
    """Compile the file ``src`` into the library ``out``, or raise ``CppCompileError``."""
    cmd = [cxx, *CXXFLAGS, str(src), "-o", str(out), *extra_flags]
    result = _run_compiler(cmd)
    if result.returncode != 0:
        raise _compile_failure(cmd, result, src)


def _compile_failure(cmd: list[str], result: subprocess.CompletedProcess, src: Path) -> Exception:
    return CppCompileError(
        f"C++ compilation failed (exit {result.returncode}): {' '.join(cmd)}\n"
        f"{result.stderr.strip()}\n(source: {src})"
    )


def _compile_cached(source: str, extra_flags: Sequence[str]) -> Path:
    """``compile_cpp`` through the cache: the library keyed by all that changes the binary,
    found compiled (and verified) or built under a lock against other threads and processes."""
    cxx = find_cxx()
    flags = (*CXXFLAGS, *extra_flags)
    key = content_hash(source, compiler_id(cxx), " ".join(flags), cpu_features())
    lib = _entry_dir("cpp") / f"{key}.so"
    if _verified(lib, source):
        return lib
    lib = _build_dir("cpp") / f"{key}.so"
    with _build_lock(lib.with_suffix(".lock")):
        if not _verified(lib, source):  # else another thread or process built it meanwhile
            _build(cxx, source, extra_flags, lib)
    return lib


def _verified(lib: Path, source: str) -> bool:
    """Whether ``lib`` and its manifest are ours, and the manifest names ``source`` and the
    library's exact bytes (see [Note: cache security])."""
    try:
        manifest = json.loads(_read_own_file(lib.with_suffix(".json")))
        recorded = (manifest["source_sha256"], manifest["binary_sha256"])
        return recorded == (sha256(source.encode()), sha256(_read_own_file(lib)))
    except (OSError, ValueError, LookupError, TypeError):  # missing, not ours, not a manifest
        return False


def _build(cxx: str, source: str, extra_flags: Sequence[str], lib: Path) -> None:
    """Compile into a temporary file beside ``lib``, then publish the library and its manifest."""
    src = lib.with_suffix(".cpp")
    write_atomic(src, source)
    fd, tmp = tempfile.mkstemp(dir=lib.parent, prefix=lib.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        _run_cxx(cxx, src, tmp, extra_flags)
        os.chmod(tmp, 0o700)  # the linker honours the umask, which may let the group write
        binary = Path(tmp).read_bytes()
        os.replace(tmp, lib)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    manifest = {"source_sha256": sha256(source.encode()), "binary_sha256": sha256(binary)}
    write_atomic(lib.with_suffix(".json"), json.dumps(manifest, indent=1) + "\n")


def load_cpp_library(source: str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile and ``dlopen`` ``source``; the library stays loaded for the process."""
    path = compile_cpp(source, extra_flags)
    with _temp_lock:  # compile threads (opt/async_compile.py) may load one library at once
        if path not in _LIBRARIES:
            _LIBRARIES[path] = ctypes.CDLL(str(path))
        return _LIBRARIES[path]


# --- Python modules (Triton kernels) -------------------------------------------------------------
class _SourceLoader(importlib.machinery.SourceFileLoader):
    """Runs the source text it was given, never a ``__pycache__`` file (which could be planted)."""

    def __init__(self, fullname: str, path: str, source: str):
        super().__init__(fullname, path)
        self.source = source

    def get_code(self, fullname: str):
        return compile(self.source, self.path, "exec", dont_inherit=True)


def load_python_module(source: str, prefix: str) -> ModuleType:
    """Write ``source`` to ``<cache>/<prefix>/<prefix>_<hash>.py`` and import it (once per
    process). The file is there for ``inspect``; the code run is always ``source`` itself."""
    key = content_hash(source)
    name = f"{prefix}_{key}.py"
    path = entry = _entry_dir(prefix) / name
    if entry in _MODULES:
        return _MODULES[entry]
    try:
        intact = _read_own_file(entry) == source.encode()
    except OSError:
        intact = False
    if not intact:  # missing, or changed by someone: write it again (in the cache if we can)
        path = _build_dir(prefix) / name
        write_atomic(path, source)
    loader = _SourceLoader(f"toycomp_{prefix}_{key}", str(path), source)
    spec = importlib.util.spec_from_file_location(loader.name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # inspect.getsource needs to find the module again
    loader.exec_module(module)
    _MODULES[entry] = module
    return module


# --- small JSON records (autotuning choices) -----------------------------------------------------
def load_record(kind: str, key: str) -> object | None:
    """The JSON value in ``<cache>/<kind>/<key>.json`` if the file is ours (not writable by
    others) and parses, else None. The caller still checks what it holds: a record is data."""
    try:
        return json.loads(_read_own_file(_entry_dir(kind) / f"{key}.json"))
    except (OSError, ValueError):
        return None


def store_record(kind: str, key: str, value: object) -> None:
    """Write ``value`` as ``<cache>/<kind>/<key>.json``, atomically (see ``_build_dir``)."""
    write_atomic(_build_dir(kind) / f"{key}.json", json.dumps(value, indent=1) + "\n")
