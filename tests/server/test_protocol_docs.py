"""docs/protocol.md documents every registered RPC method, every event type and every refusal code."""

from __future__ import annotations

from pathlib import Path

from relay_jupyter.broker.broker import load_methods
from relay_jupyter.broker.registry import METHODS
from relay_jupyter.core.errors import Code
from relay_jupyter.protocol.names import EventType, Method

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def test_every_registered_method_is_documented():
    load_methods()
    names = set(METHODS) | {v for k, v in vars(Method).items() if k.isupper()}
    missing = sorted(n for n in names if f"`{n}`" not in DOC)
    assert not missing, f"add these methods to docs/protocol.md: {missing}"


def test_every_event_type_is_documented():
    types = {v for k, v in vars(EventType).items() if k.isupper()}
    missing = sorted(t for t in types if f"`{t}`" not in DOC)
    assert not missing, missing


def test_every_refusal_code_is_documented():
    missing = sorted(c.value for c in Code if f"`{c.value}`" not in DOC)
    assert not missing, missing
