"""The kernel cache (toycomp/inductor/cache.py): concurrency, corrupt entries, read-only and
unsafe cache directories, planted artefacts, and what the key covers.

Each test gets its own ``TOYCOMP_CACHE_DIR`` and fresh in-process tables; kernels are one-line C
functions compiled through ``cache.load_cpp_library``, the entry point cpp.py uses.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import stat
import subprocess
import sys
import threading
import time
import warnings

import pytest

from toycomp.inductor import cache

ROOT = os.geteuid() == 0  # root writes into a 0555 directory: simulate read-only via os.access


def source(value: int) -> str:
    """A tiny kernel library whose ``value()`` says which source it was built from."""
    return f'extern "C" int value() {{ return {value}; }}\n'


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(root))
    monkeypatch.setattr(cache, "_LIBRARIES", {})
    monkeypatch.setattr(cache, "_MODULES", {})
    monkeypatch.setattr(cache, "_TEMP_DIRS", {})
    return root


@pytest.fixture
def compiles(monkeypatch):
    """The compiler commands run during the test (the compiler itself still runs)."""
    calls = []
    real = cache._run_compiler

    def counting(cmd):
        calls.append(cmd)
        result = real(cmd)
        time.sleep(0.3)  # a slow compiler: concurrent callers overlap for sure
        return result

    monkeypatch.setattr(cache, "_run_compiler", counting)
    return calls


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if "tmp" in p.name)


# --- many threads and processes ------------------------------------------------------------------
def test_threads_compile_the_same_kernel_once(cache_root, compiles):
    barrier, results, errors = threading.Barrier(4), [], []

    def work():
        barrier.wait()
        try:
            results.append(cache.load_cpp_library(source(7)).value())
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [7] * 4
    assert len(compiles) == 1  # the others waited for the first build and found it
    assert leftovers(cache_root / "cpp") == []


CHILD = """
import importlib.util, sys, threading
spec = importlib.util.spec_from_file_location("toycomp_cache_copy", sys.argv[1])
cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cache)
results = []
work = lambda: results.append(cache.load_cpp_library(sys.argv[2]).value())
threads = [threading.Thread(target=work) for _ in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
print(results)
"""


def test_processes_and_threads_compile_at_once(cache_root):
    env = dict(os.environ, TOYCOMP_CACHE_DIR=str(cache_root))
    cmd = [sys.executable, "-c", CHILD, cache.__file__, source(11)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]  # fmt: skip
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "[11, 11, 11]", err
    assert len(list((cache_root / "cpp").glob("*.so"))) == 1
    assert leftovers(cache_root / "cpp") == []


# --- corrupt entries -----------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing manifest"])
def test_corrupt_library_is_rebuilt(cache_root, compiles, damage):
    lib = cache.compile_cpp(source(3))
    if damage == "truncated":
        lib.write_bytes(lib.read_bytes()[:200])
    elif damage == "garbage":
        lib.write_bytes(b"not an ELF file at all")
    else:
        lib.with_suffix(".json").unlink()
    assert cache.load_cpp_library(source(3)).value() == 3
    assert len(compiles) == 2
    assert cache.compile_cpp(source(3)) == lib and len(compiles) == 2  # repaired: a hit again


# --- read-only, foreign and open cache directories ----------------------------------------------
def read_only(monkeypatch, directory):
    """chmod 0555, and for root (whom chmod does not stop) an os.access that says so."""
    os.chmod(directory, 0o555)
    if ROOT:
        real = os.access

        def access(path, mode, **kw):
            if mode & os.W_OK and str(path).startswith(str(directory)):
                return False
            return real(path, mode, **kw)

        monkeypatch.setattr(os, "access", access)


def test_read_only_cache_dir_compiles_with_one_warning(cache_root, monkeypatch):
    assert cache.load_cpp_library(source(1)).value() == 1  # an entry from an earlier run
    monkeypatch.setattr(cache, "_LIBRARIES", {})
    before = sorted(p.name for p in (cache_root / "cpp").iterdir())
    read_only(monkeypatch, cache_root)
    read_only(monkeypatch, cache_root / "cpp")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cache.load_cpp_library(source(1)).value() == 1  # a hit: no warning
            assert cache.load_cpp_library(source(2)).value() == 2
            assert cache.load_cpp_library(source(3)).value() == 3
            module = cache.load_python_module("X = 5\n", "triton")
        assert module.X == 5
        messages = [str(w.message) for w in caught]
        assert len(messages) == 1 and "not writable" in messages[0], messages
        assert sorted(p.name for p in (cache_root / "cpp").iterdir()) == before
    finally:
        os.chmod(cache_root / "cpp", 0o700)
        os.chmod(cache_root, 0o700)


def test_new_cache_dir_is_private(cache_root):
    cache.compile_cpp(source(4))
    assert stat.S_IMODE(cache_root.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache_root / "cpp").stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_open_cache_dir_is_refused(cache_root, compiles, mode):
    cache_root.mkdir()
    os.chmod(cache_root, mode)
    with pytest.raises(RuntimeError, match=f"writable by group or others.*chmod 700 {cache_root}"):
        cache.load_cpp_library(source(5))
    assert compiles == []


def test_open_subdirectory_is_refused(cache_root):
    (cache_root / "cpp").mkdir(parents=True)
    os.chmod(cache_root / "cpp", 0o777)
    with pytest.raises(RuntimeError, match="chmod 700"):
        cache.compile_cpp(source(5))


def test_cache_dir_of_another_user_is_refused(cache_root, compiles, monkeypatch):
    cache_root.mkdir(mode=0o700)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    with pytest.raises(RuntimeError, match="belongs to uid .*TOYCOMP_CACHE_DIR"):
        cache.load_cpp_library(source(6))
    assert compiles == []


# --- planted artefacts ---------------------------------------------------------------------------
def test_planted_library_is_not_loaded(cache_root, tmp_path, monkeypatch):
    lib = cache.compile_cpp(source(1))
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path / "attacker"))
    evil = cache.compile_cpp(source(666))
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(cache_root))
    lib.write_bytes(evil.read_bytes())  # same name, other code: the manifest's hash differs
    assert cache.load_cpp_library(source(1)).value() == 1


@pytest.mark.skipif(not ROOT, reason="needs root to give a file to another user")
def test_entry_of_another_user_is_not_loaded(cache_root, tmp_path, monkeypatch):
    """Even with a manifest that matches, files another user owns are never trusted."""
    lib = cache.compile_cpp(source(1))
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path / "attacker"))
    evil = cache.compile_cpp(source(666)).read_bytes()
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(cache_root))
    manifest = lib.with_suffix(".json")
    forged = manifest.read_text().replace(cache.sha256(lib.read_bytes()), cache.sha256(evil))
    lib.write_bytes(evil)
    manifest.write_text(forged)
    assert cache._verified(lib, source(1))  # a perfect forgery...
    for path in (lib, manifest):
        os.chown(path, 12345, -1)
    assert not cache._verified(lib, source(1))  # ...by somebody else
    assert cache.load_cpp_library(source(1)).value() == 1


def test_planted_python_bytecode_is_not_run(cache_root):
    """Python trusts a __pycache__ .pyc whose header matches the source's mtime and size."""
    module = cache.load_python_module("X = 1\n", "triton")
    path = module.__file__
    assert module.X == 1
    code = compile("X = 2\n", path, "exec")
    st = os.stat(path)
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    header += int(st.st_mtime).to_bytes(4, "little") + st.st_size.to_bytes(4, "little")
    pyc = importlib.util.cache_from_source(path)
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    with open(pyc, "wb") as f:
        f.write(header + marshal.dumps(code))
    cache._MODULES.clear()
    assert cache.load_python_module("X = 1\n", "triton").X == 1


def test_planted_python_source_is_replaced(cache_root):
    path = cache.load_python_module("Y = 1\n", "triton").__file__
    with open(path, "w") as f:
        f.write("Y = 666\n")
    cache._MODULES.clear()
    assert cache.load_python_module("Y = 1\n", "triton").Y == 1
    assert open(path).read() == "Y = 1\n"


# --- the key ------------------------------------------------------------------------------------
def test_key_covers_compiler_version_flags_and_cpu(cache_root, monkeypatch):
    first = cache.compile_cpp(source(8))
    assert cache.compile_cpp(source(8), ["-DX"]) != first
    cxx = cache.find_cxx()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    assert version.splitlines()[0] in cache.compiler_id(cxx)
    assert cache.cpu_features()
    with monkeypatch.context() as m:
        m.setattr(cache, "cpu_features", lambda: "avx512f, only on the other machine")
        assert cache.compile_cpp(source(8)) != first
    with monkeypatch.context() as m:
        m.setattr(cache, "compiler_id", lambda cxx: "/usr/bin/g++ 99.0 (an upgrade)")
        assert cache.compile_cpp(source(8)) != first
    assert cache.compile_cpp(source(8)) == first


def test_without_kernel_cache_each_process_compiles_into_a_fresh_folder(cache_root, compiles,
                                                                         monkeypatch):
    """``kernel_cache`` off (the teach preset): nothing is written to the cache directory, each
    source is compiled into its own private folder, once per process."""
    from toycomp import config

    monkeypatch.setattr(cache, "_COMPILED", {})
    with config.patch(kernel_cache=False):
        first, second = cache.compile_cpp(source(3)), cache.compile_cpp(source(3))
        assert first == second and len(compiles) == 1
        assert stat.S_IMODE(os.stat(first.parent).st_mode) == 0o700
        assert cache.load_cpp_library(source(4)).value() == 4
        assert cache.load_cpp_library(source(4)).value() == 4
        assert cache.compile_cpp(source(4)).parent != first.parent and len(compiles) == 2
        monkeypatch.setattr(cache, "_COMPILED", {})  # a new process compiles again
        assert cache.compile_cpp(source(3)) != first and len(compiles) == 3
    assert not (cache_root / "cpp").exists()
    with config.patch(kernel_cache=True):
        assert cache.load_cpp_library(source(5)).value() == 5
    assert (cache_root / "cpp").is_dir()


def test_without_kernel_cache_a_compile_error_names_the_source(cache_root, monkeypatch):
    monkeypatch.setattr(cache, "_COMPILED", {})
    from toycomp import config

    with config.patch(kernel_cache=False), pytest.raises(cache.CppCompileError, match="kernel.cpp"):
        cache.compile_cpp('extern "C" int broken() { return x; }\n')
