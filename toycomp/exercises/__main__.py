"""``python -m toycomp.exercises``: generate the student notebooks, check them, grade a notebook.

    python -m toycomp.exercises generate [02 03 ...]   solved -> student notebooks (executed)
    python -m toycomp.exercises check                  exit 1 if a student notebook is stale
    python -m toycomp.exercises grade NOTEBOOK... [--no-run] [--solved PATH]   score tables
    python -m toycomp.exercises bundle DIR             the student release, without solutions
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from toycomp.exercises import bundle, grading, notebooks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toycomp.exercises", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write notebooks/0N_*.ipynb from notebooks/solutions/")
    gen.add_argument("names", nargs="*", help="notebook numbers (02 03 ...); default: all")
    gen.add_argument("--no-run", action="store_true", help="do not execute them")
    sub.add_parser("check", help="fail if a student notebook is not what generate makes")
    grade = sub.add_parser("grade", help="run a notebook's checks and print a score table")
    grade.add_argument("notebooks", nargs="+")
    grade.add_argument("--no-run", action="store_true", help="read the saved outputs instead")
    grade.add_argument("--solved", default=str(notebooks.SOLUTIONS),
                       help="the solved notebooks to match against (a folder or one notebook)")
    release = sub.add_parser("bundle", help="write the student release into DIR")
    release.add_argument("dir")
    args = parser.parse_args(argv)

    if args.command == "generate":
        for path in notebooks.generate(args.names, run=not args.no_run):
            print(f"wrote {path.relative_to(notebooks.ROOT)}")
        return 0
    if args.command == "check":
        problems = notebooks.check_generated()
        for line in problems:
            print(f"ERROR: {line}", file=sys.stderr)
        if problems:
            print("regenerate them: python -m toycomp.exercises generate", file=sys.stderr)
            return 1
        print(f"student notebooks up to date ({len(notebooks.solved_notebooks())} generated)")
        return 0
    if args.command == "bundle":
        try:
            out = bundle.bundle(args.dir)
        except (FileExistsError, ValueError, RuntimeError) as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return 1
        print(f"wrote the student release to {out} (no solution line found in it)")
        return 0
    status = 0
    for path in args.notebooks:
        try:
            source = grading.find_solved(nbformat.read(path, as_version=4), Path(args.solved))
        except LookupError as e:
            print(f"ERROR: {path}: {e}", file=sys.stderr)
            status = 1
            continue
        rows = grading.grade(path, run=not args.no_run, solved=source)
        print(grading.format_table(f"{path} (solved source: {source.name})", rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
