"""``kernel.*``: a kernel answers the kernel-tool requests (``list_variables``, ``run_code``, ...) the
broker sent it.

Access (:data:`~._access.ADDRESSEE`): only the kernel a request was sent to may answer it; any other
client gets ``NOT_ORIGINATOR`` (checked by ``KernelBridge``, which holds each request's kernel).
"""

from __future__ import annotations

from ...protocol.models_control import KernelToolResultParams, OkResult
from ...protocol.names import Method
from ._access import ADDRESSEE, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = ADDRESSEE
rpc = Namespace(ACCESS, "kernel")


@rpc.method(Method.KERNEL_TOOL_RESULT, KernelToolResultParams, OkResult, scope=Scope.ANY,
            doc="A kernel answers a kernel.tool_request sent to it. Other clients get NOT_ORIGINATOR.")
async def kernel_tool_result(req: Request, params: KernelToolResultParams) -> OkResult:
    req.broker.kernel_bridge.deliver(req.caller, params.request_id, params.content, params.is_error)
    return OkResult()
