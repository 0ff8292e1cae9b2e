"""protocol/kernel_wire's TypedDicts agree with the broker's pydantic models (names and requiredness),
and the event dicts with docs/protocol.md's event table (issue 14 item 6)."""

from __future__ import annotations

import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

import pytest
from pydantic import BaseModel

from relay_jupyter.broker.broker import load_methods
from relay_jupyter.broker.registry import METHODS
from relay_jupyter.core.types import Event
from relay_jupyter.protocol import kernel_wire
from relay_jupyter.protocol.names import EventType, Method

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
KERNEL_SRC = Path(kernel_wire.__file__).resolve().parents[1] / "kernel"


def _wire_name(name: str, field: Any) -> str:
    return field.serialization_alias or field.alias or name


def _unwrap(tp: Any) -> list[Any]:
    """The classes inside an annotation: ``list[X] | None`` -> [X]."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType, list, tuple, frozenset, set, typing.Required, typing.NotRequired):
        return [inner for arg in get_args(tp) for inner in _unwrap(arg)]
    if origin is typing.Annotated:
        return _unwrap(get_args(tp)[0])
    return [tp]


def _nested(tp: Any, kind: Any) -> list[Any]:
    return [t for t in _unwrap(tp) if (is_typeddict(t) if kind == "td" else isinstance(t, type)
                                       and issubclass(t, BaseModel))]


def _compare(td: Any, model: type[BaseModel], *, sent: bool, path: str) -> list[str]:
    """Differences between one TypedDict and one model (recursing into nested objects)."""
    problems = []
    fields = {_wire_name(n, f): f for n, f in model.model_fields.items()}
    keys = set(td.__required_keys__) | set(td.__optional_keys__)
    if keys != set(fields):
        problems.append(f"{path}: keys {sorted(keys)} != model fields {sorted(fields)}")
    hints = get_type_hints(td, include_extras=False)
    for key in keys & set(fields):
        field = fields[key]
        required_here = key in td.__required_keys__
        # what the kernel sends: Required exactly when the model has no default;
        # what the broker sends: every field is there (model_dump), so every key is Required
        expected = field.is_required() if sent else True
        if required_here != expected:
            problems.append(f"{path}.{key}: Required={required_here}, expected {expected}")
        inner_td, inner_model = _nested(hints[key], "td"), _nested(field.annotation, "model")
        if bool(inner_td) != bool(inner_model):
            problems.append(f"{path}.{key}: nested object {inner_td} vs {inner_model}")
        for sub_td, sub_model in zip(inner_td, inner_model, strict=False):
            problems += _compare(sub_td, sub_model, sent=sent, path=f"{path}.{key}")
    return problems


@pytest.fixture(scope="module")
def methods() -> dict[str, Any]:
    load_methods()
    return METHODS


@pytest.mark.parametrize("name", sorted(kernel_wire.KERNEL_METHODS))
def test_each_kernel_method_matches_the_broker_models(methods: dict[str, Any], name: str) -> None:
    assert name in methods, f"the kernel calls {name}, which the broker does not register"
    params_td, result_td = kernel_wire.KERNEL_METHODS[name]
    spec = methods[name]
    problems = (_compare(params_td, spec.params, sent=True, path=f"{name} params")
                + _compare(result_td, spec.result, sent=False, path=f"{name} result"))
    assert not problems, problems


def test_the_comparison_catches_a_drift() -> None:
    """The checker is not vacuous: a missing field, a wrong requiredness and a nested drift are all found."""

    class Inner(BaseModel):
        a: int
        b: int = 0

    class Outer(BaseModel):
        x: str
        inner: Inner | None = None

    InnerTD = typing.TypedDict("InnerTD", {"a": int})  # b missing
    OuterTD = typing.TypedDict("OuterTD", {"x": typing.NotRequired[str], "inner": InnerTD | None})
    problems = _compare(OuterTD, Outer, sent=True, path="t")
    assert any("t.x" in p for p in problems)          # x is required by the model
    assert any("t.inner: Required" in p for p in problems)  # inner has a default
    assert any("t.inner: keys" in p for p in problems)  # b missing in the nested dict


def test_every_rpc_the_kernel_code_calls_is_typed() -> None:
    """Each ``Method.X`` used under relay_jupyter/kernel has a typed pair (a new call cannot slip in untyped)."""
    used = set()
    for path in KERNEL_SRC.rglob("*.py"):
        used |= set(re.findall(r"Method\.([A-Z_]+)", path.read_text()))
    names = {getattr(Method, attr) for attr in used}
    missing = sorted(names - set(kernel_wire.KERNEL_METHODS))
    assert names and not missing, missing


def _doc_fields(event_type: str) -> set[str]:
    row = (re.search(rf"^\| `{re.escape(event_type)}`[^|]*\| `?\{{([^}}]*)\}}", DOC, re.M)
           # a terminal event shares a row and describes its data inline: (`run.error`: `{...}`)
           or re.search(rf"`{re.escape(event_type)}`: `\{{([^}}]*)\}}`", DOC))
    assert row, f"no {{...}} row for {event_type} in docs/protocol.md"
    return {part.split(":")[0].strip().rstrip("?") for part in row.group(1).split(",")} - {"cache_*"}


@pytest.mark.parametrize("event_type", sorted(kernel_wire.KERNEL_EVENTS))
def test_each_event_dict_matches_docs_protocol(event_type: str) -> None:
    assert event_type in {v for k, v in vars(EventType).items() if k.isupper()}
    td = kernel_wire.KERNEL_EVENTS[event_type]
    keys = set(td.__optional_keys__)
    assert not td.__required_keys__, "event data are read with .get: nothing is Required"
    documented = _doc_fields(event_type)
    if event_type == "run.usage":  # the doc row abbreviates the cache fields as cache_*
        keys = {k for k in keys if not k.startswith("cache_")}
    assert keys == documented, (sorted(keys), sorted(documented))


def test_the_event_envelope_matches_core_event() -> None:
    assert set(kernel_wire.EventEnvelope.__optional_keys__) == set(Event.model_fields)


def test_kernel_wire_imports_no_pydantic() -> None:
    """The typed wire costs the kernel nothing: importing it (and %load_ext's modules) pulls in no pydantic."""
    code = ("import sys, relay_jupyter.protocol.kernel_wire, relay_jupyter.kernel.extension, "
            "relay_jupyter.kernel.session, relay_jupyter.kernel.api, relay_jupyter.kernel.errors\n"
            "print('pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out


def test_one_error_tree_with_the_brokers_codes() -> None:
    """The kernel's errors are RelayErrors whose codes are the broker's Code members; a core refusal met in
    the kernel becomes the same one-line error, with its code and hint."""
    from relay_jupyter.core.errors import Code, GateRefusal, RelayError
    from relay_jupyter.kernel.errors import AgentError, RpcError, as_agent_error

    refused = RpcError(-32000, "budget used up", {"code": "BUDGET_EXCEEDED"}, "run.start")
    assert isinstance(refused, RelayError) and refused.code is Code.BUDGET_EXCEEDED
    assert RpcError(-32601, "no such method", {}, "x.y").code == "RPC-32601"  # transport: no Code
    newer = RpcError(-32000, "a code from a newer broker", {"code": "SOMETHING_NEW"}, "run.start")
    assert newer.code == "SOMETHING_NEW" and "[SOMETHING_NEW]" in newer.message
    assert AgentError("x", code="CANCELLED").code is Code.CANCELLED
    error = as_agent_error(GateRefusal(Code.SCOPE_EXCEEDED, "tool\x1b[31m not granted"))
    assert isinstance(error, AgentError) and error.code is Code.SCOPE_EXCEEDED
    line = error._render_traceback_()
    assert len(line) == 1 and "relay.grants()" in line[0] and "\x1b[31m" not in line[0].split("relay:", 1)[1]
    assert as_agent_error(refused) is refused
