"""The PostgreSQL schema, as the migrations that build it: version N is MIGRATIONS[:N].

The records are the same msgspec JSON documents as in SQLite (records.py), in `bytea`, with
the same queried columns. A store opened on an older database runs the missing migrations in
order, under an advisory lock, so replicas starting together migrate once (postgres.py,
`migrate`); a database from a newer kibo is refused. Append only: never edit a migration
that shipped."""

from __future__ import annotations

# The version this kibo's schema has reached, in a table of its own (PostgreSQL has no
# user_version).
VERSION_TABLE = "CREATE TABLE IF NOT EXISTS kibo_schema_version (version INTEGER NOT NULL)"

MIGRATIONS: tuple[str, ...] = (
    # 1: the schema of SQLite's migrations 1-3 in one step.
    """
    CREATE TABLE workspaces (
        id TEXT PRIMARY KEY,
        seq BIGINT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        state INTEGER NOT NULL,
        deleted BOOLEAN NOT NULL,
        expire_at DOUBLE PRECISION,
        storage_pending BOOLEAN NOT NULL,
        vcpus INTEGER NOT NULL,
        memory_mib BIGINT NOT NULL,
        data BYTEA NOT NULL
    );
    CREATE INDEX workspaces_tenant ON workspaces (tenant, seq);
    CREATE INDEX workspaces_expire_at ON workspaces (expire_at) WHERE expire_at IS NOT NULL;
    CREATE INDEX workspaces_storage ON workspaces (seq) WHERE storage_pending;
    -- Command IDs are unique per tenant: the key that two replicas cannot both insert.
    CREATE TABLE commands (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        workspace_id TEXT NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (tenant, id)
    );
    CREATE TABLE instances (
        id TEXT PRIMARY KEY,
        -- Insertion order (SQLite's rowid): lists keep the order instances were made in.
        ord BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
        workspace_id TEXT NOT NULL,
        node_id TEXT,
        unscheduled BOOLEAN NOT NULL,
        reserved BOOLEAN NOT NULL,
        vcpus INTEGER NOT NULL,
        memory_mib BIGINT NOT NULL,
        active BOOLEAN NOT NULL,
        data BYTEA NOT NULL
    );
    CREATE INDEX instances_workspace ON instances (workspace_id, ord);
    CREATE INDEX instances_node ON instances (node_id, ord) WHERE active;
    CREATE INDEX instances_unscheduled ON instances (ord) WHERE unscheduled;
    -- A node's reserved instances: the scheduler sums them (node_usage), live ones only.
    CREATE INDEX instances_reserved ON instances (node_id) WHERE reserved;
    CREATE TABLE events (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        workspace_id TEXT NOT NULL,
        data BYTEA NOT NULL
    );
    CREATE INDEX events_workspace ON events (workspace_id, seq);
    CREATE TABLE volumes (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        storage_pending BOOLEAN NOT NULL,
        data BYTEA NOT NULL
    );
    CREATE INDEX volumes_storage ON volumes (id) WHERE storage_pending;
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        role TEXT NOT NULL,
        create_time DOUBLE PRECISION NOT NULL,
        revoked BOOLEAN NOT NULL DEFAULT FALSE
    );
    """,
    # 2: several replicas on one database. The change feed: each commit's Changes under a
    # gapless sequence (assigned under the write lock: commit order), so every replica publishes
    # every commit, in order (postgres_feed.py). The leader lease: one row; its token grows
    # with every new leader and fences the leader-only writes (postgres_leader.py).
    """
    CREATE TABLE kibo_changes (
        seq BIGINT PRIMARY KEY,
        origin TEXT NOT NULL,
        data BYTEA NOT NULL
    );
    CREATE TABLE kibo_leader (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        token BIGINT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );
    INSERT INTO kibo_leader (id, holder, token, expires_at) VALUES (1, '', 0, '-infinity');
    """,
    # 3: nodes (issue 13; SQLite's migration 4): what each node declared when it joined, its
    # lease, and an operator's cordon/drain. The record is JSON like the others; lease_expiry
    # is a column so that an expired lease can be found without decoding every node.
    """
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        lease_expiry DOUBLE PRECISION NOT NULL,
        data BYTEA NOT NULL
    );
    """,
    # 4: the node link's certificates (issue 26 item 4; SQLite's migration 5): the cluster CA
    # (one row: replicas starting together insert if absent, and all read the one that won)
    # and each join token's one use.
    """
    CREATE TABLE cluster_ca (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        cert_pem TEXT NOT NULL,
        key_pem TEXT NOT NULL,
        create_time DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE node_issuances (
        token_id TEXT PRIMARY KEY,
        node_id TEXT NOT NULL,
        key_sha256 TEXT NOT NULL,
        cert_pem TEXT NOT NULL,
        issue_time DOUBLE PRECISION NOT NULL
    );
    """,
    # 5: fleet-wide events (SQLite's migration 6): each event's tenant, node, type and time as
    # columns, filled in from the records (and the tenant from the workspace), and the index a
    # tenant's events are listed by.
    """
    ALTER TABLE events ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
    ALTER TABLE events ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE events ADD COLUMN event_type INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE events ADD COLUMN event_time DOUBLE PRECISION NOT NULL DEFAULT 0;
    UPDATE events SET
        tenant = COALESCE((SELECT tenant FROM workspaces WHERE workspaces.id = events.workspace_id), 'default'),
        event_type = COALESCE((convert_from(data, 'UTF8')::json ->> 'type')::integer, 0),
        event_time = COALESCE((convert_from(data, 'UTF8')::json ->> 'time')::double precision, 0);
    CREATE INDEX events_tenant ON events (tenant, seq);
    """,
)
