"""Connections to PostgreSQL and what their failures mean: the connection strings, the
errors callers see in place of psycopg's, one thread's (re)connecting connection, and the
migrations run at open (postgres.py's plumbing)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..domain.errors import StoreError, Unavailable
from .postgres_migrations import MIGRATIONS, VERSION_TABLE

# Advisory lock keys (one 64-bit space per database): "kibo" and a number.
WRITE_LOCK = 0x6B69626F_0001
MIGRATION_LOCK = 0x6B69626F_0002
CONNECT_TIMEOUT_S = 5

# PostgreSQL conditions that pass, by SQLSTATE (full code first, then its class): UNAVAILABLE,
# so clients retry. Every other error is a bug in a query: INTERNAL.
STORE_UNAVAILABLE: dict[str, str] = {
    "08": "PostgreSQL cannot be reached or the connection was lost",
    "53100": "its disk is full",
    "53200": "it is out of memory",
    "53300": "it has no free connection slot",
    "53": "it is out of resources",
    "25006": "it cannot write (read-only)",
    "57P01": "PostgreSQL is shutting down",
    "57P02": "PostgreSQL is restarting after a crash",
    "57P03": "PostgreSQL is starting or shutting down",
    "58": "its disk reports I/O errors",
    "40001": "a conflicting transaction ran at the same time",
    "40P01": "a conflicting transaction ran at the same time",
    "55P03": "it is locked",
    "55006": "it is in use by another process",
}
_UNREACHABLE = STORE_UNAVAILABLE["08"]


def store_error(error: psycopg.Error) -> StoreError:
    """The StoreError callers see in place of a psycopg error (the driver stays in here)."""
    code = error.sqlstate or ""
    words = STORE_UNAVAILABLE.get(code) or STORE_UNAVAILABLE.get(code[:2])
    if words is None and not code and isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
        # libpq's own failures carry no SQLSTATE: refused, reset, timed out, closed.
        words = _UNREACHABLE
    unavailable = None if words is None else Unavailable(f"the store is unavailable: {words}; retry later")
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    failure = StoreError(f"{code or type(error).__name__}: {first_line}", unavailable)
    failure.__cause__ = error
    return failure


def describe(dsn: str) -> str:
    """USER@HOST:PORT/DB of a connection string, without its password (for messages)."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "PostgreSQL (unparsable connection string)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"{user}{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


class Connection:
    """One thread's connection, made on first use and anew after it failed."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def get(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.drop()
            self._conn = connect(self._dsn)
        return self._conn

    def begin(self, sql: str) -> psycopg.Connection[Any]:
        """A connection with `sql` (a BEGIN) run on it. A connection that broke while idle
        (the server restarted, an idle timeout) is replaced once: nothing had run on it."""
        conn = self.get()
        try:
            conn.execute(sql)
        except psycopg.OperationalError:
            if not conn.broken:
                raise
            self.drop()
            conn = self.get()
            conn.execute(sql)
        return conn

    def drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def connect(dsn: str) -> psycopg.Connection[Any]:
    # autocommit: the store says BEGIN and COMMIT itself, as it does with SQLite.
    return psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, application_name="kibo-ctrl")


def migrate(conn: psycopg.Connection[Any], where: str) -> None:
    """Run the migrations this database lacks, in one transaction, under MIGRATION_LOCK so
    replicas starting together migrate once; refuse a database from a newer kibo."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(VERSION_TABLE)
        row = conn.execute("SELECT version FROM kibo_schema_version").fetchone()
        version = 0 if row is None else int(row[0])
        if version > len(MIGRATIONS):
            raise RuntimeError(f"{where} has schema version {version}, newer than this kibo ({len(MIGRATIONS)})")
        for script in MIGRATIONS[version:]:
            conn.execute(script.encode())
        if row is None:
            conn.execute("INSERT INTO kibo_schema_version (version) VALUES (%s)", (len(MIGRATIONS),))
        else:
            conn.execute("UPDATE kibo_schema_version SET version = %s", (len(MIGRATIONS),))
