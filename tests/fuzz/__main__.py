"""``python -m tests.fuzz``: run random programs through toycomp, report failures minimised.

Input -> output: seeds and backends -> a table of outcome counts per backend, then one minimal
standalone reproducer per distinct failure (failures grouped by signature), and the clear
errors (unsupported op or construct, named) with their counts.

    python -m tests.fuzz --seeds 0:2000 --backend both --jobs 2
    python -m tests.fuzz --seeds 25 --backend cpp             # one seed, minimised
    python -m tests.fuzz --print 25 --backend cpp             # its reproducer, nothing run

Each program runs in a worker process (``--jobs`` of them), so that a crash of compiled code or
a hang (``--timeout``) is recorded for its seed and the run goes on. Everything is reproducible
from the seed alone (tests/fuzz/programs.py).

[Note: grouping and minimising]
Failures are first grouped by their signature: an error's normalised first line and phase
(forward / backward), or for a wrong result "wrong values" / "wrong grads" (+ " (NaN)").
Within a group, programs are minimised smallest first (delta debugging, programs.minimize);
a program whose ops include every op of an already minimised reproducer of its group is
attributed to that reproducer without minimising (marked "~"), so one bug costs one
minimisation. Groups are then re-keyed by the minimised program's op chain, so two bugs with the
same symptom ("wrong grads") show up as two reproducers.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import multiprocessing
import signal
import sys
import time
from multiprocessing.connection import wait
from typing import Any

CLASSES = ("ok", "signed zero", "fallback", "clear error", "unclear error", "wrong", "crash",
           "timeout", "invalid")
FAILURES = ("wrong", "unclear error", "crash", "timeout", "invalid")


# --- worker side ------------------------------------------------------------------------------
def _task(task: tuple) -> Any:
    from tests.fuzz import programs  # noqa: PLC0415 - the parent stays free of torch

    kind, backend, payload = task
    if kind == "check":
        program = programs.generate(payload)
        o = programs.check(program, backend)
        return {"cls": o.cls, "signature": o.signature, "detail": o.detail,
                "kinds": program.kinds()}
    if kind == "minimize":
        return _minimize_group(programs, backend, *payload)
    raise ValueError(kind)


def _minimize_group(programs: Any, backend: str, seeds: list[int], budget: int, limit: int) -> list:
    """Minimise the failing seeds of one group, smallest program first (see the Note above)."""
    done: list[dict] = []
    for seed in sorted(seeds, key=lambda s: (len(programs.generate(s).ops), s)):
        program = programs.generate(seed)
        kinds = collections.Counter(programs.families(program))
        match = next((d for d in done if not (d["need"] - kinds)), None)
        if match is not None:
            match["seeds"].append(f"~{seed}")
            continue
        if len(done) >= limit:
            continue
        outcome = programs.check(program, backend)
        if outcome.cls not in FAILURES:
            continue  # flaky; reported as such by the parent
        small, got = programs.minimize(program, backend, outcome, budget=budget)
        entry = next((d for d in done if d["describe"] == programs.describe(small)), None)
        if entry is not None:
            entry["seeds"].append(str(seed))
            continue
        done.append({
            "seeds": [str(seed)], "describe": programs.describe(small),
            "need": collections.Counter(programs.families(small)), "detail": got.detail,
            "kinds": " -> ".join(small.kinds()),
            "source": programs.render(small, backend), "ops": len(small.ops),
        })
    for d in done:
        d["need"] = dict(d["need"])
    return done


def _worker(conn: Any) -> None:
    import warnings  # noqa: PLC0415

    warnings.filterwarnings("ignore")
    while True:
        task = conn.recv()
        if task is None:
            return
        try:
            result = _task(task)
        except Exception as e:  # noqa: BLE001 - a bug of the harness itself: report, go on
            result = {"cls": "invalid", "signature": f"harness error: {type(e).__name__}: {e}",
                      "detail": "", "kinds": []}
        conn.send(result)


# --- parent side: a pool that survives crashes and hangs --------------------------------------
class Pool:
    """``jobs`` worker processes; a task whose worker dies or overruns gets a crash/timeout."""

    def __init__(self, jobs: int) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.jobs = jobs
        self.workers: list[dict] = []

    def _start(self) -> dict:
        parent, child = self.ctx.Pipe()
        # By its importable name: spawn does not re-import a package's __main__ in the child.
        target = importlib.import_module("tests.fuzz.__main__")._worker
        proc = self.ctx.Process(target=target, args=(child,), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "task": None, "since": 0.0, "limit": 0.0}

    def run(self, tasks: list[tuple], limit_of: Any):
        """Yield (task, result) as they finish; result None: crashed, "timeout": overran."""
        pending = list(reversed(tasks))
        while len(self.workers) < min(self.jobs, len(tasks)):
            self.workers.append(self._start())
        busy = 0
        while pending or busy:
            for w in self.workers:
                if w["task"] is None and pending:
                    w["task"], w["since"] = pending.pop(), time.monotonic()
                    w["limit"] = limit_of(w["task"])
                    w["conn"].send(w["task"])
                    busy += 1
            ready = wait([w["conn"] for w in self.workers if w["task"] is not None], timeout=1.0)
            for k, w in enumerate(self.workers):
                if w["task"] is None:
                    continue
                result: Any = "pending"
                if w["conn"] in ready:
                    try:
                        result = w["conn"].recv()
                    except (EOFError, OSError):
                        result = None
                elif time.monotonic() - w["since"] > w["limit"]:
                    result = "timeout"
                if result == "pending":
                    continue
                task, w["task"] = w["task"], None
                busy -= 1
                if result is None or result == "timeout":
                    code = self._restart(k)
                    result = result or {"exitcode": code}
                yield task, result

    def _restart(self, k: int) -> Any:
        w = self.workers[k]
        w["proc"].kill()
        w["proc"].join()
        self.workers[k] = self._start()
        return w["proc"].exitcode

    def close(self) -> None:
        for w in self.workers:
            try:
                w["conn"].send(None)
            except OSError:
                pass
            w["proc"].join(timeout=5)
            if w["proc"].is_alive():
                w["proc"].kill()


def _as_outcome(result: Any, limit: float) -> dict:
    if result == "timeout":
        return {"cls": "timeout", "signature": f"timeout (over {limit:g} s)", "detail": "",
                "kinds": []}
    if "exitcode" in result:
        code = result["exitcode"]
        return {"cls": "crash", "signature": f"crash (worker exit code {code})", "detail": "",
                "kinds": []}
    return result


# --- the command ------------------------------------------------------------------------------
def parse_seeds(text: str) -> list[int]:
    """"0:2000" (a range), "17", or "1,5,9"."""
    seeds: list[int] = []
    for part in text.split(","):
        if ":" in part:
            a, b = part.split(":")
            seeds += range(int(a), int(b))
        else:
            seeds.append(int(part))
    return seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0:100", help="A:B, N or N,M,... (default 0:100)")
    ap.add_argument("--backend", choices=["cpp", "triton", "both"], default="both")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per program (300)")
    ap.add_argument("--budget", type=int, default=60, help="compilations per minimisation (60)")
    ap.add_argument("--max-minimize", type=int, default=6,
                    help="minimised reproducers per failure group (6); 0: do not minimise")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="start no new program after this many seconds; report those run")
    ap.add_argument("--json", help="also write every outcome to this file")
    ap.add_argument("--print", dest="show", type=int, help="print this seed's program and exit")
    args = ap.parse_args(argv)
    backends = ["cpp", "triton"] if args.backend == "both" else [args.backend]
    if args.show is not None:
        from tests.fuzz.programs import generate, render  # noqa: PLC0415

        print(render(generate(args.show), backends[0]))
        return 0
    seeds = parse_seeds(args.seeds)
    pool = Pool(args.jobs)
    started = time.monotonic()
    deadline = started + (args.time_limit if args.time_limit is not None else float("inf"))
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` still gets a report of what ran
    try:
        results, complete = _run_checks(pool, seeds, backends, args.timeout, deadline)
        groups = _group(results)
        minimised = _minimise(pool, groups, args) if args.max_minimize and complete else {}
    finally:
        pool.close()
    seeds = sorted({seed for _, seed in results}) or seeds
    _report(results, groups, minimised, backends, seeds, time.monotonic() - started)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": {f"{b}:{s}": r for (b, s), r in results.items()},
                       "minimised": {" | ".join(k): v for k, v in minimised.items()}}, f, indent=1)
    return 1 if any(r["cls"] in FAILURES for r in results.values()) else 0


def _interrupt(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # `timeout` signals the group too: once is enough
    raise KeyboardInterrupt


def _run_checks(
    pool: Pool, seeds: list[int], backends: list[str], timeout: float, deadline: float
) -> tuple[dict, bool]:
    """Outcome per (backend, seed), and whether every task ran (no interrupt, no time limit)."""
    tasks = [("check", b, s) for s in seeds for b in backends]
    results: dict[tuple[str, int], dict] = {}
    try:
        for n, (task, result) in enumerate(pool.run(tasks, lambda t: timeout), 1):
            _, backend, seed = task
            results[(backend, seed)] = r = _as_outcome(result, timeout)
            if r["cls"] in FAILURES or r["cls"] == "clear error":
                print(f"[{n}/{len(tasks)}] {backend} seed {seed}: {r['cls']}: {r['signature']}",
                      flush=True)
            elif n % 50 == 0:
                print(f"[{n}/{len(tasks)}]", file=sys.stderr, flush=True)
            if time.monotonic() > deadline and n < len(tasks):
                print(f"time limit: stopping after {n} programs", flush=True)
                return results, False
    except KeyboardInterrupt:
        print(f"interrupted: reporting the {len(results)} programs run", flush=True)
        return results, False
    return results, True


def _group(results: dict) -> dict[tuple[str, str, str], list[int]]:
    groups: dict[tuple[str, str, str], list[int]] = collections.defaultdict(list)
    for (backend, seed), r in sorted(results.items()):
        if r["cls"] in FAILURES:
            groups[(backend, r["cls"], r["signature"])].append(seed)
    return groups


def _minimise(pool: Pool, groups: dict, args: argparse.Namespace) -> dict:
    """Minimise each minimisable failure group in the workers (crashes/timeouts are not)."""
    tasks, keys = [], {}
    for key, seeds in groups.items():
        if key[1] in ("wrong", "unclear error"):
            tasks.append(("minimize", key[0], (seeds, args.budget, args.max_minimize)))
            keys[(key[0], tuple(seeds))] = key
    limit = min(3600.0, args.timeout * (args.budget + 2) * args.max_minimize)
    out: dict = {}
    for task, result in pool.run(tasks, lambda t: limit):
        key = keys[(task[1], tuple(task[2][0]))]
        out[key] = result if isinstance(result, list) else []
    return out


def _report(results: dict, groups: dict, minimised: dict, backends: list[str], seeds: list[int],
            elapsed: float) -> None:
    print("\n== outcomes ==")
    header = f"{'backend':8} {'programs':>8} " + " ".join(f"{c:>13}" for c in CLASSES)
    print(header)
    for b in backends:
        counts = collections.Counter(r["cls"] for (bb, _), r in results.items() if bb == b)
        print(f"{b:8} {sum(counts.values()):>8} " + " ".join(f"{counts[c]:>13}" for c in CLASSES))
    print(f"seeds {_seed_text(seeds)}, {elapsed:.0f} s")

    print("\n== failures, grouped by signature ==")
    order = sorted(groups, key=lambda k: (FAILURES.index(k[1]), -len(groups[k])))
    for key in order:
        backend, cls, sig = key
        found = groups[key]
        print(f"\n### [{backend}] {cls}: {sig}  ({len(found)} programs: seeds {_list(found)})")
        reproducers = minimised.get(key)
        if not reproducers:
            detail = results[(backend, found[0])]["detail"]
            print(f"(not minimised) first seed {found[0]}: python -m tests.fuzz --print "
                  f"{found[0]} --backend {backend}")
            if detail:
                print(_indent(detail[:1500]))
            continue
        for d in reproducers:
            print(f"\n-- {cls} [{backend}]: {d['describe']}  (seeds {', '.join(d['seeds'])})")
            print(f"   minimised to: {d['kinds']}")
            print(_indent(d["detail"][:1200]))
            print("```python\n" + d["source"] + "```")
        missing = [s for s in found if not any(str(s) in {x.lstrip('~') for x in d["seeds"]}
                                                for d in reproducers)]
        if missing:
            print(f"-- not minimised (over --max-minimize, or no longer failing): {_list(missing)}")

    print("\n== not failures: clear errors (the unsupported op or construct named), fallbacks "
          "(ran eagerly), signed zeros ==")
    clear: dict = collections.defaultdict(list)
    for (backend, seed), r in sorted(results.items()):
        if r["cls"] in ("clear error", "fallback", "signed zero"):
            clear[(backend, r["cls"], r["signature"])].append(seed)
    for (backend, cls, sig), found in sorted(clear.items(), key=lambda kv: -len(kv[1])):
        print(f"[{backend}] {cls}: {sig}  ({len(found)}: seeds {_list(found)})")
    if not clear:
        print("(none)")


def _seed_text(seeds: list[int]) -> str:
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}:{seeds[-1] + 1}"
    return _list(seeds)


def _list(seeds: list[int], n: int = 12) -> str:
    text = ", ".join(map(str, seeds[:n]))
    return text + (f", ... ({len(seeds) - n} more)" if len(seeds) > n else "")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


if __name__ == "__main__":
    sys.exit(main())
