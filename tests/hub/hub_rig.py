"""A real JupyterHub on 127.0.0.1 with the relay broker as a managed service under its own system user.

- system users made here with ``useradd`` and removed after (``userdel -r``): the service user
  ``relayt-svc`` and the users ``relayt-alice``, ``relayt-bob``, ``relayt-carol`` (names prefixed so they
  can never be a real account);
- JupyterHub from the project venv (as root), ``configurable-http-proxy`` from ``tests/peers`` (npm),
  the dummy authenticator, the group ``ml`` = alice and bob;
- the service runs ``python -m relay_jupyter.cli hub-service`` from the hub venv (Debian's python3, built by
  ``make hub-peers``: the project venv's pyenv Python lives in root's 0700 home) with the relay source on
  ``PYTHONPATH`` from a world-readable copy of this tree, so the code under test is the working tree's;
- its key and settings live in the service user's 0600 files; its model server is the shipped
  FakeAnthropic in the test process;
- an admin service token (``relay-test-admin``) makes the users' tokens through the hub API.

Missing pieces skip with "... is not installed" (a failure under CI=true: tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
HUB_VENV = Path(os.environ.get("RELAY_HUB_VENV", "/opt/relay-test/hub-venv"))
CHP = REPO / "tests" / "peers" / "node_modules" / ".bin" / "configurable-http-proxy"
#: The built side panel (make labext), which the users' JupyterLab loads through JUPYTER_PATH (the hub venv has
#: relay's source on PYTHONPATH, not installed, so nothing put it under share/jupyter/labextensions)
HUB_LABEXTENSION = REPO / "relay_jupyter" / "labextension"
SERVICE_USER = "relayt-svc"
USERS = ("relayt-alice", "relayt-bob", "relayt-carol")
SERVICE = "relay"
KEY = "sk-ant-hub-service-key-0123456789abcdef"
#: The service's token cache here (--auth-cache): a revoked token is refused within it (test_hub_service.py)
AUTH_CACHE = 2
#: How often the service looks for kernels whose server is gone (--server-check): test_hub_kernel_end.py
SERVER_CHECK = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_peers() -> None:
    if os.geteuid() != 0:
        pytest.skip("the hub tests create system users: root is needed (CI runs as root)")
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        pytest.skip("jupyterhub is not installed (pip install -e '.[test]')")
    if not os.access(CHP, os.X_OK):
        pytest.skip("configurable-http-proxy is not installed (make peers)")
    if not os.access(HUB_VENV / "bin" / "python", os.X_OK):
        pytest.skip(f"the hub venv {HUB_VENV} is not installed (make hub-peers)")
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def pids_of(user: str) -> list[int]:
    """The processes running as ``user`` (a test user: only what this rig started as that user)."""
    uid = pwd.getpwnam(user).pw_uid
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _userdel(name: str) -> None:
    try:
        for pid in pids_of(name):  # each by its id: a test user runs only what this rig started
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    except KeyError:
        return
    subprocess.run(["userdel", "-r", "-f", name], capture_output=True, check=False)


def make_users() -> None:
    for name in (SERVICE_USER, *USERS):
        try:
            pwd.getpwnam(name)
            _userdel(name)  # left over by a killed run
        except KeyError:
            pass
    subprocess.run(["useradd", "-r", "-m", "-d", f"/var/lib/{SERVICE_USER}", "-s", "/usr/sbin/nologin", SERVICE_USER],
                   check=True, capture_output=True)
    os.chmod(f"/var/lib/{SERVICE_USER}", 0o700)
    for name in USERS:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)


def remove_users() -> None:
    for name in (SERVICE_USER, *USERS):
        _userdel(name)


def _write_owned(path: Path, text: str, user: str, mode: int = 0o600) -> None:
    pw = pwd.getpwnam(user)
    path.write_text(text)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    os.chmod(path, mode)


class Hub:
    """``with Hub(fake_url, teams=...) as hub: hub.token("relayt-alice", [...]); hub.rpc(token, ...)``."""

    def __init__(self, fake_base_url: str, *, teams: dict[str, Any], store_url: str | None = None,
                 store_password: str | None = None) -> None:
        self.fake_base_url = fake_base_url
        self.teams = teams
        self.store_url = store_url
        self.store_password = store_password
        self.port, self.hub_port, self.proxy_api_port, self.service_port = (free_port() for _ in range(4))
        self.url = f"http://127.0.0.1:{self.port}"
        self.service_url = f"http://127.0.0.1:{self.service_port}"
        self.admin_token = secrets.token_hex(32)
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Hub:
        make_users()
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        # the relay source, readable by the service user (the tree may sit under root's 0700 home in CI)
        self.shared = Path(tempfile.mkdtemp(prefix="relay-hub-"))
        os.chmod(self.shared, 0o755)
        shutil.copytree(REPO / "relay_jupyter", self.shared / "src" / "relay_jupyter",
                        ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
        jupyter_path = self.shared / "jupyter-path"
        if HUB_LABEXTENSION.is_dir():
            shutil.copytree(HUB_LABEXTENSION, jupyter_path / "labextensions" / "relay-jupyter")
        jupyter_path.mkdir(exist_ok=True)
        subprocess.run(["chmod", "-R", "a+rX", str(self.shared / "src"), str(jupyter_path)], check=True)
        self.work = Path(tempfile.mkdtemp(prefix="relay-hub-root-"))  # the hub's own files: root's, 0700
        home = Path(f"/var/lib/{SERVICE_USER}")
        self.service_home = home
        self.service_config = home / "broker.json"
        self.service_data = home / "relay-data"
        settings: dict[str, Any] = {
            "anthropic_base_url": self.fake_base_url, "anthropic_api_key": KEY, "default_model": "claude-test-1",
            "data_dir": str(self.service_data), "teams": self.teams, "consent_timeout": 90}
        self.store_password_file: Path | None = None
        if self.store_url:  # PostgreSQL (scram over TCP): the password only in the service user's 0600 file
            self.store_password_file = home / "pg.password"
            _write_owned(self.store_password_file, (self.store_password or "") + "\n", SERVICE_USER)
            settings.update(store_url=self.store_url, store_password_file=str(self.store_password_file))
        _write_owned(self.service_config, json.dumps(settings), SERVICE_USER)
        cfg = self.work / "jupyterhub_config.py"
        service_cmd = [str(HUB_VENV / "bin" / "python"), "-m", "relay_jupyter.cli", "hub-service",
                       "--config", str(self.service_config), "--auth-cache", str(AUTH_CACHE),
                       "--server-check", str(SERVER_CHECK)]
        cfg.write_text(f"""
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.hub_port}
c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = "{self.work}/jupyterhub-proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {set(USERS)!r}
c.JupyterHub.db_url = "sqlite:///{self.work}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{self.work}/cookie_secret"
c.JupyterHub.pid_file = "{self.work}/jupyterhub.pid"
c.JupyterHub.cleanup_services = True
c.JupyterHub.services = [
    {{"name": {SERVICE!r}, "user": {SERVICE_USER!r}, "url": {self.service_url!r}, "command": {service_cmd!r},
      "cwd": {str(home)!r},
      "environment": {{"PYTHONPATH": {str(self.shared / 'src')!r}, "JUPYTER_CONFIG_DIR": {str(home / '.jupyter')!r},
                       "JUPYTER_DATA_DIR": {str(home / '.jupyter-data')!r},
                       "JUPYTER_RUNTIME_DIR": {str(home / '.jupyter-runtime')!r}, "PYTHONUNBUFFERED": "1"}}}},
    {{"name": "relay-test-admin", "api_token": {self.admin_token!r}}},
]
# users' servers: LocalProcessSpawner as the users' own OS accounts, the hub venv, relay's extension (a thin
# client: it finds the service through RELAY_HUB_SERVICE_URL) and a server token that may reach the service
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{str(HUB_VENV / "bin" / "jupyterhub-singleuser")!r}]
c.Spawner.args = ["--ServerApp.jpserver_extensions={{'relay_jupyter': True}}"]
c.Spawner.environment = {{"PYTHONPATH": {str(self.shared / 'src')!r}, "JUPYTER_PATH": {str(jupyter_path)!r},
                         "RELAY_HUB_SERVICE_URL": "{self.url}/services/{SERVICE}/"}}
