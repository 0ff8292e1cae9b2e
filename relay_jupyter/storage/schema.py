"""The versioned schema of ``relay.db`` and the code that migrates a file to it.

``PRAGMA user_version`` holds the version of a database file. :data:`MIGRATIONS` is the ordered
list of steps ``(version, step)``; ``step`` is an SQL script or a callable taking the open
``sqlite3.Connection``. Opening a file applies every step whose version is above the file's, each
in its own ``BEGIN IMMEDIATE`` transaction together with the new ``user_version``, so a crash
mid-migration leaves the file at the previous version. A file whose version is above
:data:`SCHEMA_VERSION` was written by a newer relay-jupyter and is refused (:class:`SchemaError`).

**To add or change a table, append a new step to MIGRATIONS** (never edit a released step: files in
the wild were created by it). The checkpoint journal's tables are part of this schema since version 5 (before, the journal made
them itself with ``CREATE TABLE IF NOT EXISTS``, so step 5 accepts a file that already has them).

Version history:

1. grants, the budget ledger, events (AUTOINCREMENT ids, never reused), the runs journal (runs, calls).
2. conversations, saved trust ("Always allow for this notebook"), MCP tool pins.
3. ownership (issue 12): ``owners`` (one lease per live broker), ``runs.owner``, and
   ``pending_permissions`` (a permission request waiting for its answer, with its owner), so
   recovery touches only what belongs to a dead broker (storage/leases.py).
4. ``budget_holds`` (issue 12 budgets): the reservations of model requests in flight, held in the
   file so every broker on one data dir checks its day limits against the same holds (core/budgets.py).
5. the store contract (issues 14, 18): conversations append-only, a row per message in
   ``conversation_messages`` (the old ``messages`` arrays are moved there; the column stays, empty);
   ``conversations.message_count``; the checkpoint journal's tables (``relay_checkpoints``,
   ``relay_checkpoint_meta``, until now created by ``storage/checkpoints.py`` itself) under this
   schema; ``events_run`` index for a run's terminal event. Files made from version 5 on use
   ``auto_vacuum = INCREMENTAL`` (older files are switched over by one VACUUM at open, storage/_db.py).
6. ``telemetry`` (issue 16): one row per model request of the endpoints and of ``%%agent`` runs
   (core/telemetry.py; figures only, never text).
7. saved trust and MCP pins keyed by ``(origin, server, tool)`` / ``(server, tool)`` as separate
   columns (issue 11 item 8), never the joined ``server__tool``: rows are moved by splitting the old
   name at its first ``__`` (how the registry routed it); a name without one is relay's own tool
   (``server = ''``).
8. ``team_limits`` (issue 15 deployment 2): a team's day and month limits set by ``jupyter relay budget
   set --team``, read by every broker on the store (storage/team_limits.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from .errors import SchemaError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "V1_SQL", "V2_SQL", "V3_SQL", "V4_SQL", "V5_SQL", "V6_SQL", "V7_SQL", "V8_SQL",
           "TEAM_LIMITS_DDL", "migrate",
           "schema_version"]

V1_SQL = """
CREATE TABLE grants (
    origin      TEXT PRIMARY KEY,
    body        TEXT NOT NULL,          -- Grant.model_dump_json()
    updated_at  REAL NOT NULL
);
CREATE TABLE ledger (
    origin      TEXT NOT NULL,
    day         TEXT NOT NULL,          -- ISO date, UTC
    tokens      INTEGER NOT NULL DEFAULT 0,
    cost_usd    REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (origin, day)
) WITHOUT ROWID;
-- AUTOINCREMENT: an id is never handed out twice, even after the newest events were pruned.
CREATE TABLE events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    ts          REAL NOT NULL,
    type        TEXT NOT NULL,
    origin      TEXT,                   -- NULL: broadcast
    run_id      TEXT,
    frame       BLOB NOT NULL           -- the event's SSE frame, UTF-8 (see storage/events.py)
);
CREATE TABLE runs (
    run_id       TEXT PRIMARY KEY,
    origin       TEXT NOT NULL,
    conversation TEXT NOT NULL,
    state        TEXT NOT NULL,         -- running | done | cancelled | error | budget_exhausted | interrupted
    started_at   REAL NOT NULL,
    finished_at  REAL,
    meta         TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX runs_origin ON runs (origin);
CREATE INDEX runs_unfinished ON runs (finished_at) WHERE finished_at IS NULL;
CREATE TABLE calls (
    run_id      TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    tool        TEXT NOT NULL,
    arguments   TEXT NOT NULL,          -- redacted by the caller
    intent_at   REAL NOT NULL,
    outcome     TEXT,                   -- NULL until the outcome record is written
    outcome_at  REAL,
    PRIMARY KEY (run_id, call_id)
);
"""

V2_SQL = """
CREATE TABLE conversations (
    conv_id     TEXT PRIMARY KEY,
    origin      TEXT NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    messages    TEXT NOT NULL,          -- JSON array
    meta        TEXT NOT NULL DEFAULT '{}',
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE INDEX conversations_origin ON conversations (origin);
CREATE TABLE trust (
    origin      TEXT NOT NULL,
    tool        TEXT NOT NULL,
    digest      TEXT NOT NULL,          -- ToolSpec.digest the trust is bound to
    created_at  REAL NOT NULL,
    PRIMARY KEY (origin, tool)
);
CREATE TABLE pins (
    tool        TEXT PRIMARY KEY,       -- server__tool
    digest      TEXT NOT NULL,
    tool_class  TEXT NOT NULL CHECK (tool_class IN ('read', 'contained', 'write')),
    created_at  REAL NOT NULL
);
"""

V3_SQL = """
CREATE TABLE owners (
    owner_id    TEXT PRIMARY KEY,
    host        TEXT NOT NULL,          -- socket.gethostname() + boot id: "same machine"
    pid         INTEGER NOT NULL,
    proc_start  TEXT,                   -- the process start time (/proc/<pid>/stat), against pid reuse
    started_at  REAL NOT NULL,
    renewed_at  REAL NOT NULL,
    ttl         REAL NOT NULL           -- the lease is expired once renewed_at + ttl has passed
);
ALTER TABLE runs ADD COLUMN owner TEXT;     -- NULL: written before leases existed (treated as dead)
CREATE TABLE pending_permissions (
    request_id  TEXT PRIMARY KEY,
    owner       TEXT,
    origin      TEXT,
    run_id      TEXT,
    event_id    INTEGER NOT NULL,       -- the permission.request event
    created_at  REAL NOT NULL
);
"""

V4_SQL = """
CREATE TABLE budget_holds (
    hold_id     TEXT PRIMARY KEY,
    origin      TEXT NOT NULL,
    day         TEXT NOT NULL,          -- ISO date, UTC (the ledger row it is charged to)
    tokens      INTEGER NOT NULL,
    cost_usd    REAL NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,          -- charged in full by the first reservation after this
    charged     INTEGER NOT NULL DEFAULT 0  -- 1: expired and charged; a late settle adds only the excess
);
CREATE INDEX budget_holds_origin_day ON budget_holds (origin, day);
"""

V5_SQL = """
CREATE TABLE conversation_messages (
    conv_id     TEXT NOT NULL,
    seq         INTEGER NOT NULL,       -- 0, 1, ... in conversation order
    body        TEXT NOT NULL,          -- one message, JSON
    PRIMARY KEY (conv_id, seq)
) WITHOUT ROWID;
INSERT INTO conversation_messages (conv_id, seq, body)
    SELECT c.conv_id, j.key, j.value FROM conversations c, json_each(c.messages) j;
ALTER TABLE conversations ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0;
UPDATE conversations SET message_count = json_array_length(messages), messages = '[]';
CREATE INDEX events_run ON events (run_id, id) WHERE run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS relay_checkpoint_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS relay_checkpoints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    origin TEXT NOT NULL,
    conversation TEXT,
    run_id TEXT NOT NULL,
    target TEXT NOT NULL,
    pre_exists INTEGER NOT NULL,
    pre_sha256 TEXT,
    pre_image BLOB,
    post_sha256 TEXT,
    pending_sha256 TEXT,
    state TEXT NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS relay_checkpoints_run ON relay_checkpoints (run_id, target);
CREATE INDEX IF NOT EXISTS relay_checkpoints_origin ON relay_checkpoints (origin, seq);
"""


V6_SQL = """
-- AUTOINCREMENT: a row id is never handed out twice, even after pruning
CREATE TABLE telemetry (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    ts                  REAL NOT NULL,          -- when the request started (epoch seconds)
    origin              TEXT NOT NULL,
    source              TEXT NOT NULL CHECK (source IN ('proxy', 'agent')),
    model               TEXT NOT NULL,
    session             TEXT,
    lineage             TEXT,
    run_id              TEXT,
    profile             TEXT,
    input_tokens        INTEGER NOT NULL DEFAULT 0,
    output_tokens       INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens   INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens  INTEGER NOT NULL DEFAULT 0,
    cost_usd            REAL NOT NULL DEFAULT 0,
    estimated           INTEGER NOT NULL DEFAULT 0,
    latency_ms          REAL NOT NULL DEFAULT 0,
    ttft_ms             REAL,
    status              TEXT NOT NULL,
    error_code          TEXT
);
CREATE INDEX telemetry_origin_ts ON telemetry (origin, ts);
CREATE INDEX telemetry_ts ON telemetry (ts);
"""


V7_SQL = """
CREATE TABLE trust_v7 (
    origin      TEXT NOT NULL,
    server      TEXT NOT NULL,          -- '' for relay's own tools
    tool        TEXT NOT NULL,          -- the MCP server's own name for the tool (not server__tool)
    digest      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (origin, server, tool)
);
INSERT INTO trust_v7 (origin, server, tool, digest, created_at)
    SELECT origin,
           CASE WHEN instr(tool, '__') > 1 AND length(tool) > instr(tool, '__') + 1
                THEN substr(tool, 1, instr(tool, '__') - 1) ELSE '' END,
           CASE WHEN instr(tool, '__') > 1 AND length(tool) > instr(tool, '__') + 1
                THEN substr(tool, instr(tool, '__') + 2) ELSE tool END,
           digest, created_at
    FROM trust;
DROP TABLE trust;
ALTER TABLE trust_v7 RENAME TO trust;
CREATE TABLE pins_v7 (
    server      TEXT NOT NULL,
    tool        TEXT NOT NULL,          -- the MCP server's own name for the tool
    digest      TEXT NOT NULL,
    tool_class  TEXT NOT NULL CHECK (tool_class IN ('read', 'contained', 'write')),
    created_at  REAL NOT NULL,
    PRIMARY KEY (server, tool)
);
INSERT INTO pins_v7 (server, tool, digest, tool_class, created_at)
    SELECT substr(tool, 1, instr(tool, '__') - 1), substr(tool, instr(tool, '__') + 2),
           digest, tool_class, created_at
    FROM pins WHERE instr(tool, '__') > 1 AND length(tool) > instr(tool, '__') + 1;
DROP TABLE pins;
ALTER TABLE pins_v7 RENAME TO pins;
"""


def _v5(conn: sqlite3.Connection) -> None:
    for statement in _statements(V5_SQL):
        conn.execute(statement)
    cols = {r[1] for r in conn.execute("PRAGMA table_info(relay_checkpoints)")}
    if "owner" not in cols:  # a journal of version 1, or the tables just made
        conn.execute("ALTER TABLE relay_checkpoints ADD COLUMN owner TEXT")
    conn.execute("INSERT INTO relay_checkpoint_meta (key, value) VALUES ('version', '2') ON CONFLICT (key) "
                 "DO UPDATE SET value = '2' WHERE CAST(value AS INTEGER) < 2")


Step = str | Callable[[sqlite3.Connection], None]

#: Ordered migration steps. Append only; the last version is :data:`SCHEMA_VERSION`.
TEAM_LIMITS_DDL = """
CREATE TABLE team_limits (
    team        TEXT PRIMARY KEY,       -- a team name (core/teams.py)
    body        TEXT NOT NULL,          -- TeamBudget.model_dump() as JSON
    updated_at  {real} NOT NULL
);
"""
"""The ``team_limits`` table of both stores, declared once (``{real}``: the database's float type); the
PostgreSQL schema's step 5 is this too (storage/pg_schema.py)."""

V8_SQL = TEAM_LIMITS_DDL.format(real="REAL")

MIGRATIONS: list[tuple[int, Step]] = [
    (1, V1_SQL),
    (2, V2_SQL),
    (3, V3_SQL),
    (4, V4_SQL),
    (5, _v5),
    (6, V6_SQL),
    (7, V7_SQL),
    (8, V8_SQL),
]

SCHEMA_VERSION: int = MIGRATIONS[-1][0]


def schema_version(conn: sqlite3.Connection) -> int:
    """The ``user_version`` of the open database (0 for a new file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _statements(script: str) -> list[str]:
    """Split an SQL script into complete statements.

    ``executescript`` would COMMIT our transaction first, so each statement runs through ``execute``
    inside it; ``sqlite3.complete_statement`` finds statement ends without parsing SQL ourselves.
    """
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf)
            buf = ""
    if buf.strip() and not all(part.strip().startswith("--") for part in buf.splitlines() if part.strip()):
        raise ValueError("incomplete SQL statement at the end of a migration script")
    return out


def migrate(conn: sqlite3.Connection, migrations: list[tuple[int, Step]] | None = None,
            *, where: str = "the database") -> int:
    """Bring ``conn`` (autocommit mode) up to the newest version. Returns the version reached.

    Raises:
        SchemaError: the file is newer than this code, or a step failed (the file keeps its old version).
    """
    steps = MIGRATIONS if migrations is None else migrations
    newest = steps[-1][0] if steps else 0
    current = schema_version(conn)
    if current > newest:
        raise SchemaError(
            f"{where} has schema version {current}, but this relay-jupyter only knows up to {newest}: "
            "it was written by a newer relay-jupyter. Upgrade relay-jupyter, or move the file away to start fresh.",
            data={"found": current, "supported": newest},
        )
    for version, step in steps:
        if version <= current:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            # re-read inside the write lock: another process may have migrated meanwhile
            current = schema_version(conn)
            if version <= current:
                conn.execute("COMMIT")
                continue
            if isinstance(step, str):
                for statement in _statements(step):
                    conn.execute(statement)
            else:
                step(conn)
            conn.execute(f"PRAGMA user_version = {int(version)}")
            conn.execute("COMMIT")
        except BaseException as exc:
            conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise SchemaError(f"migrating {where} to schema version {version} failed: {exc}",
                                  data={"version": version}) from exc
            raise
        current = version
    return current
