"""Which memory layout compiled regions run their convolutions in: the one the compiler gives the whole model.

# NOTE [ Regions in the whole model's layout ]
Inductor may run a graph's convolutions channels-last (``torch._inductor.config.layout_optimization``); whether it
does is decided per graph by ``GraphLowering.decide_layout_opt``, from that graph's convolutions alone (no
convolution, a grouped one with more than one input channel per group, one with at least twice as many input channels
as output channels and a kernel over 1, or every one with at most 64 channels each way: no). Compiled whole, a
convolutional network is one graph and goes channels-last. Cut into regions, each region decides alone, and a region
whose convolutions the rule turns down (ResNet-50's stem, one convolution of 3 to 64 channels) runs and hands on the
default layout, so the regions after it take inputs in the default layout too. Measured on an H200 (torch 2.11,
torchvision ResNet-50, batch 128, fp32, SGD, GPU time of a training step, median of 10;
``benchmarks/results/h200/region-layout/``, the experiment ``benchmarks.region_layout`` was written from): the whole
model compiled 35.5 ms, its 22 regions (the stem's four modules, each bottleneck block, the pooling and the classifier)
compiled alone 56.9 ms, the same regions with inductor told to optimize every region's layout 36.8 ms, and with the
model's input channels-last 35.5 ms; eager 60.3 ms.

So every region of a model is compiled with the layout decision the compiler makes for all of the regions' convolutions
together (``regions_channels_last``; ``torch._inductor.config.force_layout_optimization`` where it is yes), which is
what it decides for the model compiled whole when the regions cover the model. The rule is the compiler's own
function, asked about a graph of just those convolutions; where it cannot be asked (a torch whose function takes other
arguments), each region keeps the compiler's own per-region decision. A region's outputs then stay channels-last
(``keep_output_stride=False``, ``memtune.profiler.compiled.budget_backend``), so the next region takes them as they
are. Models without convolutions (the language models) are untouched. The values are the same in either layout; only
strides, and the convolution algorithms the layout selects, differ, as they do in the model compiled whole.

The rule also turns down a graph with 300 or more nodes per convolution ("only a few conv"). Asked about the
convolutions alone, it cannot see that: a model with a few convolutions among many other operations compiled whole
keeps the default layout, while its regions run those convolutions channels-last. ViT-B/16's patch projection is one:
its region is that convolution alone, which the rule runs channels-last by itself too, so its regions ran so before
the regions shared a decision as well (``same_alone`` in ``benchmarks/module_peers.py`` keeps their profiles).

Torch names relied on, in torch 2.11 (the GPU image) and 2.13 (CI): ``torch._inductor.graph.GraphLowering.
decide_layout_opt(gm, *, is_inference)`` (a static method reading each convolution node's ``meta["val"]`` of its input
and weight and its last argument, the groups) and ``torch._inductor.config.force_layout_optimization``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["CONVOLUTIONS", "regions_channels_last"]

log = logging.getLogger(__name__)

#: the module classes whose calls are convolution nodes in a compiled graph
CONVOLUTIONS: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)


def _convolutions_graph(convs: list[Any]) -> torch.fx.GraphModule:
    """A graph of one ``aten.convolution`` node per module of ``convs``, with meta tensors of its input's channels and
    its weight's shape, as the compiler's layout rule reads them."""
    graph = torch.fx.Graph()
    for k, conv in enumerate(convs):
        weight = conv.weight
        dims = weight.dim() - 2
        channels = weight.shape[0] if conv.transposed else weight.shape[1] * conv.groups
        x = graph.placeholder(f"x{k}")
        x.meta["val"] = torch.empty((1, channels, *[1] * dims), device="meta")
        w = graph.placeholder(f"w{k}")
        w.meta["val"] = torch.empty(tuple(weight.shape), device="meta")
        args = (x, w, None, conv.stride, conv.padding, conv.dilation, conv.transposed, conv.output_padding,
                conv.groups)  # fmt: skip
        graph.call_function(torch.ops.aten.convolution.default, args)
    graph.output(None)
    return torch.fx.GraphModule(nn.Module(), graph)


def regions_channels_last(modules: Iterable[nn.Module]) -> bool:
    """Whether the compiler runs the convolutions of ``modules`` (the regions of a model, and everything inside them)
    channels-last when they are in one graph (NOTE [ Regions in the whole model's layout ]); False without any."""
    seen: dict[int, Any] = {}
    for module in modules:
        for m in module.modules():
            if isinstance(m, CONVOLUTIONS) and isinstance(getattr(m, "weight", None), torch.Tensor):
                seen.setdefault(id(m), m)
    if not seen:
        return False
    try:
        from torch._inductor.graph import GraphLowering

        return bool(GraphLowering.decide_layout_opt(_convolutions_graph(list(seen.values())), is_inference=False))
    except (AttributeError, TypeError, KeyError, IndexError) as exc:  # another torch: the compiler decides per region
        log.debug("the compiler's layout rule could not be asked (%s); each region decides its own layout", exc)
        return False
