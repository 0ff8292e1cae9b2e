"""A real Jupyter server's kernels as an attacker's test drives them (pytest-jupyter's ``jp_fetch`` and
``jp_serverapp``): open a notebook session, read a kernel's relay credential from inside it, call
``relay/rpc`` as that kernel (or with no credential at all). Shared by the forgery tests of consent
(``tests/attack/test_consent_forgery.py``) and of MCP elicitation (``tests/mcp/test_mcp_elicitation_forgery.py``)."""

from __future__ import annotations

import json
from typing import Any

#: Run in a kernel: prints the credential the Jupyter server gave it.
CRED = "import os; print(os.environ['RELAY_KERNEL_CREDENTIAL'])"


async def in_kernel(serverapp: Any, kernel_id: str, code: str) -> str:
    """What ``code`` printed (stream output) in the kernel ``kernel_id`` of ``serverapp``."""
    kc = serverapp.kernel_manager.get_kernel(kernel_id).client()
    kc.start_channels()
    out: list[str] = []
    try:
        await kc.wait_for_ready(timeout=60)
        await kc.execute_interactive(code, output_hook=lambda m: out.append(m["content"].get("text", ""))
                                     if m["msg_type"] == "stream" else None, timeout=60)
    finally:
        kc.stop_channels()
    return "".join(out)


class KernelRig:
    """Sessions, credentials and RPC calls against one test's Jupyter server."""

    def __init__(self, jp_fetch: Any, jp_serverapp: Any) -> None:
        self.fetch = jp_fetch
        self.serverapp = jp_serverapp

    async def rpc(self, method: str, params: dict[str, Any], cred: dict[str, str] | None = None) -> dict[str, Any]:
        """One JSON-RPC call to ``relay/rpc`` with the headers ``cred`` (none: the server's own token)."""
        resp = await self.fetch("relay", "rpc", method="POST", headers=cred or {}, request_timeout=60,
                                body=json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        return json.loads(resp.body)

    async def session(self, path: str) -> str:
        """The kernel id of a new notebook session for ``path``."""
        resp = await self.fetch("api", "sessions", method="POST", request_timeout=120, body=json.dumps(
            {"path": path, "type": "notebook", "kernel": {"name": "python3"}}))
        return json.loads(resp.body)["kernel"]["id"]

    async def credential(self, kernel_id: str) -> dict[str, str]:
        """The headers a kernel's own relay client sends: its credential, read from inside the kernel."""
        return {"Authorization": "RelayKernel " + (await in_kernel(self.serverapp, kernel_id, CRED)).strip()}
