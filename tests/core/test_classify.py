"""Classification: unknown is write; builtin/pins give the base; hints only make it stricter."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_jupyter.core.classify import classify, hint_class
from relay_jupyter.core.types import ToolClass

R, C, W = ToolClass.READ, ToolClass.CONTAINED, ToolClass.WRITE


def test_unknown_tool_is_write():
    assert classify("fs__delete") is W
    assert classify("anything", builtin={"other": R}, pins={"x": R}) is W


def test_builtin_and_pins_give_the_base():
    assert classify("scratch_read", builtin={"scratch_read": R}) is R
    assert classify("scratch_edit", builtin={"scratch_edit": "contained"}) is C
    assert classify("git__log", pins={"git__log": R}) is R


def test_pin_cannot_loosen_a_builtin():
    assert classify("run_code", builtin={"run_code": W}, pins={"run_code": R}) is W
    assert classify("scratch_edit", builtin={"scratch_edit": C}, pins={"scratch_edit": W}) is W


def test_read_only_hint_never_downgrades():
    assert classify("srv__list", hints={"read_only_hint": True}) is W
    assert classify("srv__list", hints={"readOnlyHint": True, "destructiveHint": False}) is W


@pytest.mark.parametrize("hints", [
    {"destructive_hint": True}, {"destructiveHint": True}, {"read_only_hint": False}, {"readOnlyHint": False},
    {"destructive_hint": "yes"}, {"read_only_hint": "true"},  # wrong types read strictly
])
def test_strict_hints_make_a_pinned_read_a_write(hints):
    assert classify("srv__tool", pins={"srv__tool": R}, hints=hints) is W
    assert hint_class(hints) is W


def test_harmless_hints_change_nothing():
    assert classify("t", pins={"t": R}, hints={"open_world_hint": True, "idempotent_hint": True,
                                               "read_only_hint": None, "title": "x"}) is R
    assert hint_class({}) is None and hint_class(None) is None


classes = st.sampled_from(list(ToolClass))
hint_values = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.integers())
hints_st = st.dictionaries(st.sampled_from(["destructive_hint", "read_only_hint", "destructiveHint",
                                            "readOnlyHint", "open_world_hint", "idempotent_hint"]), hint_values)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.one_of(st.none(), classes), pin=st.one_of(st.none(), classes), hints=hints_st)
def test_property_hints_are_never_looser(base, pin, hints):
    builtin = {"t": base} if base is not None else {}
    pins = {"t": pin} if pin is not None else {}
    without = classify("t", builtin=builtin, pins=pins)
    with_hints = classify("t", builtin=builtin, pins=pins, hints=hints)
    assert with_hints.rank >= without.rank
    if base is None and pin is None:
        assert without is W


@pytest.mark.parametrize("call, exc", [
    (lambda: classify(""), ValueError),
    (lambda: classify(None), TypeError),  # type: ignore[arg-type]
    (lambda: classify("t", pins={"t": "safe"}), ValueError),
    (lambda: classify("t", hints=["destructive_hint"]), TypeError),  # type: ignore[arg-type]
])
def test_bad_input(call, exc):
    with pytest.raises(exc):
        call()
