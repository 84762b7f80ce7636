"""A real, throwaway PostgreSQL server for tests and benchmarks.

    with TemporaryPostgres() as pg:
        url = pg.create_database("t1")     # postgresql+psycopg://evolve@127.0.0.1:PORT/t1

`initdb` makes a cluster in a fresh temp directory and `pg_ctl` starts it on a free
loopback port (its Unix socket stays in that directory too). Durability is switched off
(fsync, synchronous_commit, full_page_writes): the cluster is thrown away at exit, and
tests and benchmarks of evolve's own bookkeeping should not time the disk's flushes
(docs/benchmarks.md says which figures were taken this way).

PostgreSQL refuses to run as root, so as root the cluster is made and run by the
`postgres` user (Debian's package creates it), else by `nobody`.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SUPERUSER = "evolve"
_DEBIAN_BIN = "/usr/lib/postgresql/*/bin"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server programs on this machine (or no psycopg to talk to one)."""


def find_bin_dir() -> Path:
    """The directory holding `initdb` and `pg_ctl`: on PATH, else Debian's versioned
    directory (newest version first), else $PG_BIN."""
    env = os.environ.get("PG_BIN")
    candidates: list[Path] = [Path(env)] if env else []
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        candidates.append(Path(on_path).parent)
    versioned = sorted(glob.glob(_DEBIAN_BIN), key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
                       reverse=True)
    candidates += [Path(p) for p in versioned]
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    raise PostgresUnavailable(
        "PostgreSQL server programs (initdb, pg_ctl) not found on PATH, in /usr/lib/postgresql/*/bin or $PG_BIN; "
        "install the Debian package `postgresql`")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    """The user the cluster runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise PostgresUnavailable("running as root and there is no `postgres` or `nobody` user to run PostgreSQL as")


class TemporaryPostgres:
    def __init__(self, max_connections: int = 200) -> None:
        try:
            import psycopg  # noqa: F401  (the driver the URLs name)
        except ImportError as exc:
            raise PostgresUnavailable("psycopg is not installed (pip install -e '.[test]')") from exc
        self.bin = find_bin_dir()
        self.max_connections = max_connections
        self.user = _run_as()
        self.dir = Path(tempfile.mkdtemp(prefix="evolve-pg-"))
        self.data = self.dir / "data"
        self.port = 0
        self._started = False

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(args), user=self.user, capture_output=True, text=True, cwd=self.dir,
                              env={**os.environ, "LC_ALL": "C"}, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{self.log()}")
        return proc

    def log(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def start(self) -> TemporaryPostgres:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        self.port = _free_port()
        options = " ".join([
            f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-c unix_socket_directories={self.dir}",
            f"-c max_connections={self.max_connections}", "-c fsync=off", "-c synchronous_commit=off",
            "-c full_page_writes=off",
        ])
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w",
                  "-t", "60", "-o", options, "start")
        self._started = True
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, template: str | None = None) -> str:
        """A new database, empty or a copy of `template` (no one may be connected to it);
        its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def stop(self) -> None:
        if self._started:
            try:
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
            finally:
                self._started = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> TemporaryPostgres:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
