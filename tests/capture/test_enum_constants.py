"""Enum members that subclass str or int (``class Mode(str, Enum)``, ``IntEnum``), read from a
user object or a global: guarded and used as eager uses them. Their repr is no Python text, so
the guard names them (transformers' configs hold such enums; a repr in the guard's source was a
SyntaxError)."""

from __future__ import annotations

import enum

import torch

import toycomp


class Mode(str, enum.Enum):
    NONE = "none"
    ADD = "add"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Holder:
    def __init__(self) -> None:
        self.mode, self.level = Mode.NONE, Level.HIGH


def test_enum_members_on_an_object_are_guarded_and_recompile_when_changed():
    holder = Holder()

    def f(x):
        y = x.sin()
        if holder.mode == Mode.NONE:
            y = y + 1
        return y * int(holder.level), holder.mode

    x = torch.randn(4)
    compiled = toycomp.compile(f)
    for mode, level in [(Mode.NONE, Level.HIGH), (Mode.ADD, Level.HIGH), (Mode.ADD, Level.LOW)]:
        holder.mode, holder.level = mode, level
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] is want[1]
    assert compiled.compile_count == 3  # each change of a guarded member recompiles


GLOBAL_MODE = Mode.ADD


def test_enum_member_as_a_global_and_as_a_returned_constant():
    def f(x):
        return (x + 1 if GLOBAL_MODE is Mode.ADD else x - 1), Level.LOW

    x = torch.randn(3)
    got, want = toycomp.compile(f)(x), f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] is Level.LOW
