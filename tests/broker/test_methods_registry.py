"""The method table is built from ``broker/methods/``: one module per namespace, each with one access
rule, all imported by name (a module left out of ``methods.MODULES`` would silently never load)."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest

from relay_jupyter.broker import methods
from relay_jupyter.broker.broker import load_methods
from relay_jupyter.broker.methods._access import Access, Namespace, Scope
from relay_jupyter.broker.registry import METHODS
from relay_jupyter.protocol.models_control import Empty
from relay_jupyter.protocol.names import Method

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def test_every_module_of_the_package_is_imported_by_name():
    on_disk = {m.name for m in pkgutil.iter_modules(methods.__path__) if not m.name.startswith("_")}
    listed = {m.__name__.rsplit(".", 1)[1] for m in methods.MODULES}
    assert on_disk == listed, f"add to broker/methods/__init__.py MODULES: {sorted(on_disk - listed)}"


def test_each_module_declares_one_rule_and_registers_through_it():
    load_methods()
    for module in methods.MODULES:
        assert isinstance(module.ACCESS, Access), module.__name__
        assert isinstance(module.rpc, Namespace) and module.rpc.access is module.ACCESS, module.__name__
        assert module.rpc.names, f"{module.__name__} registers no method"
        for name in module.rpc.names:
            spec = METHODS[name]
            assert spec.access is module.ACCESS and module.rpc.owns(name), name
            assert Scope(spec.scope) in Scope


def test_every_method_of_the_table_comes_from_a_module_that_is_loaded():
    load_methods()
    by_module = [name for m in methods.MODULES for name in m.rpc.names]
    assert sorted(by_module) == sorted(METHODS), "a method registered outside broker/methods/"
    assert all(spec.access is not None for spec in METHODS.values())


@pytest.mark.asyncio
async def test_dispatch_refuses_a_method_without_an_access_rule():
    from relay_jupyter.broker.broker import Broker
    from relay_jupyter.broker.config import BrokerConfig
    from relay_jupyter.broker.dispatch import call_method
    from relay_jupyter.broker.registry import MethodSpec
    from relay_jupyter.core.caller import Caller, CallerKind
    from relay_jupyter.core.errors import MethodNotFound

    ran: list[str] = []

    async def handler(broker, caller, params):
        ran.append("ran")
        return Empty()

    METHODS["test.unruled"] = MethodSpec("test.unruled", Empty, Empty, handler, "")
    broker = Broker.open(BrokerConfig(in_memory=True))
    try:
        with pytest.raises(MethodNotFound):
            await call_method(broker, Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="k"),
                              "test.unruled", {})
    finally:
        del METHODS["test.unruled"]
        broker.close()
    assert ran == []


def test_the_namespaces_do_not_overlap():
    load_methods()
    for name in METHODS:
        owners = [m.__name__ for m in methods.MODULES if m.rpc.owns(name)]
        assert len(owners) <= 1, (name, owners)


def _documented_methods() -> set[str]:
    """The method names in the first column of the tables under "## Methods" of docs/protocol.md."""
    section = DOC.split("\n## Methods", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            names |= set(re.findall(r"`([^`]+)`", row.split("|")[1]))
    return names


def test_every_documented_method_has_a_handler_and_every_handler_is_documented():
    load_methods()
    documented = _documented_methods()
    named = {v for k, v in vars(Method).items() if k.isupper()}
    assert named <= set(METHODS), f"methods in protocol/names.py without a handler: {sorted(named - set(METHODS))}"
    assert not documented - set(METHODS), f"in docs/protocol.md without a handler: {sorted(documented - set(METHODS))}"
    assert not set(METHODS) - documented, f"handlers missing from docs/protocol.md: {sorted(set(METHODS) - documented)}"


def test_a_method_outside_its_namespace_is_refused_at_registration():
    rpc = Namespace(methods.grants.ACCESS, "grants")
    with pytest.raises(RuntimeError, match="outside the namespace"):
        rpc.method("budget.get", Empty, Empty, doc="")
    with pytest.raises(RuntimeError, match="outside the namespace"):
        rpc.method("grantsx.get", Empty, Empty, doc="")


def test_every_wire_model_has_the_one_strict_base():
    from relay_jupyter.protocol.strict import Strict

    load_methods()
    loose = sorted(f"{name}: {model.__name__}" for name, spec in METHODS.items()
                   for model in (spec.params, spec.result) if not issubclass(model, Strict))
    assert not loose, f"wire models that do not forbid unknown fields through protocol.strict.Strict: {loose}"
