"""A scripted relay broker on 127.0.0.1 (tornado in a thread) speaking the kernel's side of the protocol.

It is a real HTTP server with the broker's routes (``POST relay/rpc``, ``GET relay/events`` SSE),
used to test the kernel client against hostile and edge-case answers the real broker never
sends; the end-to-end tests use the real broker. A run is a script of steps:

- ``("text", "abc")`` one ``run.text_delta``; ``("texts", [..])`` many, sent back to back;
  ``("paced", [..], per_second)`` many, at a model's pace (deltas due at ``i / per_second`` from the first);
- ``("permission", {tool, arguments, ...}, {options})`` a ``permission.request``, waits for
  ``permission.answer``; options: ``replay``, ``elsewhere_after`` (the owner's browser answers),
  ``timeout_after`` (``permission_timeout`` then one ``permission.resolved``, as the broker does),
  ``legacy_timeout_after`` (only ``permission.resolved cancelled``, then ``tool_decided`` with code
  PERMISSION_TIMEOUT: what the broker sent before issue 11), ``withdraw_after`` (``withdrawn``),
  ``late_timeout`` (the kernel's answer arrives, then the broker's timeout wins the race);
- ``("kernel_tool", tool, arguments)`` a ``kernel.tool_request``, waits for ``kernel.tool_result``;
- ``("event", type, data)`` any event; ``("end", type, data)`` the terminal event (default run.done).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from typing import Any, Self

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets, bind_unix_socket

CREDENTIAL = "kernel-cred-123"


class _Rpc(tornado.web.RequestHandler):
    def initialize(self, fake: FakeBroker) -> None:
        self.fake = fake

    def check_xsrf_cookie(self) -> None:
        return None

    async def post(self) -> None:
        if not self.fake.authorized(self.request.headers.get("Authorization")):
            self.set_status(401)
            self.finish({"error": "unauthorized"})
            return
        self.fake.clients.append(self.request.headers.get("X-Relay-Client"))
        body = json.loads(self.request.body)
        method, params = body["method"], body.get("params") or {}
        self.fake.calls.append((method, params))
        try:
            result = await self.fake.handle(method, params)
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": body.get("id"), "result": result}
        except _Refuse as exc:
            reply = {"jsonrpc": "2.0", "id": body.get("id"),
                     "error": {"code": exc.rpc_code, "message": exc.message, "data": exc.data}}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(reply))


class _Events(tornado.web.RequestHandler):
    def initialize(self, fake: FakeBroker) -> None:
        self.fake = fake

    async def get(self) -> None:
        if not self.fake.authorized(self.request.headers.get("Authorization")):
            self.set_status(401)
            self.finish("unauthorized")
            return
        self.set_header("Content-Type", "text/event-stream")
        self.request.connection.stream.set_nodelay(True)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        since = self.get_argument("since", None)
        if since is not None:
            for event in self.fake.events:
                if event["id"] > int(since):
                    queue.put_nowait(event)
        self.fake.subscribers.append(queue)
        self.write(": hello\n\n")
        await self.flush()
        try:
            while True:
                event = await queue.get()
                if event is None:
                    break
                chunk = [event]
                while not queue.empty() and len(chunk) < 500:
                    nxt = queue.get_nowait()
                    if nxt is None:
                        break
                    chunk.append(nxt)
                self.write("".join(f"id: {e['id']}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in chunk))
                await self.flush()
        except tornado.iostream.StreamClosedError:
            pass
        finally:
            self.fake.subscribers.remove(queue)


class _Refuse(Exception):
    def __init__(self, code: str, message: str, rpc_code: int = -32000) -> None:
        self.message, self.rpc_code, self.data = message, rpc_code, {"code": code}


class FakeBroker:
    """``with FakeBroker() as broker: broker.url, broker.script([...])``."""

    def __init__(self, *, unix_path: str | None = None, grant: bool = True) -> None:
        self.unix_path = unix_path
        self.has_grant = grant
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.clients: list[str | None] = []
        self.events: list[dict[str, Any]] = []
        self.subscribers: list[asyncio.Queue[dict[str, Any] | None]] = []
        self.scripts: list[list[tuple[Any, ...]]] = []
        self.refuse_start: tuple[str, str] | None = None
        self.takes_cell_id = True
        """False: run.start refuses ``cell_id`` as an unknown field, as a broker from before cell ids did."""
        self.answers: list[dict[str, Any]] = []
        self.tool_results: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._runs = itertools.count(1)
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.url = ""
        self.run_tasks: list[asyncio.Task[None]] = []

    # -- lifecycle
    def __enter__(self) -> Self:
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._stop)
        self.thread.join(10)

    def _serve(self, ready: threading.Event) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        app = tornado.web.Application([(r"/relay/rpc", _Rpc, {"fake": self}),
                                       (r"/relay/events", _Events, {"fake": self})])
        self.server = HTTPServer(app)
        if self.unix_path:
            self.server.add_socket(bind_unix_socket(self.unix_path))
            self.url = f"unix://{self.unix_path}"
        else:
            sockets = bind_sockets(0, "127.0.0.1")
            self.server.add_sockets(sockets)
            self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/relay/"
        ready.set()
        self.loop.run_forever()
        self.loop.close()

    def _stop(self) -> None:
        for queue in list(self.subscribers):
            queue.put_nowait(None)
        for task in self.run_tasks:
            task.cancel()
        self.server.stop()
        assert self.loop is not None
        self.loop.call_later(0.05, self.loop.stop)

    def env(self) -> dict[str, str]:
        return {"RELAY_URL": self.url, "RELAY_KERNEL_CREDENTIAL": CREDENTIAL}

    def authorized(self, header: str | None) -> bool:
        return self.unix_path is not None or header == f"RelayKernel {CREDENTIAL}"

    # -- behaviour
    def script(self, steps: list[tuple[Any, ...]]) -> None:
        """Queue the script of the next run.start."""
        self.scripts.append(steps)

    def emit(self, type_: str, data: dict[str, Any], run_id: str | None = None) -> None:
        event = {"id": next(self._ids), "ts": time.time(), "type": type_, "origin": "notebook:t.ipynb",
                 "run_id": run_id, "data": data}
        self.events.append(event)
        for queue in self.subscribers:
            queue.put_nowait(event)

    async def handle(self, method: str, params: dict[str, Any]) -> Any:
        if method == "grants.get":
            return {"grant": {"origin": "notebook:t.ipynb", "tools": ["*"]} if self.has_grant else None}
        if method == "grants.create":
            self.has_grant = True
            return {"grant": {"origin": "notebook:t.ipynb", **params}}
        if method == "tools.list":
            return {"tools": [{"name": "write_file", "class": "write"}, {"name": "list_variables", "class": "read"}]}
        if method == "run.start":
            if self.refuse_start:
                raise _Refuse(*self.refuse_start)
            if not self.takes_cell_id and "cell_id" in params:  # the strict params of an older broker
                old = _Refuse("", "Invalid params", -32602)
                old.data = {"errors": [{"loc": ["cell_id"], "msg": "Extra inputs are not permitted",
                                        "type": "extra_forbidden"}]}
                raise old
            run_id = f"run-{next(self._runs)}"
            steps = self.scripts.pop(0) if self.scripts else [("text", "(no script)")]
            self.run_tasks.append(asyncio.ensure_future(self._play(run_id, steps, params.get("mode") or "ask")))
            return {"run_id": run_id}
        if method in ("run.cancel", "conversations.fork"):
            return {"cancelled": True} if method == "run.cancel" else {"ok": True}
        if method == "permission.answer":
            self.answers.append(params)
            waiter = self._waiting.pop(params["request_id"], None)
            if waiter is None:
                raise _Refuse("NOT_FOUND", "no such pending request")
            waiter.set_result(params)
            return {"request_id": params["request_id"], "decision": params["decision"], "scope": params["scope"],
                    "answered_by": "kernel", "answered_at": time.time()}
        if method == "kernel.tool_result":
            self.tool_results.append(params)
            waiter = self._waiting.pop(params["request_id"], None)
            if waiter is not None:
                waiter.set_result(params)
            return {"ok": True}
        raise _Refuse("METHOD", f"method not found: {method}", rpc_code=-32601)

    async def _wait(self, request_id: str) -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return await future

    async def _play(self, run_id: str, steps: list[tuple[Any, ...]], mode: str = "ask") -> None:
        await asyncio.sleep(0.01)
        self.emit("run.started", {"run_id": run_id, "mode": mode}, run_id)
        for step in steps:
            kind = step[0]
            if kind == "text":
                self.emit("run.text_delta", {"run_id": run_id, "text": step[1]}, run_id)
            elif kind == "texts":
                for text in step[1]:
                    self.emit("run.text_delta", {"run_id": run_id, "text": text}, run_id)
                    await asyncio.sleep(0)
            elif kind == "paced":
                loop = asyncio.get_running_loop()
                start = loop.time()
                for i, text in enumerate(step[1]):
                    # due times from the start, so timer lateness does not accumulate into a slower stream
                    await asyncio.sleep(max(0.0, start + i / step[2] - loop.time()))
                    self.emit("run.text_delta", {"run_id": run_id, "text": text}, run_id)
            elif kind == "permission":
                request_id = f"perm-{next(self._ids)}"
                data = {"request_id": request_id, "originator": "kernel:k", "run_id": run_id, "call_id": "c1",
                        "server": None, "tool_class": "write", "reasons": [], "preview": {},
                        "deadline": time.time() + 60, **step[1]}
                waiter = asyncio.ensure_future(self._wait(request_id))
                self.emit("permission.request", data, run_id)
                options = step[2] if len(step) > 2 else {}
                if "replay" in options:  # a reconnecting client gets pending requests again
                    self.emit("permission.request", data, run_id)
                if "elsewhere_after" in options:  # the owner's browser answers first
                    await asyncio.sleep(options["elsewhere_after"])
                    self._waiting.pop(request_id, None)
                    waiter.cancel()
                    answer = {"request_id": request_id, "decision": "allow", "scope": "once"}
                    self.emit("permission.resolved", {**answer, "answered_by": "browser:alice",
                                                      "answered_at": time.time()}, run_id)
                elif {"timeout_after", "legacy_timeout_after", "withdraw_after"} & set(options):
                    key = next(k for k in ("timeout_after", "legacy_timeout_after", "withdraw_after") if k in options)
                    await asyncio.sleep(options[key])
                    self._waiting.pop(request_id, None)
                    waiter.cancel()
                    resolved = {"request_id": request_id, "scope": "once", "answered_at": time.time()}
                    if key == "timeout_after":
                        self.emit("permission_timeout", {"request_id": request_id}, run_id)
                        self.emit("permission.resolved", {**resolved, "decision": "deny", "answered_by": "timeout"},
                                  run_id)
                    elif key == "legacy_timeout_after":
                        self.emit("permission.resolved", {**resolved, "decision": "cancelled", "answered_by": None},
                                  run_id)
                    else:
                        self.emit("permission.resolved", {**resolved, "decision": "withdrawn", "answered_by": None},
                                  run_id)
                        self.emit("run.cancelled", {"run_id": run_id}, run_id)
                        return
                    self.emit("run.tool_decided", {"run_id": run_id, "call_id": "c1", "decision": "deny",
                                                   "code": "PERMISSION_TIMEOUT"}, run_id)
                    continue
                else:
                    answer = await waiter
                    if options.get("late_timeout"):  # the answer lost the race with the deadline
                        self.emit("permission_timeout", {"request_id": request_id}, run_id)
                        self.emit("permission.resolved", {"request_id": request_id, "decision": "timeout",
                                                          "scope": "once", "answered_by": "timeout",
                                                          "answered_at": time.time()}, run_id)
                        answer = {**answer, "decision": "deny"}
                self.emit("run.tool_decided", {"run_id": run_id, "call_id": "c1", "decision": answer["decision"]},
                          run_id)
            elif kind == "kernel_tool":
                request_id = f"kt-{next(self._ids)}"
                waiter = asyncio.ensure_future(self._wait(request_id))
                self.emit("kernel.tool_request", {"request_id": request_id, "run_id": run_id, "tool": step[1],
                                                  "arguments": step[2]}, run_id)
                await waiter
            elif kind == "event":
                self.emit(step[1], {"run_id": run_id, **step[2]}, run_id)
            elif kind == "sleep":
                await asyncio.sleep(step[1])
            elif kind == "end":
                self.emit(step[1], {"run_id": run_id, **(step[2] if len(step) > 2 else {})}, run_id)
                return
        self.emit("run.done", {"run_id": run_id}, run_id)
