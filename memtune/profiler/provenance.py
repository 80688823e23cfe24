"""Where a measurement came from: the record every GPU results file carries beside its numbers.

``run_record`` returns the date, the commit of the source tree, the command line, the library versions and the host
of the running process, as plain JSON values. ``memtune bench --json-out`` writes it under ``"run"``, and so do the
GPU benchmarks (``benchmarks.ranked.result_fields``, ``benchmarks.common.model_rows``); the device itself is the
file's own ``device`` field (a ``DeviceIdentity``), which those files already held.

# NOTE [ Run record ]
A results file must say what made it, so that ``python -m benchmarks.regenerate`` can re-render its table and a
reader can tell which code and which libraries measured it. Each field is what the process can know, else ``None``:

* ``date``: UTC, ISO 8601 to the second.
* ``commit``: the ``MEMTUNE_COMMIT`` environment variable where it is set, ``dirty`` then ``None`` (unknown): a tree
  copied to a GPU host names its commit so, and a ``.git`` beside such a copy may be an older one (seen: a GPU host's
  copy whose ``.git`` still said an earlier commit). Else ``git rev-parse HEAD`` of the tree this package runs from,
  with ``dirty`` true when tracked files differ from it.
* ``command``: the command line as a shell would take it: ``memtune bench ...`` for the console script,
  ``python -m benchmarks.X ...`` for a module run with ``-m``.
* ``versions``: Python, memtune, torch with its CUDA and cuDNN, Optuna, NumPy (a package not installed is left out).

Files written before the record existed have no ``"run"``; every reader treats it as optional (``run_of``).
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["command_line", "run_of", "run_record", "source_commit", "versions"]

_ROOT = Path(__file__).resolve().parents[2]  # the source tree's top (the repository in a checkout)
_PACKAGES = ("memtune", "torch", "optuna", "numpy")


def source_commit(root: Path = _ROOT) -> tuple[str | None, bool | None]:
    """``(commit, dirty)``: ``(MEMTUNE_COMMIT, None)`` where that is set, else of the git tree at ``root``, else
    ``(None, None)`` (NOTE [ Run record ])."""
    named = os.environ.get("MEMTUNE_COMMIT")
    if named:
        return named, None
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
        if head.returncode == 0 and head.stdout.strip():
            status = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
            return head.stdout.strip(), dirty
    except (OSError, subprocess.SubprocessError):
        pass
    return None, None


def command_line(argv: Sequence[str] | None = None, *, module: str | None = None) -> str:
    """The command that started this process, quoted for a shell.

    Args:
        argv: the arguments after the program (default ``sys.argv[1:]``).
        module: the module run with ``python -m`` (default: ``__main__``'s, when it was run so); without one the
            program is ``sys.argv[0]``'s file name (``memtune`` for the console script).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = getattr(spec, "name", None)
    head = ["python", "-m", module.removesuffix(".__main__")] if module else [Path(sys.argv[0]).name or "python"]
    return shlex.join([*head, *args])


def versions() -> dict[str, str]:
    """Python's version and each installed package's of memtune, torch, Optuna and NumPy; torch's CUDA and cuDNN
    where torch is already imported (this reads nothing torch has not loaded)."""
    found = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    torch = sys.modules.get("torch")
    if torch is not None:
        found["torch"] = str(torch.__version__)
        if torch.version.cuda:
            found["cuda"] = str(torch.version.cuda)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if cudnn:
            found["cudnn"] = str(cudnn)
    return found


def run_record(argv: Sequence[str] | None = None, *, module: str | None = None) -> dict[str, Any]:
    """NOTE [ Run record ] of this process: ``date``, ``commit``, ``dirty``, ``command`` (``command_line(argv,
    module=module)``), ``versions`` and ``host``, as JSON values."""
    commit, dirty = source_commit()
    return {
        "date": datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "commit": commit,
        "dirty": dirty,
        "command": command_line(argv, module=module),
        "versions": versions(),
        "host": f"{platform.machine()}, {os.cpu_count()} cores",
    }


def run_of(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run record of a results file's JSON object, or None for a file written before files carried one."""
    run = data.get("run")
    return dict(run) if isinstance(run, Mapping) else None
