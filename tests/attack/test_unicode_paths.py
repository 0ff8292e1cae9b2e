"""Attack: name a protected file or a credential so that the matcher and the file system disagree.

The protected-target matcher compares names; a file system may treat two different strings as one file.
macOS's file systems are normalization-insensitive (``cafe\\u0301`` and ``caf\\u00e9`` open the same file) and
case-insensitive with Unicode's folding (KELVIN SIGN is ``k``, LONG S is ``s``). Before this fix, a configured
MCP config, secrets file, relay data dir or Jupyter config dir whose path holds a non-ASCII letter was matched
only in the form it was configured in: its NFD spelling passed the matcher (a pull read it, an approved push
wrote it, on a Mac that is the protected file). Full-width dots and solidi (``\\uff0essh``, ``.ssh\\uff0fid``)
and the ONE DOT LEADER ``\\u2024env`` passed too; now every name is compared NFKC-case-folded, which only
refuses more. Invisible and bidi characters (zero-width joiners, RLO, BOM, soft hyphen: HFS+ ignores some of
them, making ``.g\\u200cit`` be ``.git``) and trailing dots/spaces are refused outright with one line.

Every variant is a real file in the root holding the secret (Linux keeps them apart, so a variant that passed
would read the secret or write next to it), pulled with an approval and pushed with a forged one.
"""

from __future__ import annotations

import asyncio
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest

from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.workspace.scratch import WorkspaceManager
from relay_jupyter.workspace.tools import CALL_CLASS_KEY, WorkspaceTools

NB = "notebook:proj/a.ipynb"
SECRET = "SECRET-u7c0de"
CAFE = "caf\u00e9"  # NFC, as configured


def nfd(s: str) -> str:
    return unicodedata.normalize("NFD", s)


