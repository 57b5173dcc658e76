"""convert_frame: a function -> a compiled function with a cache of guarded entries.

``compile_frame(fn, compile_graph)`` returns a callable with the same results and Python side
effects as ``fn``. On each call it binds the arguments into ``L`` (what guards read), and runs
the first cache entry whose guards pass. With none, it traces ``fn`` (on fake tensors) into a new
entry: guards -> transformed function (toycomp/capture/transformed_code.py). Resume functions and
helpers that broke the graph are compiled the same way, lazily, each with its own cache.

>>> import torch
>>> def f(x, n):
...     return x * n
>>> cf = compile_frame(f, lambda gm, example_inputs: gm.forward)
>>> cf(torch.ones(2), 3)
tensor([3., 3.])
>>> cf(torch.ones(2), 4).tolist(), len(cf.entries)   # n is guarded by value: a recompile
([4.0, 4.0], 2)
>>> print(cf.entries[1].check.source.splitlines()[3])
            torch.is_grad_enabled() is True

[Note: recompiles]
Like Dynamo, the cache keeps every entry; after ``recompile_limit`` entries (8), inputs that match
none run ``fn`` eagerly with a warning naming the guard that failed, while the entries already
compiled keep serving the inputs they match. Entries hold guards (metadata and constants) and
compiled code, never the first call's tensors.

NB: in PyTorch this lives in torch/_dynamo/convert_frame.py (``convert_frame``, the PEP 523
callback, and ``recompile_limit``) and torch/_dynamo/eval_frame.py (the frame hook and cache).
toycomp wraps the function instead of installing a frame hook.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import toycomp.config as config
from toycomp._logging import log, log_enabled
from toycomp.capture.dynamic_shapes import DynamicShapes, FrameState, RestartWithSymbols
from toycomp.capture.output_graph import AliasedInputs, EagerInputs, OutputGraph
from toycomp.capture.symbolic_convert import BreakRequest, InstructionTranslator
from toycomp.capture.transformed_code import TransformedCode, build_transformed
from toycomp.capture.variables.base import SkipFrame, Unsupported

RECOMPILE_LIMIT = 8


@dataclass
class CacheEntry:
    check: Callable[[dict, dict], bool]
    transformed: TransformedCode


@dataclass
class CompileRecord:
    """One compilation, for ``explain``: which frame, its graph, guards and break."""

    frame: str
    transformed: TransformedCode
    guards: str
    break_reason: str | None = None
    break_location: tuple | None = None
    shapes: DynamicShapes | None = None  # the symbols, dynamic dims and shape guards


@dataclass
class CompileContext:
    """Shared by a function and every frame compiled on its behalf (resumes, helpers)."""

    compile_graph: Callable
    recompile_limit: int = RECOMPILE_LIMIT
    dynamic: bool | None = None  # sizes as symbols: None after a size change, True: always
    frames: dict = field(default_factory=dict)  # function -> CompiledFrame
    log: list = field(default_factory=list)  # CompileRecords, in compile order

    def frame_for(self, fn) -> Callable:
        """The compiled version of ``fn`` (a bound method stays bound)."""
        if isinstance(fn, types.MethodType):
            return types.MethodType(self.frame_for(fn.__func__), fn.__self__)
        if not isinstance(fn, types.FunctionType):
            return fn
        if fn not in self.frames:
            self.frames[fn] = CompiledFrame(fn, self)
        return self.frames[fn]


class CompiledFrame:
    """The cache of one function: a list of (guards, transformed function) entries."""

    def __init__(self, fn: types.FunctionType, context: CompileContext):
        self.fn = fn
        self.context = context
        self.signature = inspect.signature(fn, follow_wrapped=False)  # its own *args, **kwargs
        self.entries: list[CacheEntry] = []
        self.skip_reason: str | None = None
        self.warned: set[str] = set()
        self.frame_state = FrameState()  # the inputs' sizes so far: automatic dynamic shapes
        self.__name__ = fn.__name__
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        if config.fast_guards and not kwargs and len(args) == len(self.positional or ()):
            L = dict(zip(self.positional, args))  # (3 us less than inspect's bind)
        else:  # the arguments by name: what the guards call ``L``
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            L = bound.arguments
        for entry in self.entries:
            if entry.check(L, self.fn.__globals__):
                return entry.transformed.fn(*args, **kwargs)
        # no entry matches: compile one, unless skipped or at the recompile limit (logged)
        if self.skip_reason is None and (not self.entries or self.may_recompile(L)):
            entry = self.compile(dict(L))
            if entry is not None:
                self.entries.append(entry)
                return entry.transformed.fn(*args, **kwargs)
        return self.fn(*args, **kwargs)  # eagerly

    @functools.cached_property
    def positional(self) -> list[str] | None:
        """fast_guards: the parameters' names, if a call may pass each by position."""
        params = self.signature.parameters.values()
        plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return [p.name for p in params] if all(p.kind in plain for p in params) else None

    def may_recompile(self, L) -> bool:
        """No guard held: recompile (logged), unless this frame hit the recompile limit."""
        G = self.fn.__globals__
        if len(self.entries) >= self.context.recompile_limit:
            self.warn_recompile_limit(L, G)
            return False
        if log_enabled("recompiles"):
            log("recompiles", "Recompiling function %s (%s)\n    triggered by the "
                         "guard failure: %s", self.fn.__qualname__, location(self.fn),
                         self.entries[-1].check.failing_guard(L, G))
        return True

    def warn_recompile_limit(self, L, G) -> None:
        failed = self.entries[-1].check.failing_guard(L, G)
        if failed not in self.warned:
            self.warned.add(failed)
            warn_user(
                f"toycomp: {self.fn.__qualname__} hit the recompile limit "
                f"({self.context.recompile_limit}); the last entry failed the guard `{failed}`. "
                "Running eagerly for inputs no cached entry matches.")

    def compile(self, L: dict) -> CacheEntry | None:
        """Trace on fake tensors (again at a graph break, or with symbols) and build an entry."""
        break_at = info = None
        symbolic = self.context.dynamic is True or self.frame_state.has_dynamic()
        while True:
            output = OutputGraph(self.fn, self.fn.__globals__, self.context.dynamic,
                                 self.frame_state, symbolic)
            grad_mode = torch.is_grad_enabled()  # tracing may change it for real: put it back
            try:
                tx = InstructionTranslator(self.fn, L, output, break_at, info)
                tx.run()
            except RestartWithSymbols:  # a size turned out dynamic: trace with a ShapeEnv
                symbolic = True
                continue
            except BreakRequest as e:
                if break_at is not None and e.step <= break_at:
                    return self.give_up(f"trace did not repeat: {e.reason}")
                break_at, info = e.step, e.info
                continue
            except (Unsupported, SkipFrame) as e:
                return self.give_up(getattr(e, "reason", str(e)))
            except EagerInputs as e:  # guarded: only inputs like these run eagerly
                return self.eager_entry(output, e.reason)
            finally:
                for ctx in reversed(output.entered):  # a trace that stopped inside autocast
                    ctx.__exit__(None, None, None)
                torch._C._set_grad_enabled(grad_mode)
            return self.build_entry(tx, output)

    def build_entry(self, tx, output) -> CacheEntry | None:
        """The transformed function and the guards (a graph break warns nothing, as in Dynamo)."""
        try:
            transformed = build_transformed(self.fn, tx.plan, output, self.context)
        except Unsupported as e:
            return self.give_up(f"cannot rebuild the frame at a graph break: {e.reason}")
        except AliasedInputs as e:  # guarded: only inputs aliased this way run eagerly
            return self.eager_entry(output, e.reason)
        # the shape guards come after stages 2-4, which may assume things about sizes too
        shapes = output.install_shape_guards() if output.shape_env is not None else None
        check = output.guards.compile()
        self.context.log.append(CompileRecord(self.fn.__qualname__, transformed, check.source,
                                              tx.plan.reason, tx.plan.location, shapes))
        if any(map(log_enabled, ("graph_breaks", "guards", "graph_code"))):  # TOYCOMP_LOGS
            log_entry(self.context.log[-1])
        return CacheEntry(check, transformed)

    def eager_entry(self, output, reason: str) -> CacheEntry:
        """An entry that runs ``fn`` eagerly for the inputs its guards accept."""
        self.warn_once(reason)
        output.install_shape_guards()
        check = output.guards.compile()
        transformed = TransformedCode(self.fn, f"# {self.fn.__qualname__} runs eagerly: {reason}")
        self.context.log.append(CompileRecord(self.fn.__qualname__, transformed, check.source,
                                              f"runs eagerly: {reason}"))
        return CacheEntry(check, transformed)

    def warn_once(self, reason: str) -> None:
        """A UserWarning ``toycomp: fn: reason`` (at the user's line), once per reason and frame."""
        if reason not in self.warned:
            self.warned.add(reason)
            warn_user(f"toycomp: {self.fn.__qualname__}: {reason}")

    def give_up(self, reason: str) -> None:
        """This frame runs eagerly from now on (Dynamo: a skipped frame), with a warning."""
        self.warn_once(f"runs eagerly: {reason}")
        self.skip_reason = reason
        self.context.log.append(CompileRecord(self.fn.__qualname__, TransformedCode(self.fn, ""),
                                              "", f"frame skipped: {reason}"))
        log("graph_breaks", "%s (%s) runs eagerly (frame skipped): %s",
                     self.fn.__qualname__, location(self.fn), reason)
        return None


