"""A bounded schemathesis run over the whole API, every check on (NOTE [ Exact OpenAPI ] in
``memtune.api.service._openapi``).

Each operation gets ``MAX_EXAMPLES`` generated requests, made with a valid API key against an app on a fresh SQLite
database (no worker: submitted jobs stay queued). The checks read the repository's ``schemathesis.toml``, as
``scripts/schemathesis_full.py``'s ``st run`` does: the one place that names, per operation, a refusal the schema
cannot say and why.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is a dev dependency: pip install -e '.[dev]'")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402

from memtune.api.service.main import create_app  # noqa: E402
from memtune.api.service.settings import Settings  # noqa: E402
from memtune.storage import Database, upgrade  # noqa: E402
from memtune.storage.repositories import KeyRepository  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # schemathesis reads its file with tomli there
    import tomli as tomllib

pytestmark = pytest.mark.slow

#: generated requests per operation; ``MEMTUNE_SCHEMATHESIS_EXAMPLES=200`` for the full run of the service page
MAX_EXAMPLES = int(os.environ.get("MEMTUNE_SCHEMATHESIS_EXAMPLES", "12"))
#: the per-operation check settings both runs use
CONFIG = Path(__file__).resolve().parents[3] / "schemathesis.toml"

_root = Path(tempfile.mkdtemp(prefix="memtune-schemathesis-"))
_db = Database(f"sqlite:///{_root / 'memtune.db'}")
upgrade(_db)
with _db.session() as _s:
    _, KEY = KeyRepository(_s).create("schemathesis")
schema = schemathesis.openapi.from_asgi(
    "/openapi.json", create_app(Settings(data_dir=_root), db=_db), config=SchemathesisConfig.from_path(CONFIG)
)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_operation_answers_as_documented(case: Any) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"})


def test_every_setting_names_one_real_operation_a_reason_and_one_status_more() -> None:
    """Each ``[[operations]]`` entry of ``schemathesis.toml`` names one operation of the document, says why in a
    comment, turns no check off and only adds statuses to a check's defaults (or allows a slower answer);
    ``negative_data_rejection`` is never touched."""
    from schemathesis.config._checks import (
        NOT_A_SERVER_ERROR_EXPECTED_STATUSES,
        POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES,
    )

    defaults = {
        "positive_data_acceptance": POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES,
        "not_a_server_error": NOT_A_SERVER_ERROR_EXPECTED_STATUSES,
    }
    text = CONFIG.read_text()
    entries = tomllib.loads(text)["operations"]
    blocks = re.split(r"^\[\[operations\]\]$", text, flags=re.MULTILINE)[1:]
    assert len(blocks) == len(entries) > 0
    names = {f"{op.method.upper()} {op.path}" for op in (r.ok() for r in schema.get_all_operations())}
    seen = set()
    for entry, block in zip(entries, blocks, strict=True):
        where = entry["include-name"]
        assert where in names and where not in seen, where
        seen.add(where)
        assert set(entry) <= {"include-name", "checks", "request-timeout"}, where
        reason = " ".join(line.lstrip("# ") for line in block.splitlines() if line.startswith("#"))
        assert len(reason) > 60, where
        for check, setting in entry["checks"].items():
            if check == "max_response_time":  # a slower first answer allowed (the entry says why), never none
                assert isinstance(setting, float) and setting <= 60, where
                continue
            assert check in defaults and set(setting) == {"expected-statuses"}, (where, check)
            added = [s for s in setting["expected-statuses"] if s not in defaults[check]]
            assert setting["expected-statuses"][: len(defaults[check])] == defaults[check] and added, (where, check)
