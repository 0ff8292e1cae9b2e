"""The versioned schema of the PostgreSQL store and the code that migrates a database to it.

The table ``relay_schema`` holds the version of a database (one row). :data:`PG_MIGRATIONS` is the
ordered list of steps ``(version, sql)``. Opening a store applies every step whose version is above
the database's, each in its own transaction together with the new version, under a transaction-level
advisory lock (:data:`MIGRATION_LOCK`), so several brokers starting at once migrate once and a crash
mid-migration leaves the previous version (PostgreSQL DDL is transactional). A database whose version
is above :data:`PG_SCHEMA_VERSION` was written by a newer relay-jupyter and is refused (SchemaError).

**To add or change a table, append a new step** (never edit a released step).

The tables mirror the SQLite store's (storage/schema.py) with these differences:

- ``seq`` identity columns stand for SQLite's ``rowid`` where the order of insertion is read back
  (runs, calls, conversations, checkpoints, audit);
- event ids come from the one-row ``event_seq`` counter, taken with ``UPDATE … RETURNING`` inside the
  append's transaction: its row lock orders appends, so ids are committed in id order (a reader that
  saw event N never later finds an N-1 it missed) and are never reused after pruning;
- the checkpoint journal (storage/checkpoints.py keeps it in its own SQLite tables) and a copy of
  the audit records (``audit``: the JSON-lines file stays the local tamper-evident copy; this is what
  team views query) live here too.

Version history:

1. everything the SQLite store has at its schema 4 (grants, ledger and budget holds, events, runs
   and calls, conversations with a row per message, trust, pins, owners, pending permissions),
   checkpoints and the audit copy.
2. ``namespaces``: the users' schemas that opened the database (the admin view of spend per user).
3. ``telemetry`` (issue 16): one row per model request (core/telemetry.py; figures only, never text),
   in each user's own schema.
4. saved trust and MCP pins keyed by ``(origin, server, tool)`` / ``(server, tool)`` as separate
   columns (issue 11 item 8; SQLite's version 7): old rows split at the first ``__`` of their name.
5. ``team_limits`` (SQLite's version 8): teams' limits set by ``jupyter relay budget set --team``; in
   ``relay_shared`` when namespaced, so every user's broker reads the same limits.
"""

from __future__ import annotations

from typing import Any

from .errors import SchemaError
from .schema import TEAM_LIMITS_DDL

__all__ = ["MIGRATION_LOCK", "PG_MIGRATIONS", "PG_SCHEMA_VERSION", "migrate", "schema_version"]

#: pg_advisory_xact_lock key taken by migrations ("relay" in ASCII).
MIGRATION_LOCK = 0x72656C6179

