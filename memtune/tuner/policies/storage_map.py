"""Shared helpers for the baseline policies: which stages share saved storages, what copies cost.

Policies reason about stages, but a plan acts on saved storages (NOTE [ Saved storages ] in
``memtune.profiler._profile``, NOTE [ Plan semantics ] in ``memtune.tuner.plan``): a storage is offloaded only when
every stage that references it offloads it, and the model input (producer -1) is always resident. So a policy
that wants "the input of this convolution on the host" must mark every stage that saves that storage.
``StorageMap`` answers those questions for one profile.

Copy times follow the simulator's rule: a storage's D2H (H2D) time is the measured ``d2h_ms`` (``h2d_ms``)
of the stage that is first to save it, shared out by bytes; where that stage has no measurement the
device bandwidth (GB/s, 1e9 bytes per second) is used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memtune.profiler import Profile, StageProfile
from memtune.tuner._copy_costs import storage_copy_ms

__all__ = ["StorageMap", "is_conv"]


def is_conv(stage: StageProfile) -> bool:
    """True for a convolution stage: one that holds convolutions, or whose kind is ``conv2d``."""
    return bool(stage.convs) or stage.kind == "conv2d"


@dataclass(frozen=True)
class StorageMap:
    """Per-profile tables of saved storages, built once by ``StorageMap.of(profile)``.

    Attributes:
        profile: the profile the tables describe.
        saved: per stage, the indices of the storages in its saved set (offloadable ones only:
            the model input is always resident and is left out).
        first: per stage, the offloadable storages it is the first to save (their bytes make up S_i).
        d2h_ms: per storage, the device-to-host copy time, ms.
        h2d_ms: per storage, the host-to-device copy time, ms.
    """

    profile: Profile
    saved: tuple[tuple[int, ...], ...]
    first: tuple[tuple[int, ...], ...]
    d2h_ms: tuple[float, ...]
    h2d_ms: tuple[float, ...]

    @classmethod
    def of(cls, profile: Profile) -> StorageMap:
        """Build the tables for ``profile``."""
        n = profile.n_stages
        saved: list[list[int]] = [[] for _ in range(n)]
        first: list[list[int]] = [[] for _ in range(n)]
        d2h, h2d = storage_copy_ms(profile)
        for sid, s in enumerate(profile.storages):
            if s.producer < 0:
                continue  # the model input is always resident: nothing to offload
            for k in sorted(set(s.saved_by)):
                saved[k].append(sid)
            if s.saved_by:
                first[min(s.saved_by)].append(sid)
        return cls(
            profile=profile,
            saved=tuple(tuple(x) for x in saved),
            first=tuple(tuple(x) for x in first),
            d2h_ms=tuple(d2h),
            h2d_ms=tuple(h2d),
        )

    # ---- questions ------------------------------------------------------------------------------
    def sharers(self, stage: int) -> tuple[int, ...]:
        """Stages that save any storage ``stage`` saves, ``stage`` included, in order.

        Offloading all of them is what it takes for ``stage``'s saved tensors to leave the GPU: one
        ``keep`` reference keeps a storage resident (NOTE [ Plan semantics ]).
        """
        out = {stage}
        for sid in self.saved[stage]:
            out.update(self.profile.storages[sid].saved_by)
        return tuple(sorted(out))

    def output_storage(self, stage: int) -> int | None:
        """The offloadable storage holding ``stage``'s output, or None (not saved, or the model input)."""
        sid = self.profile.stages[stage].output_storage
        if sid is None or self.profile.storages[sid].producer < 0:
            return None
        return sid

    def bytes_of(self, storages: Iterable[int]) -> int:
        """Total bytes of the given storages, each counted once."""
        return sum(self.profile.storages[sid].bytes for sid in set(storages))

    def d2h_of(self, storages: Iterable[int]) -> float:
        """Device-to-host copy ms of the given storages, each counted once."""
        return sum(self.d2h_ms[sid] for sid in set(storages))

    def saved_d2h_ms(self, stage: int) -> float:
        """D2H ms of everything ``stage`` saves (its whole saved set, shared storages included)."""
        return self.d2h_of(self.saved[stage])

    def first_bytes(self, stage: int) -> int:
        """Bytes of the offloadable storages ``stage`` is first to save (S_i without the model input)."""
        return self.bytes_of(self.first[stage])
