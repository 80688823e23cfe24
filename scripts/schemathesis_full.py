"""A full schemathesis run, every check on, against the service on a fresh SQLite (or the database URL given).

    python scripts/schemathesis_full.py [MAX_EXAMPLES] [DATABASE_URL] [-- extra `st run` options]

Starts ``uvicorn`` on a free port with ``create_app`` (no worker: submitted jobs stay queued) and an API key made
for the run, then runs ``st run URL/openapi.json --checks all`` with that key, ``MAX_EXAMPLES`` (default 100)
generated cases per operation, and every phase (examples, coverage, fuzzing, stateful). Its exit status is
schemathesis's. ``tests/unit/service/test_schemathesis.py`` is the bounded version the slow test set runs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = argv[: argv.index("--")] if "--" in argv else argv
    max_examples = int(args[0]) if args else 100
    root = Path(tempfile.mkdtemp(prefix="memtune-schemathesis-"))
    url = args[1] if len(args) > 1 else f"sqlite:///{root / 'memtune.db'}"

    from storage.database import Database
    from storage.migrate import upgrade
    from storage.repositories import KeyRepository

    db = Database(url)
    upgrade(db)
    with db.session() as s:
        _, key = KeyRepository(s).create(f"schemathesis-{int(time.time())}")
    db.dispose()

    port = _free_port()
    env_prefix = {"MEMTUNE_DATA_DIR": str(root), "MEMTUNE_DATABASE_URL": url}
    serve = [sys.executable, "-m", "uvicorn", "--factory", "api.main:create_app", "--port", str(port)]
    server = subprocess.Popen([*serve, "--log-level", "warning"], env={**os.environ, **env_prefix})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/openapi.json", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        st = shutil.which("st") or shutil.which("schemathesis")
        if st is None:
            print("schemathesis is a dev dependency: pip install -e '.[dev]'", file=sys.stderr)
            return 2
        cmd = [
            st, "run", f"{base}/openapi.json", "--checks", "all", "--max-examples", str(max_examples),
            "-H", f"Authorization: Bearer {key}", "--seed", "1", *extra,
        ]  # fmt: skip
        print("$", " ".join(c if not c.startswith("Authorization") else "Authorization: Bearer …" for c in cmd))
        return subprocess.run(cmd, check=False).returncode
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
