"""Exported programs for the service tests: tiny models saved with ``torch.export``, and hostile archives.

Each hostile archive starts from a real ``torch.export.save`` archive and puts a payload where the stock loader
(``torch.export.load``, and ``.module()`` on what it returns) would run it: a pickle whose ``__reduce__`` calls
``os.system`` to create a marker file, Python source, or a sympy expression. The marker file's name is the
variant's name, so a test can tell which payload ran (NOTE [ Safe exported programs ] in ``memtune.profiler.exported``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shlex
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "HOSTILE_STOCK_RUNS",
    "Payload",
    "TinyNet",
    "TokenNet",
    "dead_nodes",
    "export_archive",
    "factory_call",
    "hostile_archives",
    "huge_parameter",
    "rewrite",
    "stack_trace_variant",
    "zip_bomb",
]

ROOT = "archive/"


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class TinyNet(nn.Module):
    """Two Linear+ReLU blocks in a ModuleList and a head: stages ``blocks.0``, ``blocks.1``, ``head``."""

    def __init__(self, width: int = 16, out: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(2)])
        self.head = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TokenNet(nn.Module):
    """Token ids in (an integer input), an embedding, two blocks, a head; with dropout (train mode matters)."""

    def __init__(self, vocab: int = 50, width: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(2)])
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.drop(x))


def export_archive(model: nn.Module, *inputs: torch.Tensor, train: bool = True) -> bytes:
    """``torch.export.export`` then ``torch.export.save``: the ``.pt2`` bytes a user would send."""
    model.train(train)
    ep = torch.export.export(model, tuple(inputs))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


def rewrite(
    archive: bytes,
    *,
    replace: dict[str, bytes | None] | None = None,
    program: Callable[[dict[str, Any]], None] | None = None,
    weights_config: Callable[[dict[str, Any]], None] | None = None,
    constants_config: Callable[[dict[str, Any]], None] | None = None,
) -> bytes:
    """``archive`` with members replaced (None: removed; a new name: added, relative to the root folder) and its
    program or payload configs edited in place by the callables."""
    replace = dict(replace or {})
    edits = {
        "models/model.json": program,
        "data/weights/model_weights_config.json": weights_config,
        "data/constants/model_constants_config.json": constants_config,
    }
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            name = info.filename.removeprefix(ROOT)
            data = src.read(info)
            if name in replace:
                new = replace.pop(name)
                if new is None:
                    continue
                data = new
            edit = edits.get(name)
            if edit is not None:
                doc = json.loads(data)
                edit(doc)
                data = json.dumps(doc).encode()
            dst.writestr(ROOT + name, data)
        for name, added in replace.items():
            if added is not None:
                dst.writestr(ROOT + name, added)
    return out.getvalue()


class Payload:
    """Unpickling this runs ``touch <marker>``: proof that a pickle from the request was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _pickle(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker), protocol=2)


def _torch_save_payload(base: bytes, marker: Path) -> bytes:
    """The archive's sample inputs (a ``torch.save`` zip) with its ``data.pkl`` replaced by the payload pickle."""
    with zipfile.ZipFile(io.BytesIO(base)) as zf:
        inner = zf.read(ROOT + "data/sample_inputs/model.pt")
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(inner)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = _pickle(marker) if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, data)
    return out.getvalue()


