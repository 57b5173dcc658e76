#!/usr/bin/env bash
# toycomp's one entry point for setting up, opening the notebooks and testing.
#
#   ./dev.sh setup          create .venv (Python >= 3.10), install requirements.txt and toycomp
#                           (editable); install graphviz's `dot`, g++ and the Python headers
#                           with apt-get when missing (or say how)
#   ./dev.sh lab [ARGS]     setup, then open the notebooks in JupyterLab (ARGS go to jupyter lab)
#   ./dev.sh test [ARGS]    setup, then run the unit tests in tests/ and nbval in strict mode on
#                           every notebook; ARGS go to pytest (paths among them replace the
#                           default targets)
#   ./dev.sh python [ARGS]  setup, then run the venv's python
#   ./dev.sh site [--check] setup, then build the course website (site/_build/html) from the
#                           committed notebooks, never re-executed; --check then loads every page
#                           in headless Chromium (installed with apt-get when missing)
#   ./dev.sh student [NN..] setup, then generate the student notebooks notebooks/0N_*.ipynb from
#                           the solved ones in notebooks/solutions/ (all, or those numbered NN)
#   ./dev.sh bundle DIR     setup, then write the student release into DIR (student notebooks,
#                           the package, benchmarks/; no solutions, no tests), checked for
#                           solution lines
#
# Set-up is idempotent: it reinstalls only when requirements.txt, pyproject.toml, this script or the
# Python version changed (a hash stamp kept in .venv). Environment: PYTHON picks the interpreter
# that creates .venv; PIP_EXTRA_INDEX_URL etc. reach pip as usual; ATEN_CPU_CAPABILITY
# (default, avx2, avx512) and OMP_NUM_THREADS reach PyTorch in the tests and notebook kernels.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.toycomp-setup-stamp"
# The notebooks nbval checks: the ones students open, notebooks/0*.ipynb, and the solved ones
# they are generated from, notebooks/solutions/0*.ipynb (python -m toycomp.exercises generate).
NOTEBOOK_GLOBS=(notebooks/0*.ipynb notebooks/solutions/0*.ipynb)
SANITIZE="$ROOT/.ci/nbval_sanitize.cfg"
# Stable set/dict-of-str ordering in pytest and in the notebook kernels it (or JupyterLab) starts,
# so that notebook outputs produced by `./dev.sh lab` match those of `./dev.sh test`.
export PYTHONHASHSEED=0
# TorchInductor's FX graph cache does not key on ATEN_CPU_CAPABILITY: a graph cached on this CPU's
# own kernels is reused under `default` or `avx2` (so the variant would not test them), and where
# its .so is gone it is rebuilt without the vector headers, a C++ compile error. One cache folder
# per capability keeps the runs apart (unless TORCHINDUCTOR_CACHE_DIR is set).
if [ -n "${ATEN_CPU_CAPABILITY:-}" ] && [ -z "${TORCHINDUCTOR_CACHE_DIR:-}" ]; then
    export TORCHINDUCTOR_CACHE_DIR="${TMPDIR:-/tmp}/torchinductor_$(id -un)_${ATEN_CPU_CAPABILITY}"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

