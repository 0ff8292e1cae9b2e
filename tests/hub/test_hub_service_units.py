"""The hub service's pieces that need no hub: the service environment, origins, the thin client's URL,
and SIGINT/SIGTERM handled by the service itself (the hub stops services with SIGINT; started from a
non-interactive shell a process inherits SIGINT as ignored, so the service must install its own handler)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from relay_jupyter.core.errors import ConfigRefusal
from relay_jupyter.core.teams import Team, Teams, TeamBudget, teams_for_origin
from relay_jupyter.server.hub_service import HubEnv, hub_origin, thin_client_url

HUB_ENV = {"JUPYTERHUB_SERVICE_NAME": "relay", "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:10101",
           "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api", "JUPYTERHUB_API_TOKEN": "svc-token-0123456789"}


def test_service_environment_is_read_and_a_missing_one_is_one_line() -> None:
    env = HubEnv.from_env(HUB_ENV)
    assert (env.name, env.host, env.port, env.prefix) == ("relay", "127.0.0.1", 10101, "/services/relay/")
    assert env.access_scope == "access:services!service=relay"
    assert "svc-token" not in repr(env)  # the service's token is never shown
    with pytest.raises(ConfigRefusal) as err:
        HubEnv.from_env({k: v for k, v in HUB_ENV.items() if k != "JUPYTERHUB_API_TOKEN"})
    assert "JUPYTERHUB_API_TOKEN" in err.value.message and "\n" not in err.value.message
    with pytest.raises(ConfigRefusal) as err:
        HubEnv.from_env({**HUB_ENV, "JUPYTERHUB_SERVICE_URL": "unix:///x"})
    assert "JUPYTERHUB_SERVICE_URL" in err.value.message


def test_origins_carry_the_user_and_the_notebook() -> None:
    assert hub_origin("alice", "kernel:work/a.ipynb") == "user:alice/notebook:work/a.ipynb"
    assert hub_origin("alice", "default") == "user:alice/client:default"
    assert hub_origin("alice", "kernel:") == "user:alice/client:kernel:"


def test_kernel_tools_go_to_a_hub_users_kernel_and_no_other_client() -> None:
    from relay_jupyter.core.tooling import ToolContext, is_hub_kernel_client, offers_kernel_tools

    assert is_hub_kernel_client("user:alice/kernel:work_a.ipynb")
    for other in ("user:alice/client:default", "user:alice/kernel:", "user:/kernel:x", "user:alice",
                  "daemon:user:alice/kernel:x", "browser:alice:default", "kernel:abc", None, ""):
        assert not is_hub_kernel_client(other), other
    ctx = ToolContext(origin="user:alice/notebook:a.ipynb", conversation="c", caller_kind="daemon",
                      originator="user:alice/kernel:a.ipynb")
    assert offers_kernel_tools(ctx)
    assert not offers_kernel_tools(ToolContext(origin="user:alice/client:x", conversation="c", caller_kind="daemon",
                                               originator="user:alice/client:x"))


def test_the_thin_client_names_each_kernel_as_the_kernel_names_itself(monkeypatch) -> None:
    from relay_jupyter.kernel.discovery import notebook_client_name
    from relay_jupyter.server.hub_service import ThinKernels

    kernels = ThinKernels("http://127.0.0.1:1/services/relay/", lambda: None)
    path = "/home/alice/work dir/" + "x" * 80 + ".ipynb"  # a long path with a space: the fitted name
    kernels.started("k1", {"JPY_SESSION_NAME": path})
    kernels.started("k2", {"JPY_SESSION_NAME": path, "RELAY_NOTEBOOK": "/home/alice/other.ipynb"})
    kernels.started("k3", {})  # no notebook: the kernel names itself kernel:anon-…, nothing to tell
    monkeypatch.delenv("RELAY_NOTEBOOK", raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", path)
    assert kernels.client_name("k1") == notebook_client_name()
    monkeypatch.setenv("RELAY_NOTEBOOK", "/home/alice/other.ipynb")
    assert kernels.client_name("k2") == notebook_client_name()
    assert kernels.client_name("k3") is None
    kernels.ended("k3", "shut down")  # unknown: nothing scheduled (no loop is even needed)
    # a kernel the thin server started has an instance id: without a notebook it is kernel:anon-<instance>, which
    # the server knows too; two kernels of one notebook are told apart by their instances
    kernels.started("k4", {"RELAY_KERNEL_INSTANCE": "0123456789abcdef"})
    kernels.started("k5", {"JPY_SESSION_NAME": path, "RELAY_KERNEL_INSTANCE": "fedcba9876543210"})
    assert (kernels.client_name("k4"), kernels.instance("k4")) == ("kernel:anon-0123456789ab", "0123456789abcdef")
    assert (kernels.client_name("k5"), kernels.instance("k5")) == (kernels.client_name("k1"), "fedcba9876543210")
    kernels.started("k6", {"RELAY_KERNEL_INSTANCE": "not-hex"})  # malformed: ignored, as the kernel ignores it
    assert kernels.client_name("k6") is None


def test_thin_client_url_from_config_or_environment() -> None:
    assert thin_client_url("", {}) is None
    assert thin_client_url("", {"RELAY_HUB_SERVICE_URL": "http://127.0.0.1:8000/services/relay"}) == \
        "http://127.0.0.1:8000/services/relay/"
    assert thin_client_url("http://hub:8000/services/r/", {"RELAY_HUB_SERVICE_URL": "http://x/"}) == \
        "http://hub:8000/services/r/"
    for bad in ("ftp://hub/services/r/", "http://user:pw@hub/services/r/", "http://hub/?token=x", "hub"):
        with pytest.raises(ConfigRefusal):
            thin_client_url(bad, {})


def test_hub_groups_name_teams() -> None:
    teams = Teams([Team(name="ml", budget=TeamBudget(tokens_per_day=10)),
                   Team(name="ops", members=frozenset({"carol"}), budget=TeamBudget(tokens_per_day=5))])
    groups = {"alice": ["ml", "unrelated"], "carol": []}
    of = teams_for_origin(teams, None, lambda user: groups.get(user, ()))
    assert [t.name for t in of("user:alice/notebook:a.ipynb")] == ["ml"]
    assert [t.name for t in of("user:carol/notebook:a.ipynb")] == ["ops"]  # listed members still count
    assert of("user:bob/notebook:a.ipynb") == []
    assert of("notebook:a.ipynb") == []  # no user: no team


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_service_stops_on_sigint_and_sigterm_even_when_sigint_was_ignored(tmp_path: Path, sig) -> None:
    pytest.importorskip("jupyterhub", reason="jupyterhub is not installed (pip install -e '.[test]')")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JUPYTER"))}
    env.update(HUB_ENV, JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{port}", JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               PYTHONUNBUFFERED="1")
    config = tmp_path / "broker.json"
    config.write_text('{"in_memory": true}')

    def ignore_sigint() -> None:  # what a non-interactive shell does to a background job
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "relay_jupyter.cli", "hub-service", "--config", str(config)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=ignore_sigint)
    try:
        assert proc.stdout is not None
        seen = b""
        while b"listening on" not in seen:
            line = proc.stdout.readline()
            assert line, seen.decode(errors="replace")
            seen += line
        assert f"http://127.0.0.1:{port}/services/relay/relay/".encode() in seen
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, (seen + rest).decode(errors="replace")
        assert b"stopping (signal)" in rest
        assert b"svc-token" not in seen + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_outside_a_hub_the_command_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JUPYTER"))}
    env.update(JUPYTER_DATA_DIR=str(tmp_path / "d"), JUPYTER_CONFIG_DIR=str(tmp_path / "c"))
    result = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "hub-service"], env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "JUPYTERHUB_SERVICE_NAME" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_services_copy_of_its_hub_groups_is_private_and_a_dead_hub_is_one_line(tmp_path: Path) -> None:
    from relay_jupyter.server.hub_service import (HUB_GROUPS_FILE, HubGroupsUnavailable, fetch_hub_groups,
                                                  hub_group_members, read_hub_groups, write_hub_groups)

    path = tmp_path / HUB_GROUPS_FILE
    write_hub_groups(path, {"ml": {"bob", "alice"}, "race": set()})
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_hub_groups(path) == {"ml": frozenset({"alice", "bob"}), "race": frozenset()}
    assert hub_group_members("ml", tmp_path, environ={}) == {"alice", "bob"}
    assert hub_group_members("nope", tmp_path, environ={}) == frozenset()
    path.write_text("{not json")
    assert read_hub_groups(path) is None and hub_group_members("ml", tmp_path, environ={}) == frozenset()
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/hub/api"
    secret = "hub-token-" + "9" * 40
    with pytest.raises(HubGroupsUnavailable) as err:
        fetch_hub_groups(dead, secret, ["ml"], timeout=5)
    assert secret not in err.value.reason and "\n" not in err.value.reason
    with pytest.raises(HubGroupsUnavailable):  # a hub token set: never a silent fallback to the copy
        hub_group_members("ml", tmp_path, environ={"JUPYTERHUB_API_URL": dead, "JUPYTERHUB_API_TOKEN": secret})


def test_the_users_servers_come_from_the_hub_api_and_no_answer_is_never_a_guess() -> None:
    """``fetch_user_servers`` (what the service asks before ending a killed server's kernels' runs): the servers of a
    user, None for a user the hub does not have, and an error (never "no servers") for a hub that refuses the
    service (no ``read:servers``: a model without ``servers``, or 403) or does not answer."""
    import json as _json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from relay_jupyter.server.hub_service import HubServersUnavailable, fetch_user_servers

    models = {"alice": {"name": "alice", "servers": {"": {"ready": True}}}, "bob": {"name": "bob", "servers": {}},
              "carol": {"name": "carol"}}
    seen_tokens: list[str] = []

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen_tokens.append(self.headers.get("Authorization", ""))
            name = self.path.rsplit("/", 1)[1]
            if name == "dave":
                self.send_response(403)
                self.end_headers()
                return
            body = _json.dumps(models[name]).encode() if name in models else None
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        api = f"http://127.0.0.1:{server.server_address[1]}/hub/api"
        assert fetch_user_servers(api, "svc-token", "alice") == {"": {"ready": True}}
        assert fetch_user_servers(api, "svc-token", "bob") == {}  # no server left: her kernels' runs end
        assert fetch_user_servers(api, "svc-token", "nobody") is None
        for refused in ("carol", "dave"):  # the service's role lacks read:servers
            with pytest.raises(HubServersUnavailable) as err:
                fetch_user_servers(api, "svc-token", refused)
            assert "read:servers" in err.value.reason and "svc-token" not in err.value.reason
        assert set(seen_tokens) == {"token svc-token"}
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(HubServersUnavailable):  # nobody listens there any more
        fetch_user_servers(api, "svc-token", "alice", timeout=5)