def zip_bomb(base: bytes, unpacked_bytes: int) -> bytes:
    """``base`` with one more weight record of ``unpacked_bytes`` zeros, deflated to a few kilobytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
        dst.writestr(ROOT + "data/weights/weight_99", bytes(unpacked_bytes), compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


def _first_weight(doc: dict[str, Any], path: str) -> None:
    """Mark the first payload of a config as pickled and point it at ``path``."""
    entry = next(iter(doc["config"].values()))
    entry["use_pickle"] = True
    entry["path_name"] = path


def _add_constant(doc: dict[str, Any], path: str) -> None:
    doc["config"]["evil"] = {"path_name": path, "is_param": False, "use_pickle": True, "tensor_meta": None}


def _python_guard(marker: Path) -> Callable[[dict[str, Any]], None]:
    code = f"__import__('os').system({f'touch {shlex.quote(str(marker))}'!r}) == 0"

    def edit(doc: dict[str, Any]) -> None:
        doc["guards_code"] = [code]

    return edit


def _sympy_size(marker: Path) -> Callable[[dict[str, Any]], None]:
    expr = f"__import__('os').system({f'touch {shlex.quote(str(marker))}'!r})"

    def edit(doc: dict[str, Any]) -> None:
        values = doc["graph_module"]["graph"]["tensor_values"]
        first = next(iter(values.values()))
        first["sizes"][0] = {"as_expr": {"expr_str": expr, "hint": {"as_int": 16}}}

    return edit


def _os_target(marker: Path) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        node = doc["graph_module"]["graph"]["nodes"][0]
        node["target"] = "torch.serialization.os.system"
        node["inputs"] = [{"name": "command", "arg": {"as_string": f"touch {shlex.quote(str(marker))}"}, "kind": 1}]

    return edit


def _evil_fqn(marker: Path) -> str:
    """A parameter name that closes the string FX puts it in (``getattr(self, "…")``) and runs code as getattr's
    default; no dots, since FX splits the name on them."""
    code = tuple(f"import os; os.system({f'touch {shlex.quote(str(marker))}'!r})".encode())
    return f'blocks",exec(bytes({code})))or getattr(self,"blocks'


def _fqn_program(marker: Path) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        spec = doc["graph_module"]["signature"]["input_specs"][0]
        spec["parameter"]["parameter_name"] = _evil_fqn(marker)

    return edit


def _fqn_weights(marker: Path) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        config = doc["config"]
        first = next(iter(config))
        config[_evil_fqn(marker)] = config.pop(first)

    return edit


def _stack_trace(marker: Path) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for node in doc["graph_module"]["graph"]["nodes"]:
            node["metadata"]["stack_trace"] = (
                f'File "x.py", line 1, in f\n    y\r__import__("os").system("touch {marker}")\n'
            )

    return edit


HOSTILE_STOCK_RUNS = (
    "weight_pickle",
    "constant_pickle",
    "opaque_object",
    "legacy_weights",
    "legacy_constants",
    "sample_inputs",
    "sample_inputs_zip",
    "guards_code",
    "sympy_expression",
    "fqn_injection",
)
"""Variants whose payload the stock loader runs: ``torch.export.load(f)``, then ``.module()`` called on an input
(the control test shows it in a subprocess)."""


def hostile_archives(base: bytes, markers: Path) -> dict[str, bytes]:
    """Hostile variants of ``base`` (a ``torch.export.save`` archive), by name; each variant's payload would create
    ``markers / <name>``."""

    def pkl(name: str) -> bytes:
        return _pickle(markers / name)

    return {
        # tensors and objects that torch.export.load unpickles with weights_only=False or pickle.loads
        "weight_pickle": rewrite(
            base,
            replace={"data/weights/weight_0": pkl("weight_pickle")},
            weights_config=lambda d: _first_weight(d, "weight_0"),
        ),
        "constant_pickle": rewrite(
            base,
            replace={"data/constants/tensor_0": pkl("constant_pickle")},
            constants_config=lambda d: _add_constant(d, "tensor_0"),
        ),
        "opaque_object": rewrite(
            base,
            replace={"data/constants/opaque_obj_0": pkl("opaque_object")},
            constants_config=lambda d: _add_constant(d, "opaque_obj_0"),
        ),
        "custom_object": rewrite(
            base,
            replace={"data/constants/custom_obj_0": pkl("custom_object")},
            constants_config=lambda d: _add_constant(d, "custom_obj_0"),
        ),
        # the older layouts torch still reads: one pickled file for all weights or all constants
        "legacy_weights": rewrite(base, replace={"data/weights/model.pt": pkl("legacy_weights")}),
        "legacy_constants": rewrite(base, replace={"data/constants/model.pt": pkl("legacy_constants")}),
        # torch.load(weights_only=True) fails on these, then torch retries with weights_only=False
        "sample_inputs": rewrite(base, replace={"data/sample_inputs/model.pt": pkl("sample_inputs")}),
        "sample_inputs_zip": rewrite(
            base, replace={"data/sample_inputs/model.pt": _torch_save_payload(base, markers / "sample_inputs_zip")}
        ),
        # members nothing should read, named like pickles or native code
        "extra_pickle": rewrite(base, replace={"extra/payload.pkl": pkl("extra_pickle")}),
        "aoti_library": rewrite(base, replace={"data/aotinductor/model/model.so": b"\x7fELF" + bytes(60)}),
        # code in the program itself: Python guards (exec by .module()), sympy expressions (eval by sympify),
        # a call target outside torch.ops, a parameter name that breaks out of generated code, a stack trace
        # with a carriage return in it (FX copies stack traces into generated code as comments)
        "guards_code": rewrite(base, program=_python_guard(markers / "guards_code")),
        "sympy_expression": rewrite(base, program=_sympy_size(markers / "sympy_expression")),
        "os_target": rewrite(base, program=_os_target(markers / "os_target")),
        "fqn_injection": rewrite(
            base,
            program=_fqn_program(markers / "fqn_injection"),
            weights_config=_fqn_weights(markers / "fqn_injection"),
        ),
    }


def stack_trace_variant(base: bytes, markers: Path) -> bytes:
    """``base`` with a carriage return and code in every node's stack trace (dropped by the canonical form)."""
    return rewrite(base, program=_stack_trace(markers / "stack_trace"))


