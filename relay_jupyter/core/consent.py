"""Consent ports that need no human: fixed policies for headless runs and tests.

The broker's interactive port (consent cards routed to the originator) lives in ``broker``;
these are what a CI run, an nbval job or a unit test plugs in instead.
"""

from __future__ import annotations

import time

from .types import ConsentDecision, ConsentRequest, ConsentResult, ConsentScope

__all__ = ["StaticConsent"]


class StaticConsent:
    """Answers every request with the same decision (``ALLOW`` / ``DENY`` / ``TIMEOUT``).

    ``asked`` keeps every request seen, so tests can assert whether consent was asked at all.
    """

    def __init__(self, decision: ConsentDecision | str, *, answered_by: str = "policy:static",
                 scope: ConsentScope = ConsentScope.ONCE) -> None:
        self.decision = ConsentDecision(decision)
        self.answered_by = answered_by
        self.scope = ConsentScope(scope)
        self.asked: list[ConsentRequest] = []

    async def ask(self, request: ConsentRequest) -> ConsentResult:
        """Record ``request`` and return the fixed decision at once."""
        self.asked.append(request)
        return ConsentResult(decision=self.decision, scope=self.scope, answered_by=self.answered_by,
                             answered_at=time.time(), reason=f"static policy: {self.decision.value}")
