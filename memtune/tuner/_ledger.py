"""The memory ledger of one simulated step: every allocation and free the simulator writes, in program order.

The simulator writes each memory event once, here, and the ledger keeps the two views the code needs:

- the running total: live bytes after each event and their maximum (``SimResult.peak_bytes``), starting from what
  is resident for the whole step (NOTE [ Simulator memory accounting ] in
  ``memtune.tuner.simulator``), and on request the timeline, ``(time ms, live bytes, label)`` after each event;
- on request, the same memory tensor by tensor: ``("alloc" | "free", key, bytes)`` blocks in program order
  (``SimResult.blocks``), which NOTE [ Allocator placement ] in ``memtune.tuner.placement`` replays.

An event's change in live bytes sums the blocks written beside it, but not always in their order: a stage's start
allocates its workspace and gradients in one event where the blocks also free them in between. ``blocks_peak``
replays the blocks' own running total, the peak the allocator model sees.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Block", "Event", "Ledger", "blocks_peak"]

#: one tensor's allocation or free: ``("alloc" | "free", key, bytes)``
Block = tuple[str, object, int]
#: one event: ``(time ms, bytes allocated (negative: freed), label, label arguments)``; ``label % arguments`` (an int,
#: a tuple of them, or ``()``) names it on the timeline and is formatted only there
Event = tuple[float, int, str, "int | tuple[int, ...]"]


class Ledger:
    """Memory events of one simulated step; ``detail`` also keeps the blocks, and lets ``replay`` make the timeline.

    The simulator appends each event to ``events`` (``add = ledger.events.append`` in its loops: one list append per
    event, nothing formatted) and, where ``blocks is not None``, extends ``blocks`` with the blocks that event makes
    up; ``replay`` runs the total once, at the end.

    Attributes:
        base: bytes resident for the whole step, where the running total starts.
        events: the events so far, in program order (``Event``).
        blocks: the blocks so far, in program order, or None without ``detail``.
        labels: the timeline's labels formatted so far; a simulator passes one dict to all its runs' ledgers, since
            its runs repeat the same few hundred labels.
    """

    __slots__ = ("base", "blocks", "events", "labels")

    def __init__(
        self, base: int, detail: bool = False, labels: dict[tuple[str, int | tuple[int, ...]], str] | None = None
    ) -> None:
        self.base = base
        self.events: list[Event] = []
        self.blocks: list[Block] | None = [] if detail else None
        self.labels = {} if labels is None else labels  # formatted labels, by label and arguments: kept across runs

    def replay(self) -> tuple[int, list[tuple[float, int, str]] | None]:
        """The running total over the events: its maximum, bytes, and with ``detail`` the timeline, ``(time ms, live
        bytes, label)`` after each event (else None)."""
        live = peak = self.base
        if self.blocks is None:
            for _, delta, _, _ in self.events:
                live += delta
                if live > peak:
                    peak = live
            return peak, None
        timeline = []
        labels = self.labels
        for t, delta, label, args in self.events:
            live += delta
            if live > peak:
                peak = live
            text = labels.get((label, args))
            if text is None:
                text = labels[label, args] = label % args
            timeline.append((t, live, text))
        return peak, timeline


def blocks_peak(base: int, blocks: Iterable[Block]) -> int:
    """The peak of replaying ``blocks`` from ``base`` bytes one tensor at a time, bytes."""
    live = peak = base
    for kind, _, nbytes in blocks:
        live += nbytes if kind == "alloc" else -nbytes
        if live > peak:
            peak = live
    return peak
