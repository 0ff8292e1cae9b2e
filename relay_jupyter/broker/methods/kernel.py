"""``kernel.*``: a kernel answers the kernel-tool requests (``list_variables``, ``run_code``, ...) the
broker sent it.

Access (:data:`~._access.ADDRESSEE`): only the kernel a request was sent to may answer it; any other
client gets ``NOT_ORIGINATOR`` (checked by ``KernelBridge``, which holds each request's kernel).
``kernel.ended`` acts on the caller's own client id only (its runs, its pending requests): the hub thin
client tells the service a kernel is gone, as the single-user broker learns it from its kernel manager.
"""

from __future__ import annotations

from ...protocol.models_control import KernelEndedParams, KernelEndedResult, KernelToolResultParams, OkResult
from ...protocol.names import Method
from ..kernel_bridge import end_kernel
from ._access import ADDRESSEE, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = ADDRESSEE
rpc = Namespace(ACCESS, "kernel")


@rpc.method(Method.KERNEL_TOOL_RESULT, KernelToolResultParams, OkResult, scope=Scope.ANY,
            doc="A kernel answers a kernel.tool_request sent to it. Other clients get NOT_ORIGINATOR.")
async def kernel_tool_result(req: Request, params: KernelToolResultParams) -> OkResult:
    req.broker.kernel_bridge.deliver(req.caller, params.request_id, params.content, params.is_error)
    return OkResult()


@rpc.method(Method.KERNEL_ENDED, KernelEndedParams, KernelEndedResult, scope=Scope.ANY,
            doc="The caller's kernel restarted, shut down or died: its runs are cancelled and its pending permission "
                "requests withdrawn (the caller's own client id only).")
async def kernel_ended(req: Request, params: KernelEndedParams) -> KernelEndedResult:
    ended = end_kernel(req.broker, req.caller.client_id, params.reason)
    return KernelEndedResult(withdrawn=len(ended["withdrawn"]), cancelled_runs=ended["cancelled_runs"])
