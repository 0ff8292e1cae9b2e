"""Who answers a permission request in this kernel, and how (issue 6 item 3).

- **widget**: a frontend that renders ipywidgets (JupyterLab, Notebook 7, VS Code) -> a consent card.
- **input**: terminal IPython (or ``consent_ui = "input"``) -> the card as text and an ``input()`` prompt.
- **headless**: nbclient / nbval / papermill (they send ``allow_stdin: false``), ``CI`` or
  ``RELAY_HEADLESS`` set, or no frontend at all -> the configured policy: ``deny`` (default) or an
  allowlist of tool names. Nobody is asked, so nothing can hang.

Every wait is finite: no answer by the deadline denies.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .rendering import visible
from .widgets.consent_card import card_text, offered_scopes

__all__ = ["SURFACES", "Answer", "ConsentPolicy", "ask", "detect_surface"]

SURFACES = ("auto", "widget", "input", "headless")
_FALSY = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class ConsentPolicy:
    """How this kernel answers. ``allowlist`` applies only to the headless surface."""

    surface: str = "auto"
    headless_policy: str = "deny"
    """``deny`` (every write denied) or ``allowlist`` (tools named in ``allowlist`` allowed once)."""
    allowlist: frozenset[str] = field(default_factory=frozenset)
    timeout: float = 300.0
    """Upper bound of a wait for a human, in seconds (the broker's own deadline also bounds it)."""


@dataclass(frozen=True)
class Answer:
    decision: str
    """``allow`` | ``deny`` | ``timeout`` (sent to the broker as deny)."""
    scope: str = "once"
    answered_by: str = ""
    answered_at: float = field(default_factory=time.time)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in _FALSY


def detect_surface(shell: Any, configured: str = "auto") -> str:
    """``widget`` | ``input`` | ``headless`` for the cell running now (see the module docstring)."""
    if configured in ("widget", "input", "headless"):
        return configured
    if _env_true("RELAY_HEADLESS") or _env_true("CI"):
        return "headless"
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        # terminal IPython: a person at a TTY can answer input(); a pipe cannot
        stdin = getattr(sys, "stdin", None)
        return "input" if stdin is not None and stdin.isatty() else "headless"
    try:
        parent = kernel.get_parent("shell")
    except TypeError:  # older signature
        parent = kernel.get_parent()
    content = (parent or {}).get("content", {}) if isinstance(parent, dict) else {}
    # nbclient, nbval and papermill execute with allow_stdin False; browser frontends send True
    if not content.get("allow_stdin", False):
        return "headless"
    return "widget"


def _remaining(data: dict[str, Any], policy: ConsentPolicy) -> float:
    deadline = data.get("deadline")
    left = policy.timeout
    if isinstance(deadline, (int, float)):
        left = min(left, float(deadline) - time.time())
    return max(0.0, left)


_INPUT_CHOICES = {"y": ("once", "[y]es once"), "r": ("run", "[r]un"), "a": ("notebook", "[a]lways for this notebook")}


async def _ask_input(data: dict[str, Any], timeout: float, in_kernel: bool) -> Answer:
    print(card_text(data), flush=True)
    scopes = offered_scopes(data)
    offered = {key: scope for key, (scope, _label) in _INPUT_CHOICES.items() if scope in scopes}
    prompt = "Approve? " + " / ".join(label for key, (_s, label) in _INPUT_CHOICES.items() if key in offered) \
        + " / [N]o: "
    if in_kernel:
        # a kernel's input() goes over the stdin channel and cannot run in a thread; the frontend
        # that asked for "input" answers it (the broker's deadline still applies on its side)
        reply = input(prompt)
    else:
        try:
            # a thread so the wait can time out; an abandoned read ends at the next line typed
            reply = await asyncio.wait_for(asyncio.to_thread(input, prompt), timeout)
        except TimeoutError:
            print(f"\nrelay: no answer within {timeout:.0f} s -- denied", flush=True)
            return Answer("timeout", "once", "nobody")
        except EOFError:
            return Answer("deny", "once", "terminal (EOF)")
    choice = reply.strip().lower()[:1]
    if choice not in offered:  # anything else, a scope not offered included, is a deny
        return Answer("deny", "once", "you (terminal)")
    return Answer("allow", offered[choice], "you (terminal)")


async def ask(data: dict[str, Any], surface: str, policy: ConsentPolicy, shell: Any = None,
              on_card: Callable[[Any], None] | None = None) -> Answer:
    """Decide one ``permission.request`` (its event data) on ``surface``. ``on_card`` receives the
    consent card (widget surface) so the caller can mark it when someone else answers."""
    timeout = _remaining(data, policy)
    if surface == "headless":
        tool = str(data.get("tool", ""))
        if policy.headless_policy == "allowlist" and tool in policy.allowlist:
            answer = Answer("allow", "once", "policy:allowlist")
        else:
            answer = Answer("deny", "once", f"policy:{'deny' if policy.headless_policy != 'allowlist' else 'allowlist'}")
        print(f"relay: {answer.decision} {visible(tool, newlines=False)} (headless, {answer.answered_by})", flush=True)
        return answer
    if surface == "input":
        return await _ask_input(data, timeout, in_kernel=getattr(shell, "kernel", None) is not None)
    from .widgets.consent_card import ConsentCard

    card = ConsentCard(data)
    card.show()
    if on_card is not None:
        on_card(card)
    decision, scope = await card.wait(timeout)
    who = "nobody" if decision == "timeout" else "you (click)"
    return Answer(decision, scope, who)