V1_SQL = """
CREATE TABLE grants (
    origin      TEXT PRIMARY KEY,
    body        TEXT NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL
);
CREATE TABLE ledger (
    origin      TEXT NOT NULL,          -- an origin, or a team's key (team:<name>)
    day         TEXT NOT NULL,          -- ISO date (UTC), or a month YYYY-MM for month budgets
    tokens      BIGINT NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    cost_usd    DOUBLE PRECISION NOT NULL DEFAULT 0 CHECK (cost_usd >= 0),
    PRIMARY KEY (origin, day)
);
CREATE TABLE budget_holds (
    hold_id     TEXT PRIMARY KEY,
    origin      TEXT NOT NULL,
    day         TEXT NOT NULL,
    tokens      BIGINT NOT NULL,
    cost_usd    DOUBLE PRECISION NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL,
    charged     BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX budget_holds_live ON budget_holds (origin, day) WHERE NOT charged;
CREATE INDEX budget_holds_expiry ON budget_holds (expires_at);
CREATE TABLE event_seq (
    one         BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    last_id     BIGINT NOT NULL
);
INSERT INTO event_seq (one, last_id) VALUES (true, 0);
CREATE TABLE events (
    id          BIGINT PRIMARY KEY,
    ts          DOUBLE PRECISION NOT NULL,
    type        TEXT NOT NULL,
    origin      TEXT,
    run_id      TEXT,
    frame       BYTEA NOT NULL
);
CREATE INDEX events_run ON events (run_id, id) WHERE run_id IS NOT NULL;
CREATE INDEX events_ts ON events (ts);
CREATE TABLE runs (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    run_id       TEXT PRIMARY KEY,
    origin       TEXT NOT NULL,
    conversation TEXT NOT NULL,
    state        TEXT NOT NULL,
    started_at   DOUBLE PRECISION NOT NULL,
    finished_at  DOUBLE PRECISION,
    meta         TEXT NOT NULL DEFAULT '{}',
    owner        TEXT
);
CREATE INDEX runs_origin ON runs (origin, seq);
CREATE INDEX runs_unfinished ON runs (seq) WHERE finished_at IS NULL;
CREATE INDEX runs_conversation ON runs (conversation) WHERE finished_at IS NULL;
CREATE TABLE calls (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    run_id      TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    tool        TEXT NOT NULL,
    arguments   TEXT NOT NULL,
    intent_at   DOUBLE PRECISION NOT NULL,
    outcome     TEXT,
    outcome_at  DOUBLE PRECISION,
    PRIMARY KEY (run_id, call_id)
);
CREATE TABLE conversations (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    conv_id     TEXT PRIMARY KEY,
    origin      TEXT NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    message_count INTEGER NOT NULL,
    meta        TEXT NOT NULL DEFAULT '{}',
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX conversations_origin ON conversations (origin);
-- append-only conversations: a row per message, so a turn writes what it adds, not the history
CREATE TABLE conversation_messages (
    conv_id     TEXT NOT NULL REFERENCES conversations (conv_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    body        TEXT NOT NULL,
    PRIMARY KEY (conv_id, seq)
);
CREATE TABLE trust (
    origin      TEXT NOT NULL,
    tool        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (origin, tool)
);
CREATE TABLE pins (
    tool        TEXT PRIMARY KEY,
    digest      TEXT NOT NULL,
    tool_class  TEXT NOT NULL CHECK (tool_class IN ('read', 'contained', 'write')),
    created_at  DOUBLE PRECISION NOT NULL
);
CREATE TABLE owners (
    owner_id    TEXT PRIMARY KEY,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    proc_start  TEXT,
    started_at  DOUBLE PRECISION NOT NULL,
    renewed_at  DOUBLE PRECISION NOT NULL,
    ttl         DOUBLE PRECISION NOT NULL
);
CREATE TABLE pending_permissions (
    request_id  TEXT PRIMARY KEY,
    owner       TEXT,
    origin      TEXT,
    run_id      TEXT,
    event_id    BIGINT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL
);
CREATE TABLE checkpoints (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    origin          TEXT NOT NULL,
    conversation    TEXT,
    run_id          TEXT NOT NULL,
    target          TEXT NOT NULL,
    pre_exists      BOOLEAN NOT NULL,
    pre_sha256      TEXT,
    pre_image       BYTEA,
    post_sha256     TEXT,
    pending_sha256  TEXT,
    state           TEXT NOT NULL CHECK (state IN ('prepared', 'applied', 'reverting', 'reverted')),
    note            TEXT NOT NULL DEFAULT '',
    created_at      DOUBLE PRECISION NOT NULL,
    updated_at      DOUBLE PRECISION NOT NULL,
    owner           TEXT
);
CREATE INDEX checkpoints_run ON checkpoints (run_id, target);
CREATE INDEX checkpoints_origin ON checkpoints (origin, seq);
CREATE TABLE audit (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    local_seq   BIGINT NOT NULL,        -- the record's seq in the broker's own JSON-lines log
    owner       TEXT,                   -- the broker (lease) that wrote it
    ts          DOUBLE PRECISION NOT NULL,
    origin      TEXT NOT NULL,
    tool        TEXT NOT NULL,
    decision    TEXT NOT NULL,
    code        TEXT,
    run_id      TEXT,
    record      TEXT NOT NULL           -- AuditRecord.model_dump_json()
);
CREATE INDEX audit_origin ON audit (origin, seq);
CREATE INDEX audit_ts ON audit (ts);
"""

V2_SQL = """
-- in relay_shared: every namespace (a user's schema) that has opened this database, for the admin
-- views of spend per user (storage/postgres.py: spend_rows); unused in the users' own schemas
CREATE TABLE namespaces (
    schema_name TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    first_seen  DOUBLE PRECISION NOT NULL
);
"""

