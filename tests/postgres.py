"""A throwaway PostgreSQL for the tests, from Debian's `postgresql` package (examples/setup.sh).

initdb under a fresh temp dir, pg_ctl start on a free loopback port with its socket in that
dir; stopped and the dir removed at the end. PostgreSQL refuses to run as root: as root, the
dir belongs to the `postgres` user and the commands run through runuser. One server per
pytest-xdist worker (the session fixture in conftest.py), a database per test server.
`KIBO_TEST_POSTGRES_DSN` names an existing server instead (a role that may CREATE DATABASE)."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tests.server import free_port, worker_index

DSN_VARIABLE = "KIBO_TEST_POSTGRES_DSN"
USER = "kibo"


def _bin_dir() -> Path:
    """Debian keeps the server's programs out of PATH, under /usr/lib/postgresql/VERSION/bin."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[4]))
    if not candidates:
        raise RuntimeError("no PostgreSQL server programs: install Debian's postgresql (examples/setup.sh)")
    return Path(candidates[-1]).parent


def _as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@dataclass
class LocalPostgres:
    """One PostgreSQL server of our own, under `root`."""

    root: Path
    port: int = field(default_factory=free_port)
    # False: fsync off (the tests kill kibo, never the machine). True: PostgreSQL's defaults,
    # a commit on disk before it is acknowledged (the benchmark's comparison with SQLite).
    durable: bool = False

    @classmethod
    def start(cls, durable: bool = False) -> LocalPostgres:
        root = Path(tempfile.mkdtemp(prefix="kibo-pg-"))
        server = cls(root, durable=durable)
        try:
            server._start()
        except BaseException:
            server.stop()
            raise
        return server

    def _start(self) -> None:
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        bin_dir = _bin_dir()
        data = self.root / "data"
        subprocess.run(
            _as_owner([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "--no-sync"]),
            check=True,
            capture_output=True,
        )
        options = self._options()
        subprocess.run(
            _as_owner(
                [str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(self.root / "log"), "-w", "start"]
            ),
            check=True,
            capture_output=True,
        )

    def halt(self) -> None:
        """Stop the server (as a crash would: immediate), keeping its files for `resume`."""
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def resume(self) -> None:
        self._pg_ctl("-o", self._options(), "-l", str(self.root / "log"), "-w", "start")

    def _options(self) -> str:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.durable:
            # Commits stay commits across a kill -9 of kibo or of PostgreSQL without fsync.
            options += " -c fsync=off"
        return options

    def _pg_ctl(self, *args: str) -> None:
        command = [str(_bin_dir() / "pg_ctl"), "-D", str(self.root / "data"), *args]
        subprocess.run(_as_owner(command), check=True, capture_output=True)

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        data = self.root / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run(
                _as_owner([str(_bin_dir() / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                check=False,
                capture_output=True,
            )
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Databases:
    """Makes a fresh database per test server on one PostgreSQL; drops them all at the end."""

    admin_dsn: str
    made: list[str] = field(default_factory=list)
    _count: itertools.count[int] = field(default_factory=itertools.count)

    def create(self) -> str:
        """A new, empty database; its connection string."""
        name = f"kibo_test_{os.getpid()}_{worker_index()}_{next(self._count)}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        # A URL (what `kibo-ctrl serve --store` takes), whatever form the admin DSN has.
        parts = conninfo_to_dict(self.admin_dsn)
        login = quote(str(parts.get("user", USER)))
        if parts.get("password"):
            login += ":" + quote(str(parts["password"]))
        return f"postgresql://{login}@{parts.get('host', '127.0.0.1')}:{parts.get('port', 5432)}/{name}"

    def drop_all(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for name in self.made:
                with contextlib.suppress(psycopg.Error):
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.made.clear()
