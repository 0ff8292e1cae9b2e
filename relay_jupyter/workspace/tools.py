"""The scratch tools as the model and ``tools.call`` see them: specs, preflight, call.

:class:`WorkspaceTools` is a :class:`~relay_jupyter.core.tooling.ToolSource` (its ``tool_*``
methods): the one executor runs model-proposed calls and ``tools.call`` alike through
``preflight -> gate -> consent -> call``. Refusals are raised as ``WorkspaceRefusal`` (the
executor turns them into an error result carrying the code).

Classes: ``scratch_list``, ``scratch_read`` and ``scratch_pull`` are READ; ``scratch_write``,
``scratch_edit`` and ``scratch_delete`` are CONTAINED (they change only the conversation's
workspace and run in every mode); ``scratch_push`` is WRITE and the only one that is not
parallel-safe. Its consent card data (``preview``) carries the target, size, SHA-256, a redacted
20-line head and the diff against the current target; at execution both digests are compared with
the approved preview (``DIGEST_MISMATCH``, nothing written) and protected targets are refused even
when approved.

Reads are scoped: a ``scratch_pull`` from under the caller's read roots (``c.RelayApp.read_roots``,
default the notebook's own directory: :class:`core.protected.ReadRoots`) stays READ; any other pull
is WRITE *for that call* (the preflight's preview carries :data:`CALL_CLASS_KEY`;
:meth:`WorkspaceTools.tool_preflight` turns it into ``Preflight.tool_class``): it needs a click, and the card names the file and
says its bytes go to the model provider; the approval is bound to the file's digest. Protected
targets and credential stores (:mod:`core.protected`) are refused for pull and push alike, even
with approval.

Bounds before work: a pull stats the source and checks the workspace quota before reading; an
edit's result size is computed from its matches and refused (``QUOTA_EXCEEDED``) before it is
built, against the file and workspace quotas and :data:`MAX_CALL_BYTES`.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from pathlib import Path
from typing import Any

from relay_jupyter.core.diff import unified_diff
from relay_jupyter.core.edit import Edit, apply_edits
from relay_jupyter.core.errors import Code, WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths, ReadRoots
from relay_jupyter.core.redact import mask_secret_lines
from relay_jupyter.core.tooling import Preflight, ToolContext, ToolResult, as_result
from relay_jupyter.core.types import ToolClass, ToolSpec
from relay_jupyter.core.wspaths import MAX_PATH_BYTES, split_relpath
from relay_jupyter.storage.checkpoints import CheckpointJournal, sha256

from .checkpointing import journaled_write, reconcile, revert
from .rootfiles import RootFiles
from .scratch import WorkspaceManager

__all__ = ["WorkspaceTools", "TOOL_NAMES", "HEAD_LINES", "MAX_RESULT_DIFF", "MAX_PREVIEW_DIFF_INPUT",
           "MAX_CALL_BYTES", "CALL_CLASS_KEY"]

HEAD_LINES = 20
#: Diffs longer than this are cut in the text returned to the model (the file is intact).
MAX_RESULT_DIFF = 256 * 1024
#: Above this size (old + new) the push card says the diff was not computed.
MAX_PREVIEW_DIFF_INPUT = 4 * 1024 * 1024
#: Largest result one call may build in memory (an edit's new file), whatever the quotas say.
MAX_CALL_BYTES = 64 * 1024 * 1024
#: Preview key by which a preflight makes one call stricter than its spec (``tool_preflight`` pops it
#: into ``Preflight.tool_class``; never shown as card data).
CALL_CLASS_KEY = "tool_class"
_READ_DEFAULT_LINES = 2000
_READ_MAX_BYTES = 256 * 1024

_PATH = {"type": "string", "minLength": 1, "maxLength": MAX_PATH_BYTES}


def _spec(name: str, description: str, props: dict[str, Any], required: list[str], cls: ToolClass,
          parallel: bool = True) -> ToolSpec:
    schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return ToolSpec(name=name, description=description, input_schema=schema, tool_class=cls,
                    parallel_safe=parallel)


_SPECS = (
    _spec("scratch_list", "List the files in this conversation's scratch workspace, with sizes.",
          {"path": {**_PATH, "description": "Directory to list (default: the whole workspace)."}}, [],
          ToolClass.READ),
    _spec("scratch_read", "Read a text file from the scratch workspace (a range of lines for long files).",
          {"path": _PATH, "start_line": {"type": "integer", "minimum": 1},
           "max_lines": {"type": "integer", "minimum": 1, "maximum": 20000}}, ["path"], ToolClass.READ),
    _spec("scratch_write", "Create or replace a UTF-8 text file in the scratch workspace.",
          {"path": _PATH, "content": {"type": "string"}}, ["path", "content"], ToolClass.CONTAINED),
    _spec("scratch_edit",
          "Edit a workspace file with exact replacements. Every old_text is matched against the file as it "
          "was before this call and must match exactly once (unless replace_all); all edits apply or none. "
          "Returns a unified diff, not the file.",
          {"path": _PATH, "edits": {"type": "array", "minItems": 1, "maxItems": 100, "items": {
              "type": "object", "additionalProperties": False, "required": ["old_text", "new_text"],
              "properties": {"old_text": {"type": "string", "minLength": 1}, "new_text": {"type": "string"},
                             "replace_all": {"type": "boolean"}}}}},
          ["path", "edits"], ToolClass.CONTAINED),
    _spec("scratch_delete", "Delete a file (or an empty directory) from the scratch workspace.",
          {"path": _PATH}, ["path"], ToolClass.CONTAINED),
    _spec("scratch_pull", "Copy a file from the Jupyter root into the scratch workspace (bytes, any encoding). "
          "Files outside the notebook's own directory need the user's approval first; credentials (.ssh/, .env, "
          "*.pem, ...), Jupyter and relay configuration are always refused.",
          {"source": {**_PATH, "description": "Path relative to the Jupyter root."}, "path": _PATH},
          ["source", "path"], ToolClass.READ),
    _spec("scratch_push",
          "Write a workspace file to a path in the Jupyter root. Needs the user's approval of its size, "
          "digest, head and diff; the push is journaled and can be reverted.",
          {"path": _PATH, "target": {**_PATH, "description": "Path relative to the Jupyter root."}},
          ["path", "target"], ToolClass.WRITE, parallel=False),
)
TOOL_NAMES = frozenset(s.name for s in _SPECS)
_BY_NAME = {s.name: s for s in _SPECS}


def _text(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def _head(data: bytes) -> list[str]:
    text = data[: 64 * 1024].decode("utf-8", "replace")
    lines = [line[:200] for line in text.splitlines()[:HEAD_LINES]]
    return mask_secret_lines(lines)


class WorkspaceTools:
    """Scratch tools over a :class:`WorkspaceManager`, the Jupyter root, the checkpoint journal."""

    def __init__(self, manager: WorkspaceManager, jupyter_root: Path, checkpoints: CheckpointJournal,
                 protected: ProtectedPaths | None = None, *, read_roots: ReadRoots | None = None,
                 umask: int | None = None) -> None:
        self.manager = manager
        self.checkpoints = checkpoints
        self.protected = protected or ProtectedPaths(jupyter_root)
        self.read_roots = read_roots if read_roots is not None else ReadRoots()
        max_file = int(manager.limits.get("max_file_bytes", 8 * 1024 * 1024))
        self.files = RootFiles(self.protected, max_file_bytes=max_file, umask=umask)
        self._push_lock = threading.Lock()  # pushes and reverts of the Jupyter root, one at a time

    def specs(self) -> list[ToolSpec]:
        """The seven scratch tools."""
        return list(_SPECS)

    # -- ToolSource (core/tooling.py) ------------------------------------------------------

    def tool_specs(self, ctx: ToolContext) -> list[ToolSpec]:
        """The scratch tools, to every caller (they act on the caller's own conversation)."""
        return list(_SPECS)

    async def tool_current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        """Built-in tools do not change while the broker runs."""
        return _BY_NAME.get(name)

    async def tool_preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """:meth:`preflight` for ``ctx``'s conversation and origin; the :data:`CALL_CLASS_KEY` entry
        (a pull outside the read roots: ``write``) becomes this call's class."""
        reasons, preview = await self.preflight(ctx.conversation, name, args, origin=ctx.origin)
        preview = dict(preview or {})
        cls = preview.pop(CALL_CLASS_KEY, None)
        return Preflight(tuple(reasons or ()), preview, tool_class=ToolClass(cls) if cls else None)

    async def tool_call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                        approved_preview: dict[str, Any]) -> ToolResult:
        """:meth:`call`; the approval stays bound to the preview (push and pull digests)."""
        return as_result(await self.call(ctx.conversation, name, args, run_id=ctx.run_id, origin=ctx.origin,
                                         approved_preview=approved_preview))

    # -- preflight -------------------------------------------------------------------------

    async def preflight(self, conversation: str | None, tool: str, arguments: dict[str, Any], *,
                        origin: str | None = None) -> tuple[list[str], dict[str, Any]]:
        """Local checks before the gate; for a push or a pull outside ``origin``'s read roots, the
        consent card's reasons and data (a stricter class for this call under :data:`CALL_CLASS_KEY`).
        ``origin`` None has no read roots: every pull asks.

        Raises:
            WorkspaceRefusal: a malformed or protected path, a missing workspace file.
        """
        self._known(tool)
        return await asyncio.to_thread(self._preflight, conversation, tool, dict(arguments), origin)

    def _preflight(self, conversation: str | None, tool: str, args: dict[str, Any], origin: str | None = None
                   ) -> tuple[list[str], dict[str, Any]]:
        if "path" in args:
            split_relpath(args["path"])
        if tool == "scratch_pull":
            return self._pull_card(_arg(args, "source"), origin)
        if tool != "scratch_push":
            return [], {}
        ws = self.manager.for_conversation(_conv(conversation))
        path, target = _arg(args, "path"), _arg(args, "target")
        self.files.check(target)
        data = ws.read(path)
        current = self.files.read(target)
        digest, cur_digest = sha256(data), sha256(current)
        preview: dict[str, Any] = {
            "path": path, "target": target, "size": len(data), "sha256": digest,
            "workspace_sha256": digest, "target_sha256": cur_digest, "target_exists": current is not None,
            "head": _head(data), "binary": _text(data) is None,
        }
        preview.update(self._card_diff(target, current, data))
        reasons = [
            f"writes {target} in the Jupyter root ({'replaces the existing file' if current is not None else 'new file'})",
            f"size {len(data)} bytes, sha256 {digest}",
        ]
        if preview["binary"]:
            reasons.append("the content is not UTF-8 text")
        reasons.append("head (secret-looking lines masked):\n" + "\n".join(preview["head"]))
        return reasons, preview

    def _pull_card(self, source: str, origin: str | None) -> tuple[list[str], dict[str, Any]]:
        """No card under the read roots; elsewhere a WRITE-class card naming the file and its digest."""
        parts, resolved = self.protected.resolve(source)  # protected and credential paths: refused
        if self.read_roots.covers(origin, parts, self.protected.below_root(resolved)):
            return [], {}
        data = self.files.read(source)
        if data is None:
            raise WorkspaceRefusal(Code.NOT_FOUND, f"{source!r} does not exist in the Jupyter root",
                                   data={"source": source})
        digest = sha256(data)
        reasons = [
            f"reads {source} from the Jupyter root, outside this notebook's read roots "
            f"({self.read_roots.describe(origin)})",
            f"its bytes ({len(data)} bytes, sha256 {digest}) go into the scratch workspace, and from there "
            "to the model provider when the agent reads them",
        ]
        preview = {"source": source, "size": len(data), "source_sha256": digest, "head": _head(data),
                   "binary": _text(data) is None, CALL_CLASS_KEY: ToolClass.WRITE.value}
        return reasons, preview

    def _card_diff(self, target: str, current: bytes | None, data: bytes) -> dict[str, Any]:
        old = current or b""
        if current is not None and current == data:
            return {"diff": "", "diff_note": "the target already has this content"}
        if _text(old) is None or _text(data) is None:
            return {"diff": "", "diff_note": "binary content: no text diff"}
        if len(old) + len(data) > MAX_PREVIEW_DIFF_INPUT:
            return {"diff": "", "diff_note": f"files too large for a preview diff ({len(old) + len(data)} bytes)"}
        result = unified_diff(old, data, old_label=f"a/{target}", new_label=f"b/{target}")
        text = result.text.decode("utf-8")
        if len(text) > MAX_RESULT_DIFF:
            return {"diff": text[:MAX_RESULT_DIFF], "diff_note": f"diff cut at {MAX_RESULT_DIFF} characters"}
        return {"diff": text}

    # -- call ------------------------------------------------------------------------------

    async def call(self, conversation: str | None, tool: str, arguments: dict[str, Any], *,
                   run_id: str | None = None, origin: str | None = None,
                   approved_preview: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one scratch tool; returns ``{"content": str, "is_error": bool, ...}``.

        Raises:
            WorkspaceRefusal: PATH_REFUSED, QUOTA_EXCEEDED, EDIT_NO_MATCH, EDIT_AMBIGUOUS, NOT_TEXT,
                DIGEST_MISMATCH, NOT_FOUND, INVALID_ARGUMENTS.
        """
        self._known(tool)
        return await asyncio.to_thread(self._call, conversation, tool, dict(arguments), run_id, origin,
                                       approved_preview)

    def _call(self, conversation: str | None, tool: str, args: dict[str, Any], run_id: str | None,
              origin: str | None, approved: dict[str, Any] | None) -> dict[str, Any]:
        ws = self.manager.for_conversation(_conv(conversation))
        if tool == "scratch_list":
            return self._list(ws, args.get("path"))
        if tool == "scratch_read":
            return self._read(ws, _arg(args, "path"), args.get("start_line", 1), args.get("max_lines"))
        if tool == "scratch_write":
            path, content = _arg(args, "path"), args.get("content")
            if not isinstance(content, str):
                raise WorkspaceRefusal(Code.INVALID_ARGUMENTS, "content must be a string")
            data = content.encode("utf-8", "surrogatepass")
            created = ws.write(path, data)
            return {"content": f"{'created' if created else 'replaced'} {path} ({len(data)} bytes)",
                    "is_error": False, "sha256": sha256(data)}
        if tool == "scratch_edit":
            return self._edit(ws, _arg(args, "path"), args.get("edits"))
        if tool == "scratch_delete":
            path = _arg(args, "path")
            kind = ws.delete(path)
            return {"content": f"deleted {kind} {path}", "is_error": False}
        if tool == "scratch_pull":
            source, path = _arg(args, "source"), _arg(args, "path")
            size = self.files.size(source)  # stat before read: the quota refuses a huge file unread
            if size is None:
                raise WorkspaceRefusal(Code.NOT_FOUND, f"{source!r} does not exist in the Jupyter root",
                                       data={"source": source})
            ws.check_quota(path, size)
            data = self.files.read(source)
            if data is None:
                raise WorkspaceRefusal(Code.NOT_FOUND, f"{source!r} does not exist in the Jupyter root",
                                       data={"source": source})
            want = (approved or {}).get("source_sha256")
            if want is not None and (approved or {}).get("source") == source and want != sha256(data):
                raise WorkspaceRefusal(Code.DIGEST_MISMATCH,
                                       f"{source} changed after the pull was approved; nothing was read",
                                       data={"source": source})
            ws.write(path, data)
            return {"content": f"pulled {source} into {path} ({len(data)} bytes, sha256 {sha256(data)})",
                    "is_error": False, "sha256": sha256(data), "size": len(data)}
        return self._push(ws, _arg(args, "path"), _arg(args, "target"), conversation, run_id, origin, approved)

    def _list(self, ws, path: Any) -> dict[str, Any]:
        prefix = ""
        if path not in (None, "", "."):
            prefix = "/".join(split_relpath(path)) + "/"
        items = [e for e in ws.entries() if e.path.startswith(prefix)]
        used = ws.usage()
        lines = [f"{e.path}/" if e.kind == "dir" else f"{e.path}  ({e.size} bytes)" for e in items]
        head = (f"{len(items)} entries; workspace uses {used.bytes} of {ws.max_total_bytes} bytes, "
                f"{used.entries} of {ws.max_entries} entries")
        return {"content": "\n".join([head, *lines]), "is_error": False,
                "entries": [{"path": e.path, "kind": e.kind, "size": e.size} for e in items]}

    def _read(self, ws, path: str, start: Any, max_lines: Any) -> dict[str, Any]:
        data = ws.read(path)
        text = _text(data)
        if text is None:
            return {"content": f"{path} is binary or not UTF-8 ({len(data)} bytes, sha256 {sha256(data)})",
                    "is_error": False}
        if not isinstance(start, int) or start < 1:
            raise WorkspaceRefusal(Code.INVALID_ARGUMENTS, "start_line must be a positive integer")
        limit = max_lines if isinstance(max_lines, int) and max_lines > 0 else _READ_DEFAULT_LINES
        lines = text.splitlines(keepends=True)
        chunk = "".join(lines[start - 1:start - 1 + limit])
        cut = len(chunk.encode()) > _READ_MAX_BYTES
        if cut:
            chunk = chunk.encode()[:_READ_MAX_BYTES].decode("utf-8", "ignore")
        shown_end = min(start - 1 + limit, len(lines))
        note = ""
        if start > 1 or shown_end < len(lines) or cut:
            note = f"[lines {start}-{shown_end} of {len(lines)}{'; cut at 256 KiB' if cut else ''}]\n"
        return {"content": note + chunk, "is_error": False}

    def _edit(self, ws, path: str, edits: Any) -> dict[str, Any]:
        if not isinstance(edits, list) or not edits:
            raise WorkspaceRefusal(Code.INVALID_ARGUMENTS, "edits must be a non-empty list")
        parsed = []
        for e in edits:
            if not isinstance(e, dict) or not isinstance(e.get("old_text"), str) \
                    or not isinstance(e.get("new_text"), str):
                raise WorkspaceRefusal(Code.INVALID_ARGUMENTS, "each edit needs old_text and new_text strings")
            parsed.append(Edit(e["old_text"], e["new_text"], bool(e.get("replace_all", False))))
        with ws.lock:  # read-modify-write is atomic against every other operation on this workspace
            old = ws.read(path)
            # the result's bound, known before it is built: per file, the workspace's room, per call
            room = ws.max_total_bytes - (ws.usage().bytes - len(old))
            outcome = apply_edits(old, parsed, path=path,
                                  max_result_bytes=max(0, min(ws.max_file_bytes, room, MAX_CALL_BYTES)))
            if outcome.content != old:
                ws.write(path, outcome.content)
        diff = outcome.diff.text.decode("utf-8")
        if not diff:
            return {"content": f"{path}: the edit changed nothing", "is_error": False, "diff": ""}
        shown = diff if len(diff) <= MAX_RESULT_DIFF else diff[:MAX_RESULT_DIFF] + "\n[diff cut]\n"
        fuzzy = f"; edits {', '.join(str(i + 1) for i in outcome.fuzzy)} matched ignoring quotes/dashes/" \
                "trailing spaces" if outcome.fuzzy else ""
        head = (f"edited {path}: {outcome.replacements} replacement(s), first changed line "
                f"{outcome.diff.first_changed_line}{fuzzy}\n")
        return {"content": head + shown, "is_error": False, "first_changed_line": outcome.diff.first_changed_line,
                "replacements": outcome.replacements}

    def _push(self, ws, path: str, target: str, conversation: str | None, run_id: str | None,
              origin: str | None, approved: dict[str, Any] | None) -> dict[str, Any]:
        self.files.check(target)  # protected targets are refused even with an approval
        with self._push_lock:
            data = ws.read(path)
            current = self.files.read(target)
            digest, cur_digest = sha256(data), sha256(current)
            approved = approved or {}
            if ("workspace_sha256" not in approved or "target_sha256" not in approved
                    or approved.get("target") != target or approved.get("path") != path):
                raise WorkspaceRefusal(Code.DIGEST_MISMATCH,
                                       "this push was not approved with its digests; nothing was written",
                                       data={"target": target})
            if approved["workspace_sha256"] != digest:
                raise WorkspaceRefusal(Code.DIGEST_MISMATCH,
                                       f"{path} changed after the push was approved; nothing was written",
                                       data={"target": target, "which": "workspace"})
            if approved["target_sha256"] != cur_digest:
                raise WorkspaceRefusal(Code.DIGEST_MISMATCH,
                                       f"{target} changed after the push was approved; nothing was written",
                                       data={"target": target, "which": "target"})
            ckpt = journaled_write(self.checkpoints, self.files, origin=origin or "unknown",
                                   conversation=conversation, run_id=run_id or f"call-{secrets.token_hex(6)}",
                                   target=target, data=data, current=current)
        return {"content": f"pushed {path} to {target} ({len(data)} bytes, sha256 {digest}); "
                           f"checkpoint {ckpt.id} can revert it",
                "is_error": False, "checkpoint": ckpt.id, "sha256": digest}

    # -- checkpoints -----------------------------------------------------------------------

    async def revert(self, checkpoint_id: str, *, origin: str | None) -> dict[str, Any]:
        """Revert a checkpoint and every later one of ``origin`` (see ``checkpointing.revert``)."""
        def run() -> dict[str, Any]:
            with self._push_lock:
                return revert(self.checkpoints, self.files, checkpoint_id, origin=origin)
        return await asyncio.to_thread(run)

    def reconcile(self) -> list[dict[str, Any]]:
        """Settle checkpoints a crash left between steps; call once at broker start."""
        with self._push_lock:
            return reconcile(self.checkpoints, self.files)

    def delete_conversation(self, conversation: str) -> bool:
        """Delete a conversation's workspace (call when the conversation is deleted)."""
        return self.manager.delete(conversation)

    @staticmethod
    def _known(tool: str) -> None:
        if tool not in TOOL_NAMES:
            raise WorkspaceRefusal(Code.UNKNOWN_TOOL, f"no scratch tool named {tool!r}")


def _arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise WorkspaceRefusal(Code.INVALID_ARGUMENTS, f"{name} must be a string path")
    return value


def _conv(conversation: str | None) -> str:
    if not conversation:
        raise WorkspaceRefusal(Code.INVALID_ARGUMENTS, "scratch tools need a conversation")
    return conversation
