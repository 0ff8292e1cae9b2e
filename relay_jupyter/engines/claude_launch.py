"""The launcher between claude-agent-sdk and the ``claude`` CLI (stdlib only; run as ``python -I -S``).

The SDK starts its CLI with the *broker's* environment merged under ``options.env``. The claude-code
engine wants an environment built from nothing (no model keys, no Jupyter token, no broker settings), and
the CLI and every process it starts in a session of their own, so that a cancel can kill all of them.
So the engine gives the SDK, as ``cli_path``, a 0700 script that runs this file, which:

1. records its pid (the session id of everything the CLI starts) in ``<run dir>/pid``;
2. ``setsid()``: a new session and process group;
3. ``execve``s the real CLI with exactly the environment in ``<run dir>/env.json`` plus the few protocol
   variables the SDK sets for its CLI (:data:`SDK_VARIABLES`), nothing else of the broker's.

usage: python -I -S claude_launch.py <run dir> <cli> [cli arguments...]
"""

from __future__ import annotations

import json
import os
import sys

#: Variables the SDK sets for its CLI (the stream-json protocol and its session-state frames).
SDK_VARIABLES = ("CLAUDE_CODE_ENTRYPOINT", "CLAUDE_AGENT_SDK_VERSION", "CLAUDE_CODE_SDK_READS_SESSION_STATE",
                 "CLAUDE_AGENT_SDK_CLIENT_APP", "CLAUDE_CODE_ENABLE_SDK_FILE_CHECKPOINTING", "PWD")


def main(argv: list[str]) -> None:
    run_dir, cli, *args = argv
    with open(os.path.join(run_dir, "env.json"), encoding="utf-8") as f:
        env = {str(k): str(v) for k, v in json.load(f).items()}
    for name in SDK_VARIABLES:
        if name in os.environ and name not in env:
            env[name] = os.environ[name]
    os.setsid()
    fd = os.open(os.path.join(run_dir, "pid"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    os.execve(cli, [cli, *args], env)


if __name__ == "__main__":
    main(sys.argv[1:])
