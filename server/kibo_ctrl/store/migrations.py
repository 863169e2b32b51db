"""The SQLite schema, as the migrations that build it: version N is MIGRATIONS[:N].

A store opened on an older file runs the missing ones in order (sqlite.py, `_migrate`);
a file from a newer kibo is refused. Append only: never edit a migration that shipped."""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: the initial schema. Records are JSON documents; columns exist only to be queried.
    """
    CREATE TABLE workspaces (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        state INTEGER NOT NULL,
        deleted INTEGER NOT NULL,
        expire_at REAL,
        storage_pending INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX workspaces_expire_at ON workspaces(expire_at) WHERE expire_at IS NOT NULL;
    CREATE INDEX workspaces_storage ON workspaces(storage_pending) WHERE storage_pending = 1;
    CREATE TABLE commands (
        id TEXT PRIMARY KEY,
        workspace_id TEXT NOT NULL,
        data BLOB NOT NULL
    );
    CREATE TABLE instances (
        id TEXT PRIMARY KEY,
        workspace_id TEXT NOT NULL,
        node_id TEXT,
        unscheduled INTEGER NOT NULL,
        reserved INTEGER NOT NULL,
        vcpus INTEGER NOT NULL,
        memory_mib INTEGER NOT NULL,
        active INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX instances_workspace ON instances(workspace_id);
    CREATE INDEX instances_node ON instances(node_id, active);
    CREATE INDEX instances_unscheduled ON instances(unscheduled) WHERE unscheduled = 1;
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        workspace_id TEXT NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX events_workspace ON events(workspace_id, seq);
    CREATE TABLE volumes (
        id TEXT PRIMARY KEY,
        data BLOB NOT NULL
    );
    """,
    # 2: tenants. Command IDs are scoped per tenant; tokens (hashes only) are stored.
    """
    ALTER TABLE workspaces ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE workspaces ADD COLUMN vcpus INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE workspaces ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
    UPDATE workspaces SET vcpus = json_extract(data, '$.resources.vcpus'),
        memory_mib = json_extract(data, '$.resources.memory_mib');
    CREATE INDEX workspaces_tenant ON workspaces(tenant, seq);
    CREATE TABLE commands_v2 (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        workspace_id TEXT NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (tenant, id)
    );
    INSERT INTO commands_v2 (tenant, id, workspace_id, data)
        SELECT 'default', id, workspace_id, data FROM commands;
    DROP TABLE commands;
    ALTER TABLE commands_v2 RENAME TO commands;
    ALTER TABLE volumes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        role TEXT NOT NULL,
        create_time REAL NOT NULL,
        revoked INTEGER NOT NULL DEFAULT 0
    );
    """,
    # 3: what each node has reserved, kept by triggers, so the scheduler does not sum every
    # instance of a node on each pass (70 ms with 100,000 stored).
    """
    CREATE TABLE node_usage (
        node_id TEXT PRIMARY KEY,
        vcpus INTEGER NOT NULL,
        memory_mib INTEGER NOT NULL
    );
    INSERT INTO node_usage (node_id, vcpus, memory_mib)
        SELECT node_id, SUM(vcpus), SUM(memory_mib) FROM instances
        WHERE reserved = 1 AND node_id IS NOT NULL GROUP BY node_id;
    CREATE TRIGGER node_usage_insert AFTER INSERT ON instances
    WHEN NEW.reserved = 1 AND NEW.node_id IS NOT NULL BEGIN
        INSERT INTO node_usage (node_id, vcpus, memory_mib) VALUES (NEW.node_id, NEW.vcpus, NEW.memory_mib)
        ON CONFLICT(node_id) DO UPDATE
        SET vcpus = vcpus + excluded.vcpus, memory_mib = memory_mib + excluded.memory_mib;
    END;
    CREATE TRIGGER node_usage_update AFTER UPDATE OF node_id, reserved, vcpus, memory_mib ON instances BEGIN
        UPDATE node_usage SET vcpus = vcpus - OLD.vcpus, memory_mib = memory_mib - OLD.memory_mib
        WHERE node_id = OLD.node_id AND OLD.reserved = 1;
        INSERT INTO node_usage (node_id, vcpus, memory_mib)
        SELECT NEW.node_id, NEW.vcpus, NEW.memory_mib WHERE NEW.reserved = 1 AND NEW.node_id IS NOT NULL
        ON CONFLICT(node_id) DO UPDATE
        SET vcpus = vcpus + excluded.vcpus, memory_mib = memory_mib + excluded.memory_mib;
    END;
    CREATE TRIGGER node_usage_delete AFTER DELETE ON instances
    WHEN OLD.reserved = 1 AND OLD.node_id IS NOT NULL BEGIN
        UPDATE node_usage SET vcpus = vcpus - OLD.vcpus, memory_mib = memory_mib - OLD.memory_mib
        WHERE node_id = OLD.node_id;
    END;
    """,
    # 4: nodes (issue 13): what each node declared when it joined, its lease, and an
    # operator's cordon/drain. The record is JSON like the others; lease_expiry is a column
    # only so that an expired lease can be found without decoding every node.
    """
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        lease_expiry REAL NOT NULL,
        data BLOB NOT NULL
    );
    """,
    # 5: the node link's certificates (issue 26 item 4): the cluster CA (one row, made by
    # whichever process needs it first: an insert if absent) and each join token's one use.
    """
    CREATE TABLE cluster_ca (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        cert_pem TEXT NOT NULL,
        key_pem TEXT NOT NULL,
        create_time REAL NOT NULL
    );
    CREATE TABLE node_issuances (
        token_id TEXT PRIMARY KEY,
        node_id TEXT NOT NULL,
        key_sha256 TEXT NOT NULL,
        cert_pem TEXT NOT NULL,
        issue_time REAL NOT NULL
    );
    """,
    # 6: fleet-wide events (ListEvents, WatchEvents): each event's tenant, node, type and time
    # as columns, filled in from the records (and the tenant from the workspace), and the
    # index a tenant's events are listed by.
    """
    ALTER TABLE events ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
    ALTER TABLE events ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE events ADD COLUMN event_type INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE events ADD COLUMN event_time REAL NOT NULL DEFAULT 0;
    UPDATE events SET
        tenant = COALESCE((SELECT tenant FROM workspaces WHERE workspaces.id = events.workspace_id), 'default'),
        event_type = COALESCE(json_extract(CAST(data AS TEXT), '$.type'), 0),
        event_time = COALESCE(json_extract(CAST(data AS TEXT), '$.time'), 0);
    CREATE INDEX events_tenant ON events(tenant, seq);
    """,
)
