"""Run a chain's forward pass as an inference plan says (NOTE [ Inference plans ] in
``memtune.tuner.inference._inference_plan``).

``InferenceRunner(model, plan, device=...)`` prepares the weights: resident ones on the device, host-prefetched ones
in pinned host memory (on a CPU "device", whose memory is host memory, in a separate copy, so that every copy is a
real one and the plan's logic runs as on a GPU). Calling it runs the layers under ``torch.no_grad``: a split Conv2d
or Linear runs partition by partition, each with its slice of the weights, into its slice of the output.

# NOTE [ Inference copy order ]
On CUDA, weight partitions and inputs coming back from the host are copied on one side stream; compute waits for
each copy's event. The copy of host-prefetched partition q+1 is issued once partition q is launched and partition
q-1's compute has finished (the host waits for its event), so at most two weight partitions are on the device: the
one in use and the one arriving, as the plan's working set counts. An output partition sent to the host is copied on
the compute stream, so its device memory is free for the next partition. An input comes back from the host once the
compute stream has finished the previous layer, whose input is freed by then. On the CPU the same steps run in the
same order, each copy a clone made by the computing thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from memtune.profiler import ModelChain
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.inference import InferencePlan, LayerPlan
from memtune.tuner.inference._facts import ConvWorkspace
from memtune.tuner.runtime.inference_facts import (
    aliases_input,
    chain_layers,
    out_dim,
    split_units,
    units_of,
    weighted_forward,
)

__all__ = ["InferenceRunner"]


@dataclass
class _Weights:
    """One partition's weight and bias on the device, and the event its copy records (CUDA)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    ready: torch.cuda.Event | None


class _Copier:
    """Host<->device copies (NOTE [ Inference copy order ]): a side stream and events on CUDA, clones on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def host(self, t: torch.Tensor) -> torch.Tensor:
        """A host-memory copy of ``t``: pinned on CUDA, a separate tensor on the CPU."""
        return t.detach().to("cpu").pin_memory() if self.cuda else t.detach().clone()

    def h2d(
        self, *hosts: torch.Tensor | None, after_compute: bool = False
    ) -> tuple[list[torch.Tensor | None], torch.cuda.Event | None]:
        """Copy ``hosts`` to the device (once compute is done so far, with ``after_compute``); returns the copies and
        the event ``use`` waits for (None on the CPU, where the copies are done)."""
        if self.stream is None:
            return [None if h is None else h.clone() for h in hosts], None
        if after_compute:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            outs = [None if h is None else h.to(self.device, non_blocking=True) for h in hosts]
            event = torch.cuda.Event()
            event.record(self.stream)
        return outs, event

    def use(self, tensors: list[torch.Tensor | None], ready: torch.cuda.Event | None) -> None:
        """Make the compute stream wait for a copy before it reads ``tensors``."""
        if ready is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(ready)
            for t in tensors:
                if t is not None:
                    t.record_stream(compute)

    def mark(self) -> torch.cuda.Event | None:
        """An event after the compute launched so far (None on the CPU)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event


