"""Protected targets: refused case-folded, before and after resolution, existing or not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths


@pytest.fixture
def rules(tmp_path: Path) -> ProtectedPaths:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "data").mkdir()
    (root / "conf").mkdir()
    return ProtectedPaths.for_jupyter(root, data_dir=tmp_path / "data", config_dirs=[root / "conf"],
                                      runtime_dir=tmp_path / "runtime")


@pytest.mark.parametrize("target", [
    ".git/config", ".GIT/hooks/pre-commit", "sub/.Git/x", "mcp.json", "a/MCP.JSON",
    ".ipynb_checkpoints/n-checkpoint.ipynb", "sub/.IPYNB_CHECKPOINTS/x", "conf/jupyter_server_config.py",
    "CONF/x.json", "../outside.txt",
])
def test_protected_targets_are_refused(rules: ProtectedPaths, target: str) -> None:
    with pytest.raises(WorkspaceRefusal) as exc:
        rules.resolve(target)
    assert exc.value.code.value == "PATH_REFUSED"


def test_plain_targets_pass_even_when_missing(rules: ProtectedPaths) -> None:
    parts, resolved = rules.resolve("notes/new.md")
    assert parts == ("notes", "new.md") and resolved == rules.root / "notes" / "new.md"


def test_symlinked_parents_count_as_where_they_point(rules: ProtectedPaths, tmp_path: Path) -> None:
    os.symlink(tmp_path / "data", rules.root / "innocent")
    os.symlink(tmp_path, rules.root / "up")
    (rules.root / "repo" / ".git").mkdir(parents=True)
    os.symlink(rules.root / "repo" / ".git", rules.root / "g")
    for target in ("innocent/relay.db", "up/elsewhere.txt", "g/config"):
        with pytest.raises(WorkspaceRefusal):
            rules.resolve(target)


def test_a_sibling_with_a_common_prefix_is_outside(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "ws-evil").mkdir()
    os.symlink(tmp_path / "ws-evil", root / "link")
    with pytest.raises(WorkspaceRefusal):
        ProtectedPaths(root).resolve("link/x")


# -- issue 11 items 2 and 3: credential stores, protected by role, read roots -------------------------

from relay_jupyter.core.errors import ConfigRefusal  # noqa: E402
from relay_jupyter.core.protected import NOTEBOOK_DIR, ReadRoots, notebook_dir  # noqa: E402

CREDENTIAL_TARGETS = [
    ".ssh/id_rsa", ".ssh/authorized_keys", ".SSH/config", "home/u/.ssh/known_hosts", ".aws/credentials",
    ".AWS/config", ".gnupg/private-keys-v1.d/x.key", ".config/gcloud/credentials.db",
    ".Config/GCloud/application_default_credentials.json", ".azure/accessTokens.json", ".kube/config",
    ".docker/config.json", "proj/.Docker/Config.JSON", ".netrc", "sub/.NETRC", ".git-credentials", ".pypirc",
    ".npmrc", ".env", ".ENV", "app/.env", ".env.local", ".env.production", "certs/server.pem", "tls/SERVER.PEM",
    "keys/api.key", "id_rsa", "id_rsa.pub", "backup/id_ed25519", "id_ecdsa_sk", "ID_ED25519.old",
    ".env/lib/site.py",  # a component named like a credential: refused as a whole
]


@pytest.mark.parametrize("target", CREDENTIAL_TARGETS)
def test_credential_stores_are_refused_with_one_clear_reason(rules: ProtectedPaths, target: str) -> None:
    with pytest.raises(WorkspaceRefusal) as exc:
        rules.resolve(target)
    assert exc.value.code.value == "PATH_REFUSED"
    assert "credential" in exc.value.message and "even with approval" in exc.value.message


@pytest.mark.parametrize("target", ["environment.yml", "notes/ssh.md", "keyboard.py", "pem/readme.txt",
                                    "my.env.txt", "docker/config.json", "config/gcloud.md", "key.txt"])
def test_lookalikes_of_credentials_pass(rules: ProtectedPaths, target: str) -> None:
    rules.resolve(target)


def test_a_symlink_into_a_credential_store_counts_as_where_it_points(rules: ProtectedPaths) -> None:
    (rules.root / ".ssh").mkdir()
    (rules.root / ".ssh" / "id_rsa").write_text("PRIVATE")
    os.symlink(rules.root / ".ssh", rules.root / "harmless")
    os.symlink(rules.root / ".ssh" / "id_rsa", rules.root / "notes.txt")
    for target in ("harmless/id_rsa", "notes.txt"):
        with pytest.raises(WorkspaceRefusal) as exc:
            rules.resolve(target)
        assert "credential" in exc.value.message


def test_secret_globs_add_names_and_paths(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    rules = ProtectedPaths(root, secret_globs=["*.kdbx", "private/*", "/vault/"])
    for target in ("db/Passwords.KDBX", "private/plan.txt", "Private/x/y", "vault/a", "x/vault/b"):
        with pytest.raises(WorkspaceRefusal) as exc:
            rules.resolve(target)
        assert "credential" in exc.value.message or "secret glob" in exc.value.message
    rules.resolve("notprivate/plan.txt")
    with pytest.raises(ConfigRefusal):
        ProtectedPaths(root, secret_globs=["/"])


def test_role_files_are_refused_whatever_their_names(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "cfg").mkdir(parents=True)
    mcp = root / "cfg" / "servers.json"
    secrets = root / "keys.toml"
    rules = ProtectedPaths.for_jupyter(root, data_dir=tmp_path / "data", config_dirs=[], runtime_dir=tmp_path / "rt",
                                       data_dirs=[root / "share" / "jupyter"], mcp_config=mcp, secrets_file=secrets)
    os.symlink(mcp, root / "alias.json")
    cases = {"cfg/servers.json": "MCP configuration", "CFG/Servers.JSON": "MCP configuration",
             "alias.json": "MCP configuration", "keys.toml": "secrets file",
             "share/jupyter/kernels/python3/kernel.json": "Jupyter data dir"}
    for target, why in cases.items():
        with pytest.raises(WorkspaceRefusal) as exc:
            rules.resolve(target)
        assert why in exc.value.message, (target, exc.value.message)
    rules.resolve("cfg/other.json")


def test_notebook_dir_of_an_origin() -> None:
    assert notebook_dir("notebook:a.ipynb") == ()
    assert notebook_dir("notebook:sub/dir/a.ipynb") == ("sub", "dir")
    for origin in ("daemon:kernel:a", "kernel:123", None, "notebook:../x.ipynb", "notebook:/etc/x.ipynb",
                   "notebook:"):
        assert notebook_dir(origin) is None


def test_read_roots_cover_the_notebook_dir_and_configured_dirs() -> None:
    roots = ReadRoots()
    assert roots.covers("notebook:sub/a.ipynb", ("sub", "data.csv"), ("sub", "data.csv"))
    assert roots.covers("notebook:sub/a.ipynb", ("sub", "deep", "x"))
    assert not roots.covers("notebook:sub/a.ipynb", ("other", "x"))
    assert not roots.covers("notebook:sub/a.ipynb", ("sub", "x"), ("other", "x"))  # resolves elsewhere
    assert not roots.covers("notebook:sub/a.ipynb", ("sub", "x"), None)  # resolves outside the root
    assert not roots.covers("notebook:sub/a.ipynb", ("Sub", "x"))  # exact, not folded: never wider
    assert not roots.covers("daemon:kernel:nb", ("x",))  # no notebook: every pull asks
    both = ReadRoots([NOTEBOOK_DIR, "data"])
    assert both.covers("daemon:cli", ("data", "x.csv")) and not both.covers("daemon:cli", ("x.csv",))
    assert ReadRoots(["."]).covers("daemon:cli", ("anything",))
    assert ReadRoots([]).roots_for("notebook:a.ipynb") == []
    assert "every pull asks" in ReadRoots([]).describe("notebook:a.ipynb")
    for bad in ("../up", "/abs", "a/../b", "~/x"):
        with pytest.raises(ConfigRefusal) as exc:
            ReadRoots([bad])
        assert exc.value.message.startswith("c.RelayApp.read_roots: ") and "\n" not in exc.value.message


def test_a_root_inside_a_credential_store_still_refuses_it(tmp_path: Path) -> None:
    root = tmp_path / ".config"
    (root / "gcloud").mkdir(parents=True)
    rules = ProtectedPaths(root)
    with pytest.raises(WorkspaceRefusal) as exc:
        rules.resolve("gcloud/credentials.db")
    assert "credential store (.config/gcloud)" in exc.value.message
    rules.resolve("other/settings.json")
    ssh_root = tmp_path / "home" / ".ssh"
    ssh_root.mkdir(parents=True)
    with pytest.raises(WorkspaceRefusal):
        ProtectedPaths(ssh_root).resolve("config")