_LIBRARIES = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["toycomp"]))


def warn_user(message: str) -> None:
    """``warnings.warn(message)`` attributed to the user's line that led here: the first frame
    outside toycomp and torch (a compile can start deep inside either), so that the warning
    reads the same wherever toycomp is installed (Python 3.12's ``skip_file_prefixes``)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and (frame.f_code.co_filename.startswith(_LIBRARIES)
                                 or frame.f_code.co_filename.startswith("<toycomp")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


def location(fn) -> str:
    code = fn.__code__
    return f"{code.co_filename}:{code.co_firstlineno}"


def log_entry(record: CompileRecord) -> None:
    """TOYCOMP_LOGS (toycomp/_logging.py): a compiled entry's break, guards and graph."""
    if record.break_reason is not None:
        log("graph_breaks", "Graph break in %s: %s", record.frame,
                     break_reason(record))
    log("guards", "GUARDS of %s:\n%s", record.frame, record.guards)
    gm = record.transformed.graph_module
    if gm is not None and log_enabled("graph_code"):
        log("graph_code", "TRACED GRAPH of %s:\n%s", record.frame, gm.code.strip())


def compile_frame(fn: Callable, compile_graph: Callable, recompile_limit: int = RECOMPILE_LIMIT,
                  dynamic: bool | None = None):
    """``fn`` compiled lazily: traced on its first call, then served from its cache.

    Args:
        fn: a Python function (or bound method).
        compile_graph: ``(gm, example_fake_inputs) -> callable(*real_inputs) -> tuple``; with
            dynamic shapes some example inputs are SymInts (the sizes), real ints at run time.
        recompile_limit: entries per function before new guard failures run eagerly.
        dynamic: ``None``: sizes that changed since an earlier compile become symbols;
            ``True``: every size (but 0 and 1); ``False``: none but ``mark_dynamic``'s.
    """
    return CompileContext(compile_graph, recompile_limit, dynamic).frame_for(fn)


