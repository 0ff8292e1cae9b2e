"""Per-notebook ``X-Relay-Client``: each notebook attached to the standalone daemon has its own origin."""

from __future__ import annotations

import re

import pytest

from relay_jupyter.kernel.discovery import is_anonymous_client_name, notebook_client_name
from relay_jupyter.runtime.tools import is_daemon_kernel_client

ALLOWED = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # what the daemon accepts (server/daemon_auth.py)


def test_name_from_jupyter_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/work/analysis.ipynb")
    assert notebook_client_name({}) == "kernel:home_me_work_analysis.ipynb"


def test_name_from_vscode_then_a_fresh_name_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.delenv("RELAY_NOTEBOOK", raising=False)
    assert notebook_client_name({"__vsc_ipynb_file__": "c:\\proj\\sales report.ipynb"}) \
        == "kernel:c:_proj_sales_report.ipynb"
    # no path known (nbclient, papermill): a name of this kernel's own, never the shared "kernel"
    anon = notebook_client_name({})
    assert is_anonymous_client_name(anon) and re.fullmatch(r"kernel:anon-[0-9a-f]{12}", anon)
    assert notebook_client_name(None) == anon == notebook_client_name({"__vsc_ipynb_file__": 42})
    assert is_daemon_kernel_client(f"daemon:{anon}")


def test_relay_notebook_names_a_headless_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JPY_SESSION_NAME", "ignored.ipynb")
    monkeypatch.setenv("RELAY_NOTEBOOK", "reports/daily.ipynb")
    assert notebook_client_name({}) == "kernel:reports_daily.ipynb"


def test_two_kernel_processes_get_different_anonymous_names() -> None:
    import subprocess
    import sys

    code = ("import os; [os.environ.pop(k, None) for k in ('JPY_SESSION_NAME', 'RELAY_NOTEBOOK')];"
            "from relay_jupyter.kernel.discovery import notebook_client_name; print(notebook_client_name({}))")
    names = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
             for _ in range(2)}
    assert len(names) == 2 and all(is_anonymous_client_name(n) for n in names)


@pytest.mark.parametrize("raw", ["a" * 500, "/x/" + "é" * 80 + "/n.ipynb", "日本語.ipynb", "\n\t", "../../etc/passwd",
                                 "x\r\nX-Evil: 1"])
def test_hostile_and_long_names_are_sanitised(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("JPY_SESSION_NAME", raw)
    name = notebook_client_name({})
    assert ALLOWED.fullmatch(name), name
    assert name.startswith("kernel")
    # the daemon makes it daemon:<name>, which the broker and the runtime treat as a kernel client
    assert is_daemon_kernel_client(f"daemon:{name}")


def test_long_paths_differing_only_early_get_different_names(monkeypatch: pytest.MonkeyPatch) -> None:
    names = set()
    for top in ("alpha", "beta"):
        monkeypatch.setenv("JPY_SESSION_NAME", f"/{top}/" + "deep/" * 30 + "same.ipynb")
        names.add(notebook_client_name({}))
    assert len(names) == 2 and all(n.endswith("same.ipynb") for n in names)


def test_only_kernel_names_are_kernel_clients() -> None:
    assert is_daemon_kernel_client("daemon:kernel")
    assert is_daemon_kernel_client("daemon:kernel:nb.ipynb")
    assert not is_daemon_kernel_client("daemon:kernelx")
    assert not is_daemon_kernel_client("daemon:cli")
    assert not is_daemon_kernel_client(None)


def test_a_notebook_kernel_sends_its_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from .conftest import execute, start_kernel
    from .fake_broker import FakeBroker

    with FakeBroker() as broker:
        km, kc = start_kernel({**broker.env(), "JPY_SESSION_NAME": "/w/Sales Q3.ipynb"}, str(tmp_path))
        try:
            assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
            broker.script([("text", "hi")])
            reply, _ = execute(kc, "%%agent\nhello", timeout=60)
            assert reply["status"] == "ok"
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    assert set(broker.clients) == {"kernel:w_Sales_Q3.ipynb"}
