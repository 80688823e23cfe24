"""Measure plans on a live GPU: the measuring room beside ``memtune.tuner.runtime``, which applies them.

Every module here runs plans (through ``memtune.tuner.runtime``) or the unplanned model and reports what it measured;
none changes how a plan runs. Each is imported on its own: they pull in the simulator, cuDNN bindings or the compiler.

* ``bench``, ``bench_command``: ``memtune bench`` on a zoo model, plans side by side with PyTorch's own tools;
  ``module_bench``: the same for any module; ``peers``, ``module_peers``, ``peer_measure``, ``sequential_chain``: the
  ways a user could train in less memory without memtune, and their measurement; ``compiler_points``: the whole model
  compiled at several activation budgets.
* ``validate``: a job's chosen plans measured on the worker's GPU; ``calibrate``, ``first_use``, ``link_share``: what a
  GPU type is (its link, its allocator, its headroom), measured once; ``lean``: stage transients under memory-optimal
  convolution algorithms; ``inference_measure``: inference facts; ``isolate``: one call in a fresh process.
* ``tune_module``: the Python face's ``profile``, ``tune`` and ``planned`` on a live ``nn.Module``: it measures the
  model (and its compiled candidates) and hands the profiles to ``memtune.tuner.pipeline`` to search and bound.
"""

from __future__ import annotations

__all__ = []  # type: list[str]  # each module is imported on its own (above)
