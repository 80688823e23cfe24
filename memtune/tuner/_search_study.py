"""The Optuna studies of one plan search: the study kept (in memory, or in a database and resumed), the study
searched (the kept one, or an in-memory copy whose trials are written behind to the database, NOTE [ Written
behind ]), the sampler, and a trial's constraints in the list form that optuna-dashboard reads.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import time
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial

from memtune.tuner._search_results import CONSTRAINTS, Mode
from memtune.tuner._tuner_errors import SearchError

__all__ = ["Studies", "open_study"]


@dataclass(frozen=True)
class Studies:
    """The studies of one search (``open_study``)."""

    #: the study the caller asked for: what is served and recorded
    kept: optuna.Study
    #: the study the trials run in: ``kept``, or its in-memory copy when ``kept`` is in a database
    searched: optuna.Study
    #: writes ``searched``'s finished trials to ``kept``; None when they are one study
    mirror: _Mirror | None
    #: ``kept``'s finished trials when it was opened (a resumed study's)
    existing: list[FrozenTrial]


def open_study(
    storage: str | optuna.storages.BaseStorage | None, study_name: str | None, seed: int, mode: Mode, priced: bool
) -> Studies:
    """Create or resume the study (failing stale running trials of dead workers), with a TPE sampler seeded with
    ``seed``; a new study keeps ``seed`` and ``priced`` as study attributes (NOTE [ One objective ] in
    ``memtune.tuner.search``)."""
    with warnings.catch_warnings():  # the list form of constraints is deprecated in Optuna 5 (NOTE [ One objective ])
        warnings.simplefilter("ignore", FutureWarning)
        sampler = optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=10,
            multivariate=True,
            constraints_func=_constraint_list,
        )
    directions: list[Literal["minimize", "maximize"]] = ["minimize", "minimize"] if mode == "pareto" else ["minimize"]
    kept = optuna.create_study(
        storage=storage, study_name=study_name, sampler=sampler, directions=directions, load_if_exists=True
    )
    with warnings.catch_warnings():  # heartbeat handling is marked experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(kept)
    existing = [t for t in kept.get_trials(deepcopy=False) if t.state.is_finished()]
    if not existing:
        kept.set_user_attr("seed", seed)
        kept.set_user_attr("priced", priced)
    # NOTE [ Written behind ]: a study in a database is searched in memory and its finished trials written to the
    # database in batches by a child process (``_Mirror``): Optuna's RDBStorage commits some 45 times per trial,
    # which made a job 2.6x slower than the same search from the command line. The database can lag the search
    # (a job's progress counts the trials searched) by at most ``_Mirror.max_lag`` trials, the search waiting for it
    # beyond; a job that is killed keeps the trials written before and is searched on from them when resumed, and
    # the writer stops with the process it writes for
    study = kept
    mirror: _Mirror | None = None
    if storage is not None:
        study = optuna.create_study(sampler=sampler, directions=directions)
        study.add_trials(existing)
        mirror = _Mirror(kept, study, storage)
    return Studies(kept, study, mirror, existing)


def _constraint_list(t: FrozenTrial) -> list[float]:
    """A trial's constraints in the list form (``CONSTRAINTS`` order) that optuna-dashboard reads."""
    named = t.constraints
    return [float(named.get(k, 0.0)) for k in CONSTRAINTS]


class _Mirror:
    """Writes the finished trials of an in-memory study to the database's study in batches, at most every
    ``interval_s`` seconds (NOTE [ Written behind ]): in a child process when the database is an Optuna
    ``RDBStorage`` (its writes, some 100 ms a trial on PostgreSQL, then run beside the search on another core),
    else here. The search waits while more than ``max_lag`` trials it sent are not in the database yet, so a
    process killed mid-search loses at most ``max_lag`` trials besides those of the last ``interval_s``."""

    interval_s = 1.0
    max_lag = 64

    def __init__(self, kept: optuna.Study, searched: optuna.Study, storage: str | optuna.storages.BaseStorage) -> None:
        self.kept, self.searched = kept, searched
        #: numbers (in ``searched``) of the trials the kept study holds; an enqueued trial has its number before it
        #: runs, so trials do not finish in number order
        self.written = {t.number for t in searched.get_trials(deepcopy=False) if t.state.is_finished()}
        self.last = time.monotonic()
        self._queue: Any = None
        self._writer: Any = None
        self._committed: Any = None  # trials the child has added to the database's study (shared with it)
        url: object = storage if isinstance(storage, str) else getattr(storage, "url", None)
        kwargs: dict[str, Any] | None = {} if isinstance(storage, str) else None
        if isinstance(storage, optuna.storages.RDBStorage):
            kwargs = dict(storage.engine_kwargs)
        if isinstance(url, str) and kwargs is not None and not multiprocessing.current_process().daemon:
            ctx = multiprocessing.get_context("spawn")  # a daemonic process may have no children: it writes itself
            self._queue = ctx.Queue()
            self._committed = ctx.Value("q", len(self.written))
            args = (url, kwargs, kept.study_name, self._queue, self._committed)
            self._writer = ctx.Process(target=_write_trials, args=args, name="memtune-trials", daemon=True)
            self._writer.start()

    def write(self, *, every: bool = False) -> None:
        """Send the trials finished since the last write to the kept study (``every``: whatever the time)."""
        if not every and time.monotonic() - self.last < self.interval_s:
            return
        trials = self.searched.get_trials(deepcopy=False)
        new = [t for t in trials if t.state.is_finished() and t.number not in self.written]
        if new:
            if self._queue is not None:
                self._queue.put(new)
            else:
                self.kept.add_trials(new)
            self.written.update(t.number for t in new)
        self.last = time.monotonic()
        while self.lag() > self.max_lag and self._writer is not None and self._writer.is_alive():
            time.sleep(0.005)  # the database is behind: the search waits for it (the lag stays bounded)

    def lag(self) -> int:
        """Trials sent to the database's study and not yet in it (0 when written here, synchronously)."""
        return 0 if self._committed is None else len(self.written) - int(self._committed.value)

    def close(self) -> None:
        """Write what is left and wait until the kept study holds every trial.

        Raises:
            SearchError: the child process that writes trials failed.
        """
        self.write(every=True)
        if self._writer is None:
            return
        self._queue.put(None)
        self._writer.join()
        if self._writer.exitcode != 0:
            raise SearchError(f"writing the trials to the study's database failed (exit code {self._writer.exitcode})")


def _write_trials(url: str, engine_kwargs: dict[str, Any], study_name: str, queue: Any, committed: Any) -> None:
    """The child of ``_Mirror``: add the trials of each batch from ``queue`` to the study, until None. When the
    searching process is gone (killed), it stops at once: another worker may be resuming the study, and a trial
    written then would be one the resumed search does not know of."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    study = optuna.load_study(study_name=study_name, storage=storage)
    parent = multiprocessing.parent_process()
    while True:
        try:
            batch = queue.get(timeout=0.5)
        except queue_module.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        if batch is None:
            return
        for trial in batch:
            if parent is not None and not parent.is_alive():
                return
            study.add_trial(trial)
            with committed.get_lock():
                committed.value += 1
