"""Callers shared by the broker tests (a uniquely named module: tests/ has no packages)."""

from relay_jupyter.core.caller import Caller, CallerKind

KERNEL_A = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="kernel:aaa")
KERNEL_A2 = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="kernel:aaa2")
KERNEL_B = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb", client_id="kernel:bbb")
BROWSER = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:me:default", user="me")