c.Spawner.server_token_scopes = ["access:servers!server", "users:activity!user", "access:services!service={SERVICE}"]
c.Spawner.start_timeout = 180
c.Spawner.poll_interval = 3  # the hub notices a killed server (and deletes its token) within this
c.Spawner.http_timeout = 180
c.JupyterHub.load_roles = [
    {{"name": "relay-test-admin", "services": ["relay-test-admin"],
      "scopes": ["admin:users", "admin:groups", "tokens", "read:users", "admin:servers", "access:servers"]}},
    {{"name": "user", "scopes": ["self", "access:services!service={SERVICE}"]}},
    # the service reads its teams' hub groups (members) with its own token
    # (and its users' servers: a killed server's kernels' runs end when the hub drops it)
    {{"name": "relay-service", "services": [{SERVICE!r}], "scopes": ["read:groups", "read:servers"]}},
]
c.JupyterHub.load_groups = {{"ml": {{"users": ["relayt-alice", "relayt-bob"]}},
                             "race": {{"users": ["relayt-alice", "relayt-bob"]}}}}
""")
        self.log_path = self.work / "hub.log"
        self.log = open(self.log_path, "wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JUPYTER", "CI"))}
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(cfg)], cwd=self.work, env=env,
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("jupyterhub exited: " + self.log_text()[-3000:])
            try:
                status, _ = self.hub_api("GET", "users")
                if status == 200 and self._service_up():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the hub or its relay service did not come up: " + self.log_text()[-3000:])
            time.sleep(0.3)  # another process binding its ports

    def _service_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.service_url}/services/{SERVICE}/relay/healthz", timeout=5):
                return True
        except urllib.error.HTTPError:
            return True  # it answers (401 without a token): listening
        except OSError:
            return False

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(2)  # the hub stops its services with SIGINT, then itself
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)
        # a hub that died (or was killed) leaves its proxy running (in a session of its own): end it by the pid
        # the hub wrote for it (c.ConfigurableHTTPProxy.pid_file, in the hub's directory)
        pid_file = getattr(self, "work", None) and self.work / "jupyterhub-proxy.pid"
        if pid_file and pid_file.exists():
            try:
                pid = int(pid_file.read_text().strip())
                if b"configurable-http-proxy" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, 9)
            except (OSError, ValueError):
                pass
        if getattr(self, "log", None) is not None:
            self.log.close()
        remove_users()
        for d in (getattr(self, "shared", None), getattr(self, "work", None)):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------------ hub API (the admin service's token)
    def hub_api(self, verb: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}/hub/api/{path}", data=data, method=verb,
                                     headers={"Authorization": f"token {self.admin_token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def token(self, user: str, scopes: list[str] | None = None) -> str:
        """A new API token of ``user`` (with ``scopes``, else the user's own)."""
        body: dict[str, Any] = {"note": "relay hub test", "expires_in": 3600}
        if scopes is not None:
            body["scopes"] = scopes
        status, reply = self.hub_api("POST", f"users/{user}/tokens", body)
        assert status == 201, (status, reply)
        return str(reply["token"])

    # ------------------------------------------------------------------ the relay service
    def request(self, path: str, *, token: str | None, body: bytes | None = None, client: str = "kernel:analysis.ipynb",
                via_proxy: bool = True, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        base = self.url if via_proxy else self.service_url
        hdrs = {"X-Relay-Client": client, "Content-Type": "application/json", **(headers or {})}
        if token is not None:
            hdrs["Authorization"] = f"token {token}"
        req = urllib.request.Request(f"{base}/services/{SERVICE}/relay/{path}", data=body,
                                     method="POST" if body is not None else "GET", headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def rpc(self, token: str, method: str, params: dict[str, Any] | None = None, *,
            client: str = "kernel:analysis.ipynb", via_proxy: bool = True) -> dict[str, Any]:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()
        status, raw = self.request("rpc", token=token, body=body, client=client, via_proxy=via_proxy)
        assert status == 200, (status, raw[:500])
        return json.loads(raw)

    def service_pids(self) -> list[int]:
        """Processes of the service user (the relay service and nothing else)."""
        return pids_of(SERVICE_USER)


def service_cli(hub: Hub, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``jupyter relay ARGS`` as the service's user, with its settings (what an admin runs with sudo -u)."""
    home = str(hub.service_home)
    extra = env or {}
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "PYTHONPATH": str(hub.shared / "src"),
           "JUPYTER_CONFIG_DIR": f"{home}/.jupyter", "JUPYTER_DATA_DIR": f"{home}/.jupyter-data",
           "JUPYTER_RUNTIME_DIR": f"{home}/.jupyter-runtime", **extra}
    return subprocess.run([shutil.which("runuser") or "runuser", "-u", SERVICE_USER, "--",
                           str(HUB_VENV / "bin" / "python"), "-m", "relay_jupyter.cli", *args,
                           "--config", str(hub.service_config)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=home, check=False)


def run_as(user: str, code: str, env: dict[str, str] | None = None, timeout: float = 60) -> dict[str, Any]:
    """Run ``code`` (stdlib Python printing one JSON line) as the OS user ``user``: what that user's kernel
    code could do."""
    result = subprocess.run([shutil.which("runuser") or "runuser", "-u", user, "--", "/usr/bin/python3", "-c", code], capture_output=True,
                            text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin", **(env or {})},
                            cwd="/", check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
