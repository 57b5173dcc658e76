"""The notebooks' coding exercises: checkers, the student-version generator and the grader.

Each notebook ``notebooks/0N_*.ipynb`` has coding exercises where their concept is taught: a stub
that raises ``NotImplementedError`` until the student completes it, then a check cell such as
``nb02.check_default_partition(default_partition)`` that runs the student's code on several
inputs, compares with toycomp's reference and real PyTorch, and prints a short verdict.

Files, in reading order:

- ``checking.py``: the verdicts every checker shares (:func:`checking.exercise`, ``call``,
  ``expect``...), with an example of how a check is written;
- ``nb01.py``, ``nb02.py``...: one notebook's checks each;
- ``notebooks.py``: the solved notebooks (``notebooks/solutions/``) -> the student notebooks
  (nbgrader's ``ClearSolutions``), and the check that the committed ones are up to date;
- ``grading.py``: grades a student's notebook: finds its solved source by its exercise metadata,
  restores its check cells, runs it, and reads the verdicts of those cells only;
- ``bundle.py``: the student release (notebooks, package, data), searched for solution lines;
- ``__main__.py``: ``python -m toycomp.exercises generate | check | grade NOTEBOOK | bundle DIR``.

NB: nbgrader (``nbgrader generate_assignment``, autograded test cells) does the same for any
course; toycomp uses its ``ClearSolutions`` preprocessor and its cell metadata.
"""
