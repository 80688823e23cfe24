"""A full schemathesis run, every check on, against the service on a fresh SQLite or PostgreSQL database.

    python scripts/schemathesis_full.py [MAX_EXAMPLES] [--postgres [ADMIN_URL] | --database-url URL] [-- st run options]

Starts ``uvicorn`` on a free port with ``create_app`` (no worker: submitted jobs stay queued) and an API key made
for the run, then runs ``st run URL/openapi.json --checks all`` with that key, ``MAX_EXAMPLES`` (default 100)
generated cases per operation, and every phase (examples, coverage, fuzzing, stateful). The per-operation check
settings are the repository's ``schemathesis.toml``, as for ``tests/unit/service/test_schemathesis.py`` (the
bounded version the slow test set runs). ``--postgres`` makes a new database on the server at ``ADMIN_URL``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``) and drops it afterwards; ``--database-url`` uses the
database given as it is. Its exit status is schemathesis's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "schemathesis.toml"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _fresh_postgres(admin_url: str) -> Iterator[str]:
    """A new database on ``admin_url``'s server, dropped on exit; yields its URL."""
    import psycopg

    name = f"memtune_schemathesis_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("max_examples", nargs="?", type=int, default=100, help="generated cases per operation")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--postgres", nargs="?", const=PG_ADMIN, metavar="ADMIN_URL", help="a fresh PostgreSQL database")
    where.add_argument("--database-url", help="use this database as it is (migrated first)")
    return parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv), extra


def _run(url: str, root: Path, max_examples: int, extra: list[str]) -> int:
    from memtune.storage import Database, upgrade
    from memtune.storage.repositories import KeyRepository

    db = Database(url)
    upgrade(db)
    with db.session() as s:
        _, key = KeyRepository(s).create(f"schemathesis-{int(time.time())}")
    db.dispose()

    st = shutil.which("st") or shutil.which("schemathesis")
    if st is None:
        print("schemathesis is a dev dependency: pip install -e '.[dev]'", file=sys.stderr)
        return 2
    port = _free_port()
    env = {**os.environ, "MEMTUNE_DATA_DIR": str(root), "MEMTUNE_DATABASE_URL": url}
    serve = [sys.executable, "-m", "uvicorn", "--factory", "memtune.api.service.main:create_app", "--port", str(port)]
    server = subprocess.Popen([*serve, "--log-level", "warning"], cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/openapi.json", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        cmd = [
            st, "--config-file", str(CONFIG), "run", f"{base}/openapi.json", "--checks", "all",
            "--max-examples", str(max_examples), "-H", f"Authorization: Bearer {key}", "--seed", "1", *extra,
        ]  # fmt: skip
        print("$", " ".join(c if not c.startswith("Authorization") else "Authorization: Bearer …" for c in cmd))
        return subprocess.run(cmd, cwd=ROOT, check=False).returncode
    finally:
        server.terminate()
        server.wait(timeout=30)


def main(argv: list[str]) -> int:
    args, extra = _parse(argv)
    root = Path(tempfile.mkdtemp(prefix="memtune-schemathesis-"))
    if args.postgres:
        with _fresh_postgres(args.postgres) as url:
            return _run(url, root, args.max_examples, extra)
    return _run(args.database_url or f"sqlite:///{root / 'memtune.db'}", root, args.max_examples, extra)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
