"""The modeled GPU convolution workspace against every one the committed zoo profiles measured.

    python -m benchmarks.conv_workspace_check

For each stage of a committed measured zoo profile (``memtune/profiler/data``, H100 and H200) that is one convolution,
the measured transients are set beside ``memtune.profiler.conv_workspace.conv_workspace_bytes`` (NOTE [ GPU convolution
workspaces ]): the forward's (``forward_workspace_bytes``) and, where measured, the backward's
(``chained_backward_bytes`` less the output's gradient, which the stage holds anyway). T is the NHWC copies of the
input, output and filter; the model is T plus its slack. The model must be at or above every measured transient (a
plan said to fit must fit); the table gives each measurement's ratio to T and its excess over the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memtune.profiler.conv_workspace import conv_copies_bytes, conv_workspace_bytes, output_shape

__all__ = ["Measured", "main", "measured", "summary"]

DATA = Path(__file__).resolve().parent.parent / "memtune" / "profiler" / "data"
MiB = 2**20


@dataclass(frozen=True)
class Measured:
    """One single-convolution stage's measured transient beside the model. Sizes in bytes.

    Attributes:
        profile: the zoo profile's file name, without ``.json``.
        stage: the stage's name.
        pass_: ``forward`` or ``backward``.
        measured: the measured transient.
        copies: T, the NHWC copies of the input, output and filter (channels padded).
        modeled: ``conv_workspace_bytes``.
    """

    profile: str
    stage: str
    pass_: str
    measured: int
    copies: int
    modeled: int


def measured(data: Path = DATA) -> list[Measured]:
    """Every single-convolution stage's measured forward and backward transient in the measured profiles of ``data``."""
    out = []
    for path in sorted(data.glob("*.json")):
        p = json.loads(path.read_text())
        if p.get("source") != "measured" or p.get("compile_budget") is not None:
            continue
        element = 4 if p["dtype"] == "float32" else 2
        for s in p["stages"]:
            if len(s.get("convs", ())) != 1:
                continue
            c = s["convs"][0]
            batch = c.get("batch") or p["batch"]
            x = (batch, c["in_channels"], *c["input_hw"])
            w = (c["out_channels"], c["in_channels"] // c.get("groups", 1), *c["kernel_size"])
            dilation = c.get("dilation", (1, 1))
            y = output_shape(x, w, c["stride"], c["padding"], dilation, False, (0, 0), c.get("groups", 1))
            modeled = conv_workspace_bytes(x, w, y, element)
            copies = conv_copies_bytes(x, w, y, element)
            got = [("forward", s.get("forward_workspace_bytes", 0))]
            if s.get("chained_backward_bytes") is not None:
                got.append(("backward", s["chained_backward_bytes"] - s["output_bytes"]))
            for pass_, bytes_ in got:
                out.append(Measured(path.stem, s["name"], pass_, bytes_, copies, modeled))
    return out


def summary(rows: list[Measured]) -> str:
    """Per pass: how many measurements, how many at T (to 0.2 MiB), below it, the largest ratio to T and excess over
    it, and how many the model is below (none, by design)."""
    lines = [
        "| pass | measured | at T (0.2 MiB) | below T | largest ratio to T | largest excess over T | above the model |",
        "|---|---|---|---|---|---|---|",
    ]
    for pass_ in ("forward", "backward"):
        rs = [r for r in rows if r.pass_ == pass_]
        if not rs:
            continue
        at = sum(abs(r.measured - r.copies) <= 0.2 * MiB for r in rs)
        below = sum(r.measured < r.copies - 0.2 * MiB for r in rs)
        ratio = max(rs, key=lambda r: r.measured / r.copies)
        excess = max(rs, key=lambda r: r.measured - r.copies)
        over = [r for r in rs if r.measured > r.modeled]
        lines.append(
            f"| {pass_} | {len(rs)} | {at} | {below} | {ratio.measured / ratio.copies:.3f} ({ratio.profile} "
            f"{ratio.stage}) | {(excess.measured - excess.copies) / MiB:.1f} MiB ({excess.profile} {excess.stage}) | "
            f"{len(over)} |"
        )
    return "\n".join(lines)


def main() -> None:
    rows = measured()
    print("<!-- python -m benchmarks.conv_workspace_check -->")
    print(summary(rows))
    print()
    print("| profile | stage | pass | measured MiB | T MiB | modeled MiB | measured / T |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.profile} | {r.stage} | {r.pass_} | {r.measured / MiB:.2f} | {r.copies / MiB:.2f} | "
            f"{r.modeled / MiB:.2f} | {r.measured / r.copies:.3f} |"
        )


if __name__ == "__main__":
    main()
