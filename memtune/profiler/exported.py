"""Exported programs: a ``torch.export`` archive (``.pt2``) checked, reduced to a canonical form, and loaded as the
module hierarchy that ``profile_module`` stages, without running code from the archive.

``check_exported`` reads the archive's bytes itself, refuses what could run code (NOTE [ Safe exported programs ])
and returns a ``CheckedProgram``: the canonical archive (the graph, every tensor's shape, the buffers' and
constants' values; the parameters' values are dropped), its structural digest and the program's inputs.
``load_exported`` hands the canonical archive, and nothing else, to ``torch.export.load``, checks the graph it gets
back, and returns ``torch.export.unflatten`` of it (the model's submodules again, each called through its forward,
so NOTE [ Module stages ] in ``memtune.profiler.module_stages`` finds the repeated blocks) with random inputs of the
program's shapes. Parameters are drawn from N(0, 0.02): where every shape is static, memory does not depend on the
values, and time barely does.

Exporting for memtune::

    model.train()  # the training graph: dropout and batch norm as in a training step
    ep = torch.export.export(model, (x,))  # static shapes: x's first dimension is the batch
    torch.export.save(ep, "model.pt2")

# NOTE [ Safe exported programs ]
``torch.export.load`` is documented as unsafe for untrusted files ("uses pickle under the hood"). Reading
``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``, ``torch/export/_unlift.py`` and
``torch/fx/graph.py`` (torch 2.13) shows where code from the archive runs; the service tests build each case and
show the stock loader (``torch.export.load(f).module()(x)``) running the payload:

1. ``data/weights/weight_N`` or ``data/constants/tensor_N`` whose config entry says ``use_pickle``:
   ``torch.load(..., weights_only=False)`` (``_load_state_dict``, ``_load_constants``).
2. ``data/constants/opaque_obj_N``: ``pickle.loads``; ``custom_obj_N``: the TorchScript unpickler.
3. The older layout ``data/weights/model.pt`` / ``data/constants/model.pt``, and ``data/sample_inputs/model.pt``:
   ``deserialize_torch_artifact`` tries ``torch.load(weights_only=True)`` and on failure retries with
   ``weights_only=False``. The 2.7 layout (``serialized_*.pt`` at the root) goes the same way.
4. ``data/aotinductor/…``: a compiled shared library, loaded (``_load_aoti``).
5. The program JSON: ``guards_code`` is Python source that ``ExportedProgram.module()`` compiles with ``exec`` and
   runs on every call; a symbolic size (``as_expr``) goes through ``sympy.sympify``, which evaluates it as Python;
   parameter, buffer and module names are pasted unescaped into the source FX generates (``getattr(self, "…")``),
   and stack traces into its comments (where a carriage return ends the comment); a node's target is looked up by
   attribute under ``torch``, ``math`` and ``operator`` (``torch.serialization.os.system`` resolves) and a callable
   one is kept.

So memtune never gives ``torch.export.load`` the request's archive. ``check_exported`` reads every member with
``zipfile`` (``memtune.profiler._exported_checks``): only the members ``torch.export.save`` writes for one plain program
may be there (a pickled object, a legacy pickle, an extra file or compiled code is refused by name); weights and
constants must be raw bytes (``use_pickle`` false), each view checked against the bytes present; the sample inputs
must be a ``torch.save`` archive whose pickle names only tensor-rebuilding globals (decoded with
``pickletools.genops``, which runs nothing), and are then dropped. The program JSON is checked field by field
against the schema: no guards, range constraints or symbolic values (static shapes only), no subgraphs, script
objects, effect tokens or operator arguments; every target an ATen or prims operator overload (or
``operator.getitem``) that exists here and takes no file name; every name an identifier and every qualified name a
dotted path of them; strings short and plain. Node metadata is rebuilt from ``nn_module_stack`` alone (what
``unflatten`` needs), so no stack trace reaches generated code. The canonical archive is written from the checked
values: raw tensor records, the checked JSON, and sample inputs memtune makes (zero tensors of the input shapes,
saved with ``torch.save``: the only pickle ``torch.export.load`` then reads, which ``weights_only=True`` accepts at
once). ``load_exported`` checks whatever it is given (the stored canonical archive too) and the graph
``torch.export.load`` returns, before unflattening it.

What is left is the program's own math: ATen operators on tensors of declared, static shapes. A program can still
be slow or ask for much memory. Its largest tensor (``CheckedProgram.max_tensor_bytes``: parameters, buffers and
constants, every node's declared output, and the sizes factory calls such as ``aten.ones`` ask for) is checked
against a GPU's memory (``max_tensor_bytes``; the service passes the GPU type's, NOTE [ Upload limits ] in
``memtune.profiler._exported_checks``); the rest is bounded by the job's failure path and the worker host's limits, not
by a sandbox.

The digest keys the stored model: SHA-256 of the canonical program JSON (``torch_version`` left out), the weight
and constant configs (names, shapes, strides, dtypes, ``requires_grad``; not the values) and the integer inputs'
ranges. The same model exported twice, with other weights or on another machine, has one digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memtune.profiler._exported_checks import (
    CONSTANT_RECORD,
    CONSTANTS_CONFIG,
    FLOATS,
    PROGRAM,
    SAMPLE_INPUTS,
    WEIGHT_RECORD,
    WEIGHTS_CONFIG,
    Payload,
    TensorSize,
    check_graph,
    check_payloads,
    check_program,
    largest_tensor,
    member_json,
    member_text,
    read_members,
    scan_sample_inputs,
)
from memtune.profiler.module_stages import mark_exported_classes
from memtune.profiler.profiler_errors import ArchiveTooLargeError, ExportedError, TensorTooLargeError

__all__ = [
    "PARAM_STD",
    "ArchiveTooLargeError",
    "CheckedProgram",
    "ExportedError",
    "ExportedInput",
    "TensorTooLargeError",
    "check_exported",
    "example_inputs",
    "load_exported",
]

PARAM_STD = 0.02
"""Standard deviation of the normal distribution parameters are drawn from (their values are not kept)."""

_ROOT = "archive"


@dataclass(frozen=True)
class ExportedInput:
    """One tensor input of an exported program: its name, shape, dtype, and for integer inputs the exclusive upper
    bound of the values drawn for it (``high``: the rows of an embedding it indexes, or the request's ``int_high``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    high: int | None = None


@dataclass(frozen=True)
class CheckedProgram:
    """An exported program that passed NOTE [ Safe exported programs ], in canonical form.

    Attributes:
        archive: the canonical ``.pt2`` archive (what is stored; ``check_exported`` accepts it as it is).
        digest: SHA-256 (hex) of the program's structure, the tensors' values left out: the stored model's key.
        inputs: the program's tensor inputs, in order; the first one's first dimension is the batch.
        n_nodes: operator calls in the graph.
        n_parameters: parameter tensors; ``parameter_bytes`` their size.
        buffer_bytes: bytes of buffers and tensor constants (their values are kept).
        max_tensor_bytes: the largest tensor the program holds or makes, bytes (NOTE [ Upload limits ] in
            ``memtune.profiler._exported_checks``); ``largest_tensor`` says which.
        torch_version: the torch that exported it.
        largest_tensor: that tensor, or None for a program without tensors.
    """

    archive: bytes
    digest: str
    inputs: tuple[ExportedInput, ...]
    n_nodes: int
    n_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    max_tensor_bytes: int
    torch_version: str
    largest_tensor: TensorSize | None = None

    @property
    def batch(self) -> int:
        return self.inputs[0].shape[0]

    def summary(self) -> dict[str, Any]:
        """The facts a stored model shows, as JSON."""
        return {
            "batch": self.batch,
            "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype, "high": i.high} for i in self.inputs],
            "n_nodes": self.n_nodes,
            "n_parameters": self.n_parameters,
            "parameter_bytes": self.parameter_bytes,
            "buffer_bytes": self.buffer_bytes,
            "max_tensor_bytes": self.max_tensor_bytes,
            "largest_tensor": None if self.largest_tensor is None else self.largest_tensor.describe(),
            "largest_tensor_name": None if self.largest_tensor is None else self.largest_tensor.name,
            "archive_bytes": len(self.archive),
            "torch_version": self.torch_version,
        }


def check_exported(
    data: bytes,
    *,
    max_bytes: int,
    int_high: int | None = None,
    max_tensor_bytes: int | None = None,
    memory_of: str = "",
) -> CheckedProgram:
    """Check a ``.pt2`` archive without running anything from it, and reduce it to its canonical form.

    The archive is read with ``zipfile``, ``json`` and ``pickletools`` only (NOTE [ Safe exported programs ]):
    nothing is deserialized by torch, and no tensor is allocated but the canonical sample inputs' (one element
    each). Cheap enough for a request handler.

    Args:
        data: the archive's bytes, as ``torch.export.save`` wrote them (or a canonical archive).
        max_bytes: the most bytes the archive may have, and may unpack to.
        int_high: for integer inputs that index no embedding, the exclusive upper bound of their values (a
            vocabulary size); an embedding's rows bound the inputs that index it.
        max_tensor_bytes: the most bytes any one tensor the program holds or makes may take (a GPU's memory); None
            for no limit.
        memory_of: whose memory ``max_tensor_bytes`` is, for the error (``"the h200's memory"``).

    Returns:
        The ``CheckedProgram``: canonical archive, structural digest, inputs.

    Raises:
        ExportedError: naming the member (and field or node) that is refused, and why.
        ArchiveTooLargeError: the archive, or what it unpacks to, exceeds ``max_bytes``.
        TensorTooLargeError: a parameter, buffer, constant, node output or factory call's tensor is over
            ``max_tensor_bytes``; names it, its bytes and the limit.
    """
    from torch.export.pt2_archive.constants import ARCHIVE_VERSION_VALUE

    members = read_members(data, max_bytes)
    member_text(members, "archive_format", "pt2")
    member_text(members, "archive_version", re.escape(ARCHIVE_VERSION_VALUE))
    version = member_text(members, ".data/version", r"[0-9]{1,4}\n?")
    if "byteorder" in members:
        member_text(members, "byteorder", "little")
    if SAMPLE_INPUTS in members:
        scan_sample_inputs(members[SAMPLE_INPUTS])
    program = check_program(member_json(members, PROGRAM))
    weights_doc, weights = check_payloads(members, WEIGHTS_CONFIG, WEIGHT_RECORD)
    constants_doc, constants = check_payloads(members, CONSTANTS_CONFIG, CONSTANT_RECORD)
    _match_state(program.state, weights, constants)
    inputs = tuple(_input(name, meta, program.highs.get(name), int_high) for name, meta in program.inputs)
    held = [
        TensorSize(p.fqn, "parameter" if p.is_param else kind, p.meta, config)
        for payloads, kind, config in ((weights, "buffer", WEIGHTS_CONFIG), (constants, "constant", CONSTANTS_CONFIG))
        for p in payloads
    ]
    largest = largest_tensor([*held, *program.tensors], max_tensor_bytes, memory_of)

    structure = {
        "program": {k: v for k, v in program.canonical.items() if k != "torch_version"},
        "weights": {p.fqn: [p.path, p.is_param, p.raw_meta] for p in weights},
        "constants": {p.fqn: [p.path, p.raw_meta] for p in constants},
        "inputs": [[i.name, i.high] for i in inputs],
    }
    params = [p for p in weights if p.is_param]
    return CheckedProgram(
        archive=_write_archive(
            program.canonical, weights_doc, constants_doc, _records(members, weights, constants), inputs, version
        ),
        digest=hashlib.sha256(_canonical_json(structure).encode()).hexdigest(),
        inputs=inputs,
        n_nodes=program.n_nodes,
        n_parameters=len(params),
        parameter_bytes=sum(p.meta.nbytes for p in params),
        buffer_bytes=sum(p.meta.nbytes for p in (*weights, *constants) if not p.is_param),
        max_tensor_bytes=largest.nbytes if largest is not None else 0,
        torch_version=program.torch_version,
        largest_tensor=largest,
    )


def _canonical_json(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _match_state(state: Mapping[str, str], weights: list[Payload], constants: list[Payload]) -> None:
    """Every tensor the archive holds is one the program names, and every one it names is there, as a parameter
    when it is one (a non-persistent buffer lives with the constants)."""
    held = {p.fqn: p for p in weights} | {p.fqn: p for p in constants}
    for fqn in held.keys() - state.keys():
        raise ExportedError("no input spec of the program names this tensor", member=WEIGHTS_CONFIG, field=fqn)
    for fqn, kind in state.items():
        p = held.get(fqn)
        if p is None or p.is_param != (kind == "parameter"):
            raise ExportedError(
                f"the program's {kind} has no such tensor in the archive", member=WEIGHTS_CONFIG, field=fqn
            )
        if p.is_param and p.meta.dtype not in FLOATS:
            raise ExportedError(
                f"a parameter of dtype {p.meta.dtype}; parameters must be floating point",
                member=WEIGHTS_CONFIG,
                field=fqn,
            )


def _input(name: str, meta: Any, embedding_rows: int | None, int_high: int | None) -> ExportedInput:
    if meta.dtype in FLOATS or meta.dtype == "bool":
        return ExportedInput(name, meta.sizes, meta.dtype)
    bounds = [b for b in (embedding_rows, int_high) if b is not None]
    if not bounds:
        raise ExportedError(
            f"input {name!r} holds integers ({meta.dtype}, shape {list(meta.sizes)}) that index no embedding: give "
            "int_high, the exclusive upper bound of its values (e.g. the vocabulary size)",
            field="int_high",
        )
    if min(bounds) < 1:
        raise ExportedError("int_high must be at least 1", field="int_high")
    return ExportedInput(name, meta.sizes, meta.dtype, min(bounds))


def _records(members: Mapping[str, bytes], weights: list[Payload], constants: list[Payload]) -> dict[str, bytes]:
    """The raw tensor records to keep. A record only parameters view is emptied: ``torch.export.load`` makes zeros
    of its first view's shape, which every view of it fits (``check_payloads`` checked that)."""
    params_only: dict[str, bool] = {}
    for p in weights:
        params_only[p.path] = params_only.get(p.path, True) and p.is_param
    out = {
        f"data/weights/{path}": b"" if only else members[f"data/weights/{path}"] for path, only in params_only.items()
    }
    out.update({f"data/constants/{p.path}": members[f"data/constants/{p.path}"] for p in constants})
    return out


def _write_archive(
    program: dict[str, Any],
    weights_doc: dict[str, Any],
    constants_doc: dict[str, Any],
    records: Mapping[str, bytes],
    inputs: tuple[ExportedInput, ...],
    version: str,
) -> bytes:
    """The canonical archive, every member written from checked values, in a fixed order."""
    samples = tuple(torch.zeros((), dtype=getattr(torch, i.dtype)).expand(i.shape) for i in inputs)
    buf = io.BytesIO()
    torch.save((samples, {}), buf)  # memtune's own tensors: the one pickle torch.export.load reads
    members = {
        "archive_format": b"pt2",
        "archive_version": b"0",
        ".data/version": version.encode(),
        "byteorder": b"little",
        PROGRAM: _canonical_json(program).encode(),
        WEIGHTS_CONFIG: _canonical_json(weights_doc).encode(),
        CONSTANTS_CONFIG: _canonical_json(constants_doc).encode(),
        SAMPLE_INPUTS: buf.getvalue(),
        **dict(sorted(records.items())),
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for name, blob in members.items():
            zf.writestr(zipfile.ZipInfo(f"{_ROOT}/{name}", date_time=(1980, 1, 1, 0, 0, 0)), blob)
    return out.getvalue()


# ---- loading ---------------------------------------------------------------------------------------------------


@contextmanager
def _quiet() -> Iterator[None]:
    """torch.export's deprecation warnings and log lines concern its own internals, not the user's program."""
    logger = logging.getLogger("torch.export")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _retarget(ep: Any, device: torch.device) -> None:
    """Factory calls the export baked a device into (``arange(..., device=cpu)``) make their tensors on ``device``."""
    for node in ep.graph_module.graph.nodes:
        if isinstance(node.kwargs.get("device"), torch.device) and node.kwargs["device"] != device:
            node.update_kwarg("device", device)
    ep.graph_module.recompile()


def example_inputs(
    inputs: tuple[ExportedInput, ...], *, device: str | torch.device = "cpu", seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Random tensors of the inputs' shapes and dtypes (floats from N(0, 1), integers from ``[0, high)``, booleans
    fair coins), reproducible for a seed."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in inputs:
        dtype = getattr(torch, i.dtype)
        if dtype.is_floating_point:
            t = torch.randn(i.shape, generator=gen).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, i.shape, generator=gen).bool()
        else:
            t = torch.randint(0, i.high or 1, i.shape, generator=gen, dtype=dtype)
        out.append(t.to(device))
    return tuple(out)


def _exported_classes(ep: Any) -> dict[str, str]:
    """Qualified module name → the qualified name of its class, for every module the program called (its nodes'
    ``nn_module_stack``; text from the archive, only ever compared): what ``mark_exported_classes`` records."""
    classes: dict[str, str] = {}
    for node in ep.graph.nodes:
        for path, cls in (node.meta.get("nn_module_stack") or {}).values():
            classes.setdefault(str(path), str(cls))
    return classes


def load_exported(
    data: bytes,
    *,
    max_bytes: int,
    int_high: int | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Load a ``.pt2`` archive as a module hierarchy to profile, with random example inputs for it.

    The archive is checked and reduced by ``check_exported``; only its canonical form reaches ``torch.export.load``
    (NOTE [ Safe exported programs ]), and the graph torch returns is checked again. The program is unflattened
    (``torch.export.unflatten``): each submodule of the exported model is a module again, called through its
    forward, so ``memtune.profiler.module_profile.profile_module`` stages it like the original model. Parameters are
    drawn from N(0, ``PARAM_STD``) (seeded); buffers and constants keep the archive's values.

    Example::

        model, inputs = load_exported(Path("model.pt2").read_bytes(), max_bytes=1 << 30)
        profile = profile_module(model, inputs, gpu="h200")

    Args:
        data: the archive's bytes.
        max_bytes: the most bytes the archive may have, and may unpack to.
        int_high: as for ``check_exported``.
        device: where the module and the inputs are put (factory calls baked to another device follow).
        seed: seeds the parameters and the inputs.

    Returns:
        ``(module, inputs)``: the unflattened module in training mode, and a tuple of input tensors.

    Raises:
        ExportedError: the archive is refused, or torch cannot read the program.
    """
    checked = check_exported(data, max_bytes=max_bytes, int_high=int_high)
    dev = torch.device(device)
    with _quiet():
        try:
            ep = torch.export.load(io.BytesIO(checked.archive))
        except Exception as e:  # a checked program torch still cannot read (an operator's schema changed …)
            raise ExportedError(f"torch {torch.__version__} could not read the program: {type(e).__name__}: {e}") from e
        check_graph(ep.graph)
        if dev.type != "cpu":
            _retarget(ep, dev)
        module = torch.export.unflatten(ep)
        mark_exported_classes(module, _exported_classes(ep))  # NOTE [ Module stages ]: staged as the original
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * PARAM_STD)
    module.to(dev).train()
    return module, example_inputs(checked.inputs, device=dev, seed=seed + 1)