V3_SQL = """
CREATE TABLE telemetry (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ts                  DOUBLE PRECISION NOT NULL,
    origin              TEXT NOT NULL,
    source              TEXT NOT NULL CHECK (source IN ('proxy', 'agent')),
    model               TEXT NOT NULL,
    session             TEXT,
    lineage             TEXT,
    run_id              TEXT,
    profile             TEXT,
    input_tokens        BIGINT NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens       BIGINT NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cache_read_tokens   BIGINT NOT NULL DEFAULT 0 CHECK (cache_read_tokens >= 0),
    cache_write_tokens  BIGINT NOT NULL DEFAULT 0 CHECK (cache_write_tokens >= 0),
    cost_usd            DOUBLE PRECISION NOT NULL DEFAULT 0 CHECK (cost_usd >= 0),
    estimated           BOOLEAN NOT NULL DEFAULT FALSE,
    latency_ms          DOUBLE PRECISION NOT NULL DEFAULT 0,
    ttft_ms             DOUBLE PRECISION,
    status              TEXT NOT NULL,
    error_code          TEXT
);
CREATE INDEX telemetry_origin_ts ON telemetry (origin, ts);
CREATE INDEX telemetry_ts ON telemetry (ts);
"""

V4_SQL = """
-- (server, tool) as separate columns, never the joined server__tool (storage/schema.py version 7)
ALTER TABLE trust ADD COLUMN server TEXT NOT NULL DEFAULT '';
UPDATE trust SET server = substr(tool, 1, strpos(tool, '__') - 1), tool = substr(tool, strpos(tool, '__') + 2)
    WHERE strpos(tool, '__') > 1 AND length(tool) > strpos(tool, '__') + 1;
ALTER TABLE trust DROP CONSTRAINT trust_pkey;
ALTER TABLE trust ADD PRIMARY KEY (origin, server, tool);
ALTER TABLE trust ALTER COLUMN server DROP DEFAULT;
DELETE FROM pins WHERE NOT (strpos(tool, '__') > 1 AND length(tool) > strpos(tool, '__') + 1);
ALTER TABLE pins ADD COLUMN server TEXT;
UPDATE pins SET server = substr(tool, 1, strpos(tool, '__') - 1), tool = substr(tool, strpos(tool, '__') + 2);
ALTER TABLE pins ALTER COLUMN server SET NOT NULL;
ALTER TABLE pins DROP CONSTRAINT pins_pkey;
ALTER TABLE pins ADD PRIMARY KEY (server, tool);
"""

V5_SQL = TEAM_LIMITS_DDL.format(real="DOUBLE PRECISION")  # one declaration with SQLite's step 8

#: Ordered migration steps. Append only; the last version is :data:`PG_SCHEMA_VERSION`.
PG_MIGRATIONS: list[tuple[int, str]] = [
    (1, V1_SQL),
    (2, V2_SQL),
    (3, V3_SQL),
    (4, V4_SQL),
    (5, V5_SQL),
]

PG_SCHEMA_VERSION: int = PG_MIGRATIONS[-1][0]


def schema_version(conn: Any) -> int:
    """The version of the open database (0 for an empty one)."""
    row = conn.execute("SELECT to_regclass('relay_schema') IS NOT NULL").fetchone()
    if not row[0]:
        return 0
    got = conn.execute("SELECT version FROM relay_schema").fetchone()
    return int(got[0]) if got else 0


def migrate(conn: Any, migrations: list[tuple[int, str]] | None = None, *, where: str = "the database") -> int:
    """Bring ``conn`` (a psycopg connection in autocommit mode) to the newest version; returns it.

    Raises:
        SchemaError: the database is newer than this code, or a step failed (it keeps its old version).
    """
    import psycopg

    steps = PG_MIGRATIONS if migrations is None else migrations
    newest = steps[-1][0] if steps else 0
    current = schema_version(conn)
    if current > newest:
        raise SchemaError(
            f"{where} has relay schema version {current}, but this relay-jupyter only knows up to {newest}: "
            "it was written by a newer relay-jupyter. Upgrade relay-jupyter.",
            data={"found": current, "supported": newest})
    for version, step in steps:
        if version <= current:
            continue
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                conn.execute("CREATE TABLE IF NOT EXISTS relay_schema (version INTEGER NOT NULL)")
                current = schema_version(conn)  # another broker may have migrated meanwhile
                if version <= current:
                    continue
                conn.execute(step.encode())  # a multi-statement script: simple query protocol, no parameters
                conn.execute("DELETE FROM relay_schema")
                conn.execute("INSERT INTO relay_schema (version) VALUES (%s)", (version,))
        except psycopg.Error as exc:
            raise SchemaError(f"migrating {where} to relay schema version {version} failed: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
                              data={"version": version}) from exc
        current = version
    return current
