"""Journaled push, the revert cascade and crash reconciliation (seed 002's revert lifecycle).

* :func:`journaled_write`: before a run's first push to a target, the pre-image and its SHA-256 are
  staged durably (``prepared``); then the file is written; then the entry becomes ``applied`` with
  the post-image digest. A later push of the same run to the same target re-enters ``prepared``
  with a new pending digest, keeping the one pre-image.
* :func:`revert`: from the newest checkpoint of the caller's origin back to the selected one. Each
  step first checks that the live file still equals that step's post-image; on a mismatch it stops
  and reports what it already reverted (no fuzzy merge). Each step is ``reverting`` before the
  restore and ``reverted`` after.
* :func:`reconcile`: on start, entries left ``prepared`` or ``reverting`` by a crash are settled by
  comparing the live file with the digests they carry, and the temp file the crashed write staged
  (``.relay-tmp-<hex>``, named after the checkpoint and the digest it staged:
  ``rootfiles.staged_name``) is removed. A revert removes such leftovers of every step it restores.
"""

from __future__ import annotations

from typing import Any

from relay_jupyter.core.errors import Code, RoutingRefusal
from relay_jupyter.storage.checkpoints import Checkpoint, CheckpointJournal, sha256

from .rootfiles import RootFiles

__all__ = ["journaled_write", "revert", "reconcile", "remove_leftovers"]


def journaled_write(journal: CheckpointJournal, files: RootFiles, *, origin: str, conversation: str | None,
                    run_id: str, target: str, data: bytes, current: bytes | None) -> Checkpoint:
    """Write ``data`` to ``target`` with its pre-image journaled first; returns the checkpoint.

    ``current`` is the target's bytes as just read (and digest-checked) by the caller.
    """
    post = sha256(data)
    assert post is not None
    ckpt = journal.active(run_id, target)
    if ckpt is None:
        ckpt = journal.prepare(origin=origin, conversation=conversation, run_id=run_id, target=target,
                               pre_image=current, pending_sha256=post)
    else:
        journal.prepare_again(ckpt.id, post)
    files.write(target, data, tag=_tag(ckpt.id, post))
    journal.mark_applied(ckpt.id, post)
    got = journal.get(ckpt.id)
    assert got is not None
    return got


def _tag(checkpoint_id: str, digest: str | None) -> str:
    return f"{checkpoint_id}:{digest or 'absent'}"


def remove_leftovers(files: RootFiles, step: Checkpoint) -> list[str]:
    """Remove the temp files a crashed write or restore of ``step`` staged; returns which (tags)."""
    removed = []
    for digest in dict.fromkeys((step.pending_sha256, step.post_sha256, step.pre_sha256)):
        if digest is not None and files.remove_staged(step.target, _tag(step.id, digest)):
            removed.append(digest)
    return removed


def _restore(journal: CheckpointJournal, files: RootFiles, step: Checkpoint) -> None:
    journal.mark_reverting(step.id)
    if step.pre_exists:
        pre = journal.pre_image(step.id)
        if pre is None or sha256(pre) != step.pre_sha256:
            raise RuntimeError(f"checkpoint {step.id}: the staged pre-image failed its integrity check")
        files.write(step.target, pre, tag=_tag(step.id, step.pre_sha256))
    else:
        files.remove(step.target)
    journal.mark_reverted(step.id)


def revert(journal: CheckpointJournal, files: RootFiles, checkpoint_id: str, *, origin: str | None
           ) -> dict[str, Any]:
    """Revert ``checkpoint_id`` and every later checkpoint of the same origin, newest first.

    ``origin`` None means "any origin" (a browser user acting for their own notebooks is resolved
    by the caller). Returns ``{"reverted": [ids], "stopped_at": id | None, "reason": str | None,
    "complete": bool}``.

    Raises:
        RoutingRefusal: ``NOT_FOUND`` when the checkpoint does not exist or belongs to another origin.
    """
    sel = journal.get(checkpoint_id)
    if sel is None or (origin is not None and sel.origin != origin):
        raise RoutingRefusal(Code.NOT_FOUND, f"no checkpoint {checkpoint_id!r} for this notebook",
                             data={"id": checkpoint_id})
    done: list[str] = []
    for step in journal.cascade(checkpoint_id):
        if step.state == "prepared":
            # A push still in flight (or crashed mid-write): never guess; reconcile first.
            return _partial(done, step, "a push to this file has not finished; try again shortly")
        live = sha256(files.read(step.target))
        expected = step.post_sha256
        if live != expected:
            return _partial(done, step, f"{step.target} changed after the push (its digest no longer "
                                        "matches), so it was left alone")
        try:
            remove_leftovers(files, step)
            _restore(journal, files, step)
        except Exception as exc:  # report partial progress instead of losing it
            return _partial(done, step, f"restoring {step.target} failed: {exc}")
        done.append(step.id)
    return {"reverted": done, "stopped_at": None, "reason": None, "complete": True}


def _partial(done: list[str], step: Checkpoint, reason: str) -> dict[str, Any]:
    return {"reverted": done, "stopped_at": step.id, "reason": reason, "complete": False}


def reconcile(journal: CheckpointJournal, files: RootFiles) -> list[dict[str, Any]]:
    """Settle entries a crash left ``prepared`` or ``reverting``; returns what was decided per entry.

    Only entries of dead owners (``journal.unfinished()``, storage/leases.py): another broker on the
    same data directory may be in the middle of a push, and its entries are left alone."""
    decisions: list[dict[str, Any]] = []
    for step in journal.unfinished():
        try:
            leftovers = remove_leftovers(files, step)
            live = sha256(files.read(step.target))
        except Exception as exc:  # the target became unreadable or protected: keep it for a human
            decisions.append({"id": step.id, "state": step.state, "decision": f"left as is: {exc}"})
            continue
        if step.state == "prepared":
            if live == step.pending_sha256:
                journal.mark_applied(step.id, live, note="reconciled: the push had landed")
                decision = "applied"
            elif step.post_sha256 is not None and live == step.post_sha256:
                journal.mark_applied(step.id, step.post_sha256, note="reconciled: the later push did not land")
                decision = "applied"
            elif step.post_sha256 is None and live == step.pre_sha256:
                journal.mark_reverted(step.id, note="reconciled: the push never landed")
                decision = "reverted"
            else:
                # Unknown content: keep the pending digest as the expectation, so a revert refuses.
                journal.mark_applied(step.id, step.pending_sha256, note="reconciled: live file differs")
                decision = "applied (live file differs)"
        else:  # reverting
            if live == step.pre_sha256:
                journal.mark_reverted(step.id, note="reconciled: the restore had landed")
                decision = "reverted"
            else:
                journal.mark_applied(step.id, step.post_sha256, note="reconciled: the restore did not land")
                decision = "applied"
        decisions.append({"id": step.id, "state": step.state, "decision": decision,
                          "removed_staged": len(leftovers)})
    return decisions