def dead_nodes(base: bytes, n: int) -> bytes:
    """``base`` with ``n`` more ReLU calls on the first block's linear output, each unused (NOTE [ Upload limits ]:
    within the node limit, but slow to check)."""

    def edit(doc: dict[str, Any]) -> None:
        graph = doc["graph_module"]["graph"]
        meta = graph["tensor_values"]["linear"]
        for k in range(n):
            graph["tensor_values"][f"dead_{k}"] = meta
            graph["nodes"].append(
                {
                    "target": "torch.ops.aten.relu.default",
                    "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "linear"}}, "kind": 1}],
                    "outputs": [{"as_tensor": {"name": f"dead_{k}"}}],
                    "metadata": {},
                    "is_hop_single_tensor_return": None,
                }
            )

    return rewrite(base, program=edit)


def _sized(meta: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    strides = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        strides[i] = strides[i + 1] * sizes[i + 1]
    return dict(meta, sizes=[{"as_int": v} for v in sizes], strides=[{"as_int": v} for v in strides])


def huge_parameter(base: bytes, sizes: list[int]) -> bytes:
    """``base`` whose parameter ``blocks.0.fc.weight`` is declared of ``sizes`` with its record emptied (as a
    dropped parameter's is): a small archive whose tensor torch.export.load would make at full size."""

    def program(doc: dict[str, Any]) -> None:
        values = doc["graph_module"]["graph"]["tensor_values"]
        values["p_blocks_0_fc_weight"] = _sized(values["p_blocks_0_fc_weight"], sizes)

    def weights(doc: dict[str, Any]) -> None:
        entry = doc["config"]["blocks.0.fc.weight"]
        entry["tensor_meta"] = _sized(entry["tensor_meta"], sizes)

    return rewrite(base, replace={"data/weights/weight_0": b""}, program=program, weights_config=weights)


def factory_call(base: bytes, numel: int, *, declared: int | None = None) -> bytes:
    """``base`` with a dead call ``torch.ones(numel)`` (``aten.ones.default``, float32) named ``big``, its output
    declared of ``declared`` elements (default: ``numel``; a smaller number is metadata that lies)."""

    def edit(doc: dict[str, Any]) -> None:
        graph = doc["graph_module"]["graph"]
        graph["tensor_values"]["big"] = _sized(
            graph["tensor_values"]["linear"], [numel if declared is None else declared]
        )
        graph["nodes"].append(
            {
                "target": "torch.ops.aten.ones.default",
                "inputs": [
                    {"name": "size", "arg": {"as_ints": [numel]}, "kind": 1},
                    {"name": "device", "arg": {"as_device": {"type": "cpu", "index": None}}, "kind": 2},
                    {"name": "pin_memory", "arg": {"as_bool": False}, "kind": 2},
                ],
                "outputs": [{"as_tensor": {"name": "big"}}],
                "metadata": {},
                "is_hop_single_tensor_return": None,
                "name": "big",
            }
        )

    return rewrite(base, program=edit)
