"""The lookup version: a counter that every write to what the service's lookups read raises.

# NOTE [ Lookup version ]
``GET /v1/gpus/{gpu}/best`` and ``GET /v1/leaderboard`` read ``mt_results``, ``mt_models`` and ``mt_gpu_types``
only, and those are written by workers, often in other processes or on other hosts, which an API process cannot be
told about. So each write says so in the database: a session of ``Database`` that flushes an insert, a change or a
delete of a row of those tables (or runs an ORM ``UPDATE``/``DELETE`` statement on them) raises the one counter in
``mt_lookup_version`` in the same transaction. A reader that keeps answers computed from those tables keeps the
version it read with them, and one small query (``Database.lookup_version()``) tells it whether any of them may have
changed since: an answer is out of date exactly when a write committed after it was computed.

Writes that bypass the ORM (raw SQL, a database-level ``ON DELETE CASCADE`` from a deleted job) do not raise it;
memtune deletes results through the ORM only, and never deletes jobs or models.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select, update
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction, sessionmaker

from memtune.storage.orm import GpuTypeRow, LookupVersionRow, ModelRow, ResultRow

__all__ = ["LOOKUP_ROWS", "read_lookup_version", "watch_lookup_writes"]

#: the rows the lookups read: a write to any of them raises the lookup version
LOOKUP_ROWS: tuple[type[Any], ...] = (ResultRow, ModelRow, GpuTypeRow)

_RAISE = update(LookupVersionRow).where(LookupVersionRow.id == 1).values(version=LookupVersionRow.version + 1)


def _touches_lookups(session: Session) -> bool:
    if any(isinstance(o, LOOKUP_ROWS) for o in (*session.new, *session.deleted)):
        return True
    return any(isinstance(o, LOOKUP_ROWS) and session.is_modified(o) for o in session.dirty)


def _after_flush(session: Session, _flush: UOWTransaction) -> None:
    if _touches_lookups(session):
        session.connection().execute(_RAISE)  # on the connection: the ORM is mid-flush


def _on_execute(state: ORMExecuteState) -> None:
    if not (state.is_update or state.is_delete or state.is_insert):
        return
    mapper = state.bind_mapper
    if mapper is not None and issubclass(mapper.class_, LOOKUP_ROWS):
        state.session.connection().execute(_RAISE)  # on the connection: not seen by this hook again


def watch_lookup_writes(factory: sessionmaker[Session]) -> None:
    """Make every session of ``factory`` raise the lookup version with its writes to ``LOOKUP_ROWS``."""
    event.listen(factory, "after_flush", _after_flush)
    event.listen(factory, "do_orm_execute", _on_execute)


def read_lookup_version(session: Session) -> int:
    """The lookup version as committed now (NOTE [ Lookup version ])."""
    return int(session.execute(select(LookupVersionRow.version).where(LookupVersionRow.id == 1)).scalar_one())
