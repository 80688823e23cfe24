"""GPU tests run with memtune's caching-allocator settings from the process's first CUDA allocation.

``configure_allocator`` (NOTE [ Allocator retries ] in ``memtune.tuner.runtime.guard``) is what ``memtune bench``, the
worker and measured validation use. Applied only when a test first needs it, the settings reach segments made
from then on, while segments an earlier test made stay ordinary ones, and a live block in such a segment pins
all of it: measured on the H200 (2026-11-21, run twice), the validation test then ran out of memory under its
2 GiB cap with "stream 0x0 large: 1 segment(s), 2.08 GiB reserved, 0.11 GiB allocated" (the account that
``PlanOutOfMemoryError`` now carries), while alone it passed. Setting them here, before CUDA is initialized,
is what a worker process does at start.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from memtune.api.client import MemtuneClient
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.storage.database import Database
from memtune.storage.migrate import upgrade
from memtune.storage.repositories import KeyRepository
from memtune.tuner.runtime.guard import configure_allocator
from memtune.tuner.runtime.verify import deterministic_math

configure_allocator()  # before CUDA is initialized: the settings go into the environment


@pytest.fixture
def deterministic() -> Iterator[None]:
    """Deterministic cuDNN and cuBLAS, TF32 off, for the test, restored after it (the cache emptied)."""
    det = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with deterministic_math(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(deterministic|conv_rule).*")
            yield
    finally:
        torch.use_deterministic_algorithms(det)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@pytest.fixture
def gpu_service(tmp_path: Path) -> Iterator[tuple[Database, MemtuneClient]]:
    """A migrated SQLite database in the test's folder and a client of the API in process (skipped without CUDA)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    db = Database(f"sqlite:///{tmp_path / 'memtune.db'}")
    upgrade(db)
    with db.session() as s:
        _, key = KeyRepository(s).create("gpu-tester")
    settings = Settings(data_dir=tmp_path, progress_interval_s=0.0, sse_interval_s=0.05)
    with TestClient(create_app(settings, db=db), raise_server_exceptions=False) as http:
        yield db, MemtuneClient(api_key=key, http=http)
    db.dispose()