#: (variant as the model sends it, what it stands for on a normalization- or case-insensitive view)
VARIANTS: list[tuple[str, str]] = [
    (f"cfg/{nfd(CAFE)}.json", "the configured MCP config (NFD)"),
    (f"CFG/{CAFE.upper()}.JSON", "the configured MCP config (upper case)"),
    (nfd("cl\u00e9s.toml"), "the configured secrets file (NFD)"),
    (f"{nfd(CAFE)}-data/relay.db", "the relay data dir (NFD)"),
    (f"jcfg-{nfd(CAFE)}/jupyter_server_config.py", "a Jupyter config dir (NFD)"),
    (nfd("note.tok\u00e9n"), "a c.RelayApp.secret_globs name (NFD)"),
    ("\uff0essh/id_ed25519", ".ssh with a full-width dot"),
    (".ssh\uff0fid_rsa", ".ssh/id_rsa with a full-width solidus"),
    ("\u2024env", ".env with ONE DOT LEADER"),
    ("mcp\uff0ejson", "mcp.json with a full-width dot"),
    ("\uff4d\uff43\uff50.json", "mcp.json in full-width letters"),
    (".\u212aube/config", ".kube with KELVIN SIGN"),
    (".\u017f\u017fh/config", ".ssh with LONG S"),
    ("proj/\ufb01les.key", "*.key with the fi ligature"),
    (".g\u200cit/config", ".git with ZWNJ (HFS+ ignores it)"),
    (".gi\u200dt/hooks/pre-commit", ".git with ZWJ"),
    ("\ufeff.ssh/id_rsa", ".ssh behind a BOM"),
    (".s\u00adsh/id_rsa", ".ssh with a soft hyphen"),
    (".ss\u202eh/id_rsa", ".ssh with RLO"),
    ("id_\u200brsa", "id_rsa with a zero-width space"),
    (".git./config", ".git with a trailing dot (Windows drops it)"),
    (".env ", ".env with a trailing space"),
    ("mcp.json.", "mcp.json with a trailing dot"),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("unicode")
    root = tmp / "root"
    (root / "proj").mkdir(parents=True)
    for variant, _why in VARIANTS:
        target = root.joinpath(*variant.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(SECRET)
    data = root / f"{CAFE}-data"
    protected = ProtectedPaths.for_jupyter(
        root, data_dir=data, config_dirs=[root / f"jcfg-{CAFE}"], runtime_dir=tmp / "rt",
        mcp_config=root / "cfg" / f"{CAFE}.json", secrets_file=root / "cl\u00e9s.toml",
        secret_globs=["*.tok\u00e9n"])
    journal = CheckpointJournal(tmp / "relay.db")
    tools = WorkspaceTools(WorkspaceManager(tmp / "workspaces"), root, journal, protected)
    yield SimpleNamespace(root=root, tools=tools, journal=journal, protected=protected)
    journal.close()


@pytest.mark.parametrize("variant,why", VARIANTS, ids=[w for _v, w in VARIANTS])
def test_a_variant_of_a_protected_name_is_refused_for_pull_and_push(env, variant: str, why: str) -> None:
    t = env.tools
    conv = f"u{VARIANTS.index((variant, why))}"  # one workspace per variant: a leak in one shows in that one
    ws = t.manager.for_conversation(conv)
    with pytest.raises(WorkspaceRefusal) as exc:
        _r, preview = asyncio.run(t.preflight(conv, "scratch_pull", {"source": variant, "path": "p"}, origin=NB))
        # a card would be the wrong answer too, but approve it: the secret must still not be read
        asyncio.run(t.call(conv, "scratch_pull", {"source": variant, "path": "p"}, origin=NB,
                           approved_preview={k: v for k, v in preview.items() if k != CALL_CLASS_KEY}))
    assert exc.value.code.value == "PATH_REFUSED", (why, exc.value.message)
    assert "\n" not in exc.value.message
    # an approval forged by a client, without preflight: refused as well
    with pytest.raises(WorkspaceRefusal):
        asyncio.run(t.call(conv, "scratch_pull", {"source": variant, "path": "p"}, origin=NB,
                           approved_preview={"source": variant}))
    assert not ws.exists("p"), why

    asyncio.run(t.call(conv, "scratch_write", {"path": "w.txt", "content": "evil\n"}))
    target = env.root.joinpath(*variant.split("/"))
    with pytest.raises(WorkspaceRefusal):
        asyncio.run(t.preflight(conv, "scratch_push", {"path": "w.txt", "target": variant}, origin=NB))
    forged = {"path": "w.txt", "target": variant, "workspace_sha256": "x", "target_sha256": "y"}
    with pytest.raises(WorkspaceRefusal) as exc:
        asyncio.run(t.call(conv, "scratch_push", {"path": "w.txt", "target": variant}, run_id="r", origin=NB,
                           approved_preview=forged))
    assert exc.value.code.value == "PATH_REFUSED", why
    assert target.read_text() == SECRET and env.journal.list() == [], why


def test_the_configured_forms_are_refused_and_a_look_alike_that_is_another_file_everywhere_is_not(env) -> None:
    """Control: the configured (NFC) spellings are refused, and the folding does not refuse everything
    non-ASCII: a Cyrillic look-alike names another file on every file system, so it is a plain file."""
    for configured in (f"cfg/{CAFE}.json", "cl\u00e9s.toml", f"{CAFE}-data/x", f"jcfg-{CAFE}/x.py"):
        with pytest.raises(WorkspaceRefusal):
            env.protected.resolve(configured)
    look_alike = "proj/.\u0435nv"  # CYRILLIC SMALL LETTER IE, not 'e'
    (env.root / "proj" / ".\u0435nv").write_text("plain notes\n")
    reasons, preview = asyncio.run(env.tools.preflight("look-alike", "scratch_pull", {"source": look_alike, "path": "p"},
                                                       origin=NB))
    assert reasons == [] and preview == {}
    out = asyncio.run(env.tools.call("look-alike", "scratch_pull", {"source": look_alike, "path": "p"}, origin=NB))
    assert not out["is_error"] and env.tools.manager.for_conversation("look-alike").read("p") == b"plain notes\n"
