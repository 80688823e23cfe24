"""What the ``memtune`` commands share: the two consoles, refusing an option, reading ``--param`` and the comma lists,
building a model and finding the profile to tune with, the profile's self-check line and the tables' number format.

``memtune.api.cli._commands`` and the modules of its command bodies (``cli_profile``, ``tune``, ``cli_bench``) import
these; this module imports none of them. Nothing here imports torch, so ``memtune --help`` stays quick.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from memtune.profiler import Profile, ProfilerError
from memtune.tuner import TunerError

if TYPE_CHECKING:
    from memtune.profiler import ModelChain
    from memtune.tuner.budget import Budget

__all__ = [
    "GiB",
    "activation_budgets",
    "check_options",
    "err",
    "fail",
    "fmt",
    "load_chain",
    "out",
    "parse_params",
    "print_profile_checks",
    "resolve_profile",
    "sample_shape",
]

out = Console()
err = Console(stderr=True)

#: bytes in a GiB, the tables' unit
GiB = float(1 << 30)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as an error on standard error; the exit (status ``code``) for the caller to raise."""
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``--param KEY=VALUE`` options as a dict, each value read as JSON where it is JSON, else kept as text."""
    params: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--param {item!r}: write KEY=VALUE, e.g. --param image_size=224")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def load_chain(model: str, params: dict[str, Any] | None = None, spec: Path | None = None) -> ModelChain:
    """Build a zoo model by name, or a JSON spec file's model."""
    if spec is not None:
        from memtune.profiler import from_spec

        try:
            data = json.loads(spec.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise fail(f"cannot read the spec {spec}: {exc}") from exc
        return from_spec(data)
    from memtune.profiler import build

    return build(model, params or {})


def resolve_profile(
    chain: ModelChain,
    batch: int,
    dtype: str,
    gpu: str,
    profile_file: Path | None = None,
    allow_measured: bool = True,
) -> Profile:
    """The profile to tune with: a given file, a committed measured one, else a modeled one."""
    if profile_file is not None:
        return Profile.load(profile_file)
    if allow_measured and not chain.name.startswith("spec:"):
        from memtune.profiler import find_profile

        found = find_profile(chain.name, batch, dtype, gpu, params=chain.params)
        if found is not None:
            return found
    from memtune.profiler import modeled_profile

    return modeled_profile(chain, batch, dtype, gpu)


def activation_budgets(text: str, option: str) -> list[float]:
    """A comma-separated list of torch.compile activation budgets (0 to 1); ValueError names the option."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: give comma-separated numbers from 0 to 1, e.g. 0,0.5,1") from None
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"{option}: activation budgets are shares from 0 to 1, not {bad[0]:g}")
    return values


def sample_shape(input_shape: str | None) -> tuple[int, ...]:
    """A factory model's ``--input-shape``, one sample's sizes (3,224,224; 512 tokens); refused when missing."""
    if input_shape is None:
        raise fail("a factory model needs --input-shape (one sample, e.g. 3,224,224)")
    try:
        return tuple(int(d) for d in input_shape.split(","))
    except ValueError:
        raise fail(f"--input-shape {input_shape!r}: write sizes separated by commas, e.g. 3,224,224") from None


def check_options(**arguments: Any) -> Budget | None:
    """Refuse a bad --budget, --optimizer, --dtype, --gpu or --headroom at once, before any profiling
    (``memtune.tuner.pipeline.check_arguments``: each message names the option and what it takes); the budget read,
    for ``memtune.tuner.budget.profile_budget`` (NOTE [ One pipeline ]), or None without one."""
    from memtune.tuner.pipeline import check_arguments

    try:
        return check_arguments(**arguments)
    except (ProfilerError, TunerError) as exc:
        message = str(exc).strip("\"'")
        named = next((name for name in arguments if message.startswith(f"{name} ")), None)
        raise fail(f"--{message}" if named else message) from exc


def print_profile_checks(prof: Profile) -> None:
    """The profile's self-check (NOTE [ Profile self-check ] in ``memtune.tuner._peak_check``), in red where it is
    off, and what the model's output holds besides its tensors where it is worth dropping (a key/value cache)."""
    from rich.markup import escape

    from memtune.tuner import held_output_note, peak_check

    check = peak_check(prof)
    if check is not None:
        out.print(f"[{'bold red' if check.reported else 'dim'}]memory check: {check}[/]")
    held = held_output_note(prof)
    if held is not None:
        out.print(f"[yellow]{escape(held)}[/]")


def fmt(v: float | None, spec: str) -> str:
    """``v`` in format ``spec`` (its own unit: ms, GiB, a ratio), or ``-`` where there is none."""
    return "-" if v is None else format(v, spec)