class _Prefetcher:
    """The host-prefetched partitions of a run, one ahead (NOTE [ Inference copy order ])."""

    def __init__(self, copier: _Copier, loads: list[tuple[torch.Tensor, torch.Tensor | None]]) -> None:
        self.copier = copier
        self.loads = loads
        self.next = 0
        self.arriving: deque[_Weights] = deque()
        self.launched: torch.cuda.Event | None = None  # after the compute of the partition before the current one

    def start(self) -> None:
        self._issue()

    def _issue(self) -> None:
        if self.next < len(self.loads):
            (w, b), ready = self.copier.h2d(*self.loads[self.next])
            assert w is not None
            self.arriving.append(_Weights(w, b, ready))
            self.next += 1

    def take(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next partition's weights, ready for compute."""
        got = self.arriving.popleft()
        self.copier.use([got.weight, got.bias], got.ready)
        return got.weight, got.bias

    def launched_one(self) -> None:
        """The partition just taken is launched: once the one before it is done, copy the next in."""
        done_before, self.launched = self.launched, self.copier.mark()
        if done_before is not None:
            done_before.synchronize()
        self._issue()


class _Layer:
    """One layer and its weights as its ``LayerPlan`` places them."""

    def __init__(self, name: str, module: nn.Module, lp: LayerPlan, copier: _Copier, conv: ConvWorkspace) -> None:
        self.name, self.module, self.lp, self.conv = name, module, lp, conv
        units = units_of(module)
        weighted = isinstance(module, (nn.Conv2d, nn.Linear))
        if lp.channel_parts > units:
            raise PlanError(f"layer {name!r} ({type(module).__name__}): channel_parts {lp.channel_parts} but it has "
                            f"{units} output channels to split")  # fmt: skip
        if lp.weights == "host_prefetch" and not weighted:
            raise PlanError(f"layer {name!r} ({type(module).__name__}) has no weights to prefetch")
        if lp.output == "host" and aliases_input(module):
            raise PlanError(f"layer {name!r} ({type(module).__name__}) returns its input's storage; output 'device'")
        self.bounds = split_units(units, lp.channel_parts)
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.host_parts: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            w: torch.Tensor = module.weight
            b: torch.Tensor | None = module.bias
            if lp.weights == "resident":
                self.weight = w.detach().to(copier.device)
                self.bias = None if b is None else b.detach().to(copier.device)
            else:
                wh, bh = copier.host(w), None if b is None else copier.host(b)
                self.host_parts = [(wh.narrow(0, a, n), None if bh is None else bh.narrow(0, a, n))
                                   for a, n in self.bounds]  # fmt: skip
        self.staging: dict[torch.Size, torch.Tensor] = {}

    def op(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        assert isinstance(self.module, (nn.Conv2d, nn.Linear))
        return weighted_forward(self.module, x, w, b, self.conv)

    def partitions(self, pipe: _Prefetcher) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor | None]]:
        """``(first channel, channels, weight, bias)`` per partition, on the device."""
        for a, n in self.bounds:
            if self.host_parts:
                w, b = pipe.take()
                yield a, n, w, b
                continue
            assert self.weight is not None
            b = None if self.bias is None else self.bias.narrow(0, a, n)
            yield a, n, self.weight.narrow(0, a, n) if self.lp.channel_parts > 1 else self.weight, b

    def run(
        self, x: torch.Tensor, pipe: _Prefetcher, copier: _Copier
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This layer on ``x``: ``(output on the device, None)``, or ``(None, output in host memory)``."""
        if not isinstance(self.module, (nn.Conv2d, nn.Linear)):
            return self.module(x), None
        out: torch.Tensor | None = None
        for a, n, w, b in self.partitions(pipe):
            y = self.op(x, w, b)
            if self.host_parts:
                pipe.launched_one()
            if self.lp.channel_parts == 1:
                return y, None
            dim = out_dim(self.module, y.dim())
            if out is None:
                shape = list(y.shape)
                shape[dim] = self.bounds[-1][0] + self.bounds[-1][1]
                out = self._output(torch.Size(shape), y.dtype, x.device)
            out.narrow(dim, a, n).copy_(y, non_blocking=self.lp.output == "host")
            del y, w, b
        return (out, None) if self.lp.output == "device" else (None, out)

    def _output(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if self.lp.output == "device":
            return torch.empty(shape, dtype=dtype, device=device)
        buf = self.staging.get(shape)
        if buf is None or buf.dtype != dtype:
            buf = self.staging[shape] = torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")
        return buf


class InferenceRunner:
    """Runs ``model``'s forward pass following ``plan`` on ``device`` (NOTE [ Inference plans ]).

    The model's layers are put in eval mode; its parameters are not moved or changed (the runner keeps its own copies
    where the plan places weights). The output equals the plain model's: each output channel is computed from the same
    input and weights (up to the order the device's kernels sum in, which partitioning may change).

    Args:
        model: an ``nn.Sequential`` chain of supported layers, or a ``ModelChain`` of them
            (``memtune.tuner.runtime.inference_facts.chain_layers``).
        plan: its inference plan (``memtune.tuner.plan_inference``).
        device: where to compute: ``cuda`` (weights prefetched from pinned host memory on a side stream) or ``cpu``.

    Raises:
        PlanError: a layer is not supported, or the plan does not fit the model (the layer is named).

    Example::

        runner = InferenceRunner(model, plan_inference(facts, 4 << 20), device="cuda")
        y = runner(x)
    """

    def __init__(
        self, model: nn.Module | ModelChain, plan: InferencePlan, *, device: str | torch.device = "cpu"
    ) -> None:
        layers = chain_layers(model)
        if [n for n, _ in layers] != [lp.name for lp in plan.layers]:
            k = next((i for i, (a, b) in enumerate(zip(layers, plan.layers, strict=False)) if a[0] != b.name),
                     min(len(layers), len(plan.layers)))  # fmt: skip
            have = layers[k][0] if k < len(layers) else "nothing"
            want = plan.layers[k].name if k < len(plan.layers) else "nothing"
            raise PlanError(f"layer {k} of the model is {have!r} but the plan's is {want!r}; "
                            "a plan is made for one chain")  # fmt: skip
        for _, module in layers:
            module.eval()
        self.plan = plan
        self.device = torch.device(device)
        self.copier = _Copier(self.device)
        self.layers = [
            _Layer(n, m, lp, self.copier, plan.conv_workspace) for (n, m), lp in zip(layers, plan.layers, strict=True)
        ]
        self.loads = [part for layer in self.layers for part in layer.host_parts]

    @property
    def resident_bytes(self) -> int:
        """The resident weights this runner keeps on the device, bytes."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.weight, layer.bias)
                   if t is not None)  # fmt: skip

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output for ``x`` (moved to the device), on the device."""
        h: torch.Tensor | None = x.to(self.device)
        pipe = _Prefetcher(self.copier, self.loads)
        pipe.start()
        on_host: torch.Tensor | None = None
        for layer in self.layers:
            if on_host is not None:
                h = self._back(on_host)
            assert h is not None
            h, on_host = layer.run(h, pipe, self.copier)
        if on_host is not None:
            h = self._back(on_host)
        assert h is not None
        return h

    def _back(self, host: torch.Tensor) -> torch.Tensor:
        """An output sent to the host comes back as the next layer's input."""
        (dev,), ready = self.copier.h2d(host, after_compute=True)
        assert dev is not None
        self.copier.use([dev], ready)
        return dev