say() { printf '[dev.sh] %s\n' "$*"; }
warn() { printf '[dev.sh] WARNING: %s\n' "$*" >&2; }
die() { printf '[dev.sh] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- system packages (graphviz, venv)

# Prints the prefix that runs a command as root ("" or "sudo -n"); fails when there is none.
root_prefix() {
    if [ "$(id -u)" = 0 ]; then
        echo ""
    elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        echo "sudo -n"
    else
        return 1
    fi
}

# Installs Debian/Ubuntu packages when we are root or have passwordless sudo; returns 1 otherwise.
apt_install() {
    local sudo
    command -v apt-get >/dev/null 2>&1 || return 1
    sudo="$(root_prefix)" || return 1
    say "installing $* with apt-get"
    # The package lists may be missing (fresh containers) or stale: update only when needed.
    local apt=($sudo env DEBIAN_FRONTEND=noninteractive apt-get -q)
    "${apt[@]}" install -y "$@" </dev/null >/dev/null 2>&1 \
        || { "${apt[@]}" update </dev/null >/dev/null \
            && "${apt[@]}" install -y "$@" </dev/null >/dev/null; }
}

# The command a person should run to install graphviz on this system.
graphviz_hint() {
    if command -v apt-get >/dev/null 2>&1; then echo "sudo apt-get install graphviz"
    elif command -v dnf >/dev/null 2>&1; then echo "sudo dnf install graphviz"
    elif command -v yum >/dev/null 2>&1; then echo "sudo yum install graphviz"
    elif command -v pacman >/dev/null 2>&1; then echo "sudo pacman -S graphviz"
    elif command -v zypper >/dev/null 2>&1; then echo "sudo zypper install graphviz"
    elif command -v apk >/dev/null 2>&1; then echo "sudo apk add graphviz"
    elif command -v brew >/dev/null 2>&1; then echo "brew install graphviz"
    elif command -v conda >/dev/null 2>&1; then echo "conda install -c conda-forge graphviz"
    else echo "install graphviz (https://graphviz.org/download/) so that \`dot\` is on PATH"
    fi
}

ensure_dot() {
    command -v dot >/dev/null 2>&1 && return 0
    apt_install graphviz || true
    command -v dot >/dev/null 2>&1 && return 0
    warn "graphviz's \`dot\` program is missing, so graph drawings fall back to text."
    warn "To install it, run:  $(graphviz_hint)"
    warn "(continuing without it)"
}

# toycomp's C++ backend, and PyTorch's Inductor that the notebooks compare with, compile C++ with
# the system compiler; Inductor also wants the Python headers (it warns on stderr without them).
have_cxx() {
    [ -n "${CXX:-}" ] || command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 \
        || command -v clang++ >/dev/null 2>&1
}
have_python_h() {
    "$VPY" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")))'
}

ensure_build_tools() {
    local pkgs=()
    have_cxx || pkgs+=(g++)
    have_python_h || pkgs+=("python$(py_version "$VPY")-dev")
    [ ${#pkgs[@]} -eq 0 ] && return 0
    apt_install "${pkgs[@]}" || true
    if ! have_cxx || ! have_python_h; then
        warn "a C++ compiler and the Python headers are needed by the C++ backend and Inductor."
        if command -v apt-get >/dev/null 2>&1; then
            warn "To install them, run:  sudo apt-get install ${pkgs[*]}"
        else
            warn "Install g++ (or clang++) and the Python development headers (python3-devel)."
        fi
        warn "(continuing without them)"
    fi
}

# ------------------------------------------------------------------------------ the virtualenv

py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

find_python() {
    local candidate
    for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11 python3.10 python; do
        if command -v "$candidate" >/dev/null 2>&1 \
            && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

create_venv() {
    local py
    py="$(find_python)" || die "toycomp needs Python >= 3.10 (set PYTHON=/path/to/python3)"
    say "creating .venv with $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
    rm -rf "$VENV"
    if ! "$py" -m venv "$VENV" 2>/dev/null; then
        # Debian and Ubuntu ship venv's ensurepip separately (python3.X-venv).
        rm -rf "$VENV"
        local pkg
        pkg="python$(py_version "$py")-venv"
        apt_install "$pkg" || apt_install python3-venv \
            || die "'$py -m venv' failed; install the venv module (e.g. sudo apt-get install $pkg)"
        "$py" -m venv "$VENV" || die "'$py -m venv $VENV' failed"
    fi
}

# pip install, quiet, without the one-line warnings about missing find-links/index folders that
# some pip configurations print for every package.
pip_install() {
    local log rc=0
    log="$(mktemp)"
    "$VPY" -m pip install -q --progress-bar off "$@" 2>"$log" || rc=$?
    grep -v "^WARNING: Location 'file:.*' is ignored: it is neither a file nor a directory" \
        "$log" >&2 || true
    rm -f "$log"
    return "$rc"
}

setup_stamp() {
    {
        cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" "$ROOT/dev.sh"
        "$VPY" -c 'import sys; print(sys.version)'
    } | "$VPY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

setup() {
    cd "$ROOT"
    ensure_dot
    if ! "$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
        create_venv
    fi
    ensure_build_tools
    local want
    want="$(setup_stamp)"
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
        say "set-up is up to date (.venv matches requirements.txt)"
        return 0
    fi
    say "installing requirements.txt into .venv (first run: a few minutes)"
    rm -f "$STAMP"
    # The pinned pip first (venv's bundled pip can be years old), then everything with it.
    local pip_pin
    pip_pin="$(grep -E '^pip==' requirements.txt || true)"
    [ -z "$pip_pin" ] || pip_install "$pip_pin"
    pip_install -r requirements.txt
    say "installing toycomp (editable)"
    pip_install --no-deps --no-build-isolation -e .
    "$VPY" - <<'EOF'
import torch
cuda = torch.version.cuda
print("[dev.sh] torch %s (%s build), Python %s" % (
    torch.__version__, "CUDA " + cuda if cuda else "CPU", __import__("sys").version.split()[0]))
EOF
    echo "$want" >"$STAMP"
}

# -------------------------------------------------------------------------------- sub-commands

cmd_lab() {
    setup
    local args=(--ServerApp.root_dir="$ROOT" --LabApp.default_url=/lab/tree/notebooks)
    [ "$(id -u)" = 0 ] && args+=(--allow-root)
    say "starting JupyterLab on the notebooks (Ctrl-C to stop)"
    exec "$VENV/bin/jupyter" lab "${args[@]}" "$@"
}

# Checks that the notebooks exist and were saved executed: nbval compares a cell's outputs only
# when the stored cell has an execution count, so an unexecuted cell would pass unchecked.
check_notebooks() {
    "$VPY" - "$@" <<'EOF'
import sys
import nbformat

bad = []
for path in sys.argv[1:]:
    try:
        nb = nbformat.read(path, as_version=4)
    except FileNotFoundError:
        bad.append(f"{path}: missing")
        continue
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    if kernel != "python3":
        bad.append(f"{path}: kernelspec name is {kernel!r}, expected 'python3'")
    # Numbered like nbval's "Cell N": code cells only, empty ones included (and allowed unrun).
    cells = [c for c in nb.cells if c.cell_type == "code"]
    unrun = [i for i, c in enumerate(cells) if c.source.strip() and c.execution_count is None]
    if unrun:
        bad.append(f"{path}: code cells {unrun} were not executed (run all cells, then save)")
for line in bad:
    print("[dev.sh] ERROR: " + line, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

cmd_test() {
    setup
    local targets=() opts=() arg
    for arg in "$@"; do
        case "$arg" in
            -*) opts+=("$arg") ;;
            *) [ -e "$arg" ] && targets+=("$arg") || opts+=("$arg") ;;
        esac
    done
    if [ ${#targets[@]} -eq 0 ]; then
        local notebooks=() nb
        for nb in "${NOTEBOOK_GLOBS[@]}"; do [ -e "$nb" ] && notebooks+=("$nb"); done
        [ ${#notebooks[@]} -gt 0 ] || die "no notebooks found in notebooks/"
        check_notebooks "${notebooks[@]}" || die "fix the notebooks above"
        # The student notebooks must be what the solved ones generate (sources; nbval checks
        # the outputs of both).
        "$VPY" -m toycomp.exercises check || die "the student notebooks are stale (./dev.sh student)"
        # (the student release has no tests/)
        [ -d tests ] && targets=(tests) || targets=()
        targets+=("${notebooks[@]}")
    fi
    # Each notebook's run time, printed after the tests (.ci/notebook_times.py; not in the
    # student release). PYTHONPATH reaches the notebook kernels too, harmlessly.
    local env=()
    if [ -f "$ROOT/.ci/notebook_times.py" ]; then
        env=(env "PYTHONPATH=$ROOT/.ci${PYTHONPATH:+:$PYTHONPATH}")
        opts=(-p notebook_times ${opts[@]+"${opts[@]}"})
    fi
    command -v dot >/dev/null 2>&1 \
        || warn "without \`dot\`, notebook cells that draw graphs will not match their stored SVG"
    # --nbval: strict, every output compared; --nbval-current-env: kernels run on .venv's python.
    # nbval's cell timeout stays under pytest-timeout's (pyproject.toml) so nbval reports it.
    local cmd=("$VPY" -m pytest --nbval --nbval-current-env --nbval-sanitize-with "$SANITIZE"
        --nbval-cell-timeout=240 --nbval-kernel-startup-timeout=120
        ${opts[@]+"${opts[@]}"} "${targets[@]}")
    say "running: python ${cmd[*]:1}"
    [ -z "${ATEN_CPU_CAPABILITY:-}${OMP_NUM_THREADS:-}" ] || say "with" \
        "ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-} OMP_NUM_THREADS=${OMP_NUM_THREADS:-}"
    set +e
    ${env[@]+"${env[@]}"} "${cmd[@]}"
    local rc=$?
    set -e
    [ "$rc" -eq 5 ] && warn "pytest collected no tests"
    return "$rc"
}

# The website's own packages (requirements-site.txt), within requirements.txt's pins.
cmd_site() {
    setup
    pip_install -r requirements-site.txt -c requirements.txt
    "$VPY" site/build.py || die "the site did not build"
    [ "${1:-}" = "--check" ] || return 0
    if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
        apt_install chromium chromium-driver \
            || die "the browser check needs Chromium: sudo apt-get install chromium chromium-driver"
    fi
    "$VPY" site/check.py
}

main() {
    local sub="${1:-}"
    [ $# -gt 0 ] && shift
    case "$sub" in
        setup) setup ;;
        lab) cmd_lab "$@" ;;
        test) cmd_test "$@" ;;
        python) setup && exec "$VPY" "$@" ;;
        site) cmd_site "$@" ;;
        student) setup && exec "$VPY" -m toycomp.exercises generate "$@" ;;
        bundle)
            [ $# -eq 1 ] || die "usage: ./dev.sh bundle DIR"
            setup && exec "$VPY" -m toycomp.exercises bundle "$1"
            ;;
        *)
            sed -n '2,24p' "$ROOT/dev.sh" | sed 's/^# \{0,1\}//'
            [ -z "$sub" ] || [ "$sub" = help ]
            ;;
    esac
}

main "$@"