@dataclass
class ExplainOutput:
    """What ``torch._dynamo.explain`` reports, for one run of a compiled function."""

    graph_count: int
    graph_break_count: int
    break_reasons: list[str]
    graphs: list
    transformed_code: list[str]
    guards: list[str]
    out: Any = None


def explain(fn: Callable, *args, **kwargs) -> ExplainOutput:
    """Compile ``fn`` with graphs run as they are, call it once, and report what was compiled."""
    context = CompileContext(lambda gm, example_inputs: gm.forward)
    out = context.frame_for(fn)(*args, **kwargs)
    return summarize(context, out)


def summarize(context: CompileContext, out: Any = None) -> ExplainOutput:
    """What ``context`` compiled so far, as ``torch._dynamo.explain`` reports it."""
    graphs = [r.transformed.graph_module for r in context.log if r.transformed.graph_module]
    reasons = [break_reason(r) for r in context.log if r.break_reason]
    breaks = sum(r.break_location is not None and bool(r.break_location) for r in context.log)
    sources = [r.transformed.source for r in context.log]
    return ExplainOutput(len(graphs), breaks, reasons, graphs, sources,
                         [r.guards for r in context.log], out)


def break_reason(record: CompileRecord) -> str:
    """``reason (file:line: the user's source line)``, or the reason alone without a location."""
    if not record.break_location:
        return record.break_reason
    filename, lineno = record.break_location[:2]
    text = linecache.getline(filename, lineno).strip()
    return f"{record.break_reason} ({filename}:{lineno}{': ' + text if text else ''})"
