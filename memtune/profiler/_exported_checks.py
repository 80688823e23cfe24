"""What a ``.pt2`` archive may hold, checked without running anything from it (NOTE [ Safe exported programs ] in
``memtune.profiler.exported``): its members, the one pickle ``torch.export.save`` writes (decoded, never loaded), the
weight and constant configs (``memtune.profiler._exported_members`` and ``memtune.profiler._exported_tensors``, whose
names are re-exported here), and the program JSON, field by field against torch's program schema."""

from __future__ import annotations

import dataclasses
import json
import operator
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch._export.serde.schema import SCHEMA_VERSION

from memtune.profiler._exported_members import (
    CONSTANT_RECORD,
    CONSTANTS_CONFIG,
    PROGRAM,
    SAMPLE_INPUTS,
    WEIGHT_RECORD,
    WEIGHTS_CONFIG,
    _bad,
    member_json,
    member_text,
    read_members,
    scan_sample_inputs,
)
from memtune.profiler._exported_tensors import (
    _DEVICES,
    _STATIC,
    _WHY_NOT,
    FLOATS,
    Payload,
    TensorMeta,
    TensorSize,
    _fields,
    _fqn,
    _int,
    check_payloads,
    largest_tensor,
    tensor_meta,
)
from memtune.profiler.profiler_errors import ExportedError

__all__ = [
    "CONSTANTS_CONFIG",
    "CONSTANT_RECORD",
    "FLOATS",
    "PROGRAM",
    "SAMPLE_INPUTS",
    "WEIGHTS_CONFIG",
    "WEIGHT_RECORD",
    "Payload",
    "Program",
    "TensorMeta",
    "TensorSize",
    "check_graph",
    "check_payloads",
    "check_program",
    "largest_tensor",
    "member_json",
    "member_text",
    "read_members",
    "scan_sample_inputs",
    "tensor_meta",
]

# NOTE [ Upload limits ]: what a hostile archive may not do besides what its bytes cost. A 250 KB archive whose one
# deflated member unpacked to 240 MiB was stored inflated (four at once took the API from 764 to 2,280 MB), and
# 100,000 empty members or a program of 300,000 dead nodes were accepted (the nodes held a check for 55.9 s).
# torch.export.save stores every member uncompressed, so only a re-packed archive has deflated members, and a
# program JSON deflates some 10-30x; a model's graph has some thousands of operator calls (ResNet-50's training
# graph ~1,700, a 48-layer transformer's ~10,000). Within these limits a check can still take long (20,000 dead
# nodes: some 5 s; 100,000: some 25 s on two busy cores), so the service checks an upload in a child process it kills
# past MEMTUNE_MAX_EXPORTED_CHECK_S (``memtune.api.service._exported_upload``). And a small archive can declare a tensor
# no GPU holds: a parameter whose record is empty (torch.export.load makes zeros of its declared shape), or a call such
# as ``torch.ones(2**32)`` (``aten.ones.default`` with ``size`` [4294967296], 16 GiB): every tensor the program holds or
# makes (``TensorSize``: parameters, buffers, constants, every node's declared output, and the size a call that
# allocates (no view) is given, whatever its output's metadata says) is checked against the GPU type's memory, at
# upload (the ``gpu`` asked for, else the largest GPU type known) and again when a job names its GPU type. Shapes are
# taken as declared: a view's sizes and what a later call makes of them are not propagated.
_MAX_NODES = 100_000
_MAX_INT = 1 << 62

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}\Z")
_STACK_KEY = re.compile(r"[A-Za-z0-9_.]{1,500}\Z")
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.<>]{0,499}\Z")
_PLAIN = re.compile(r"[A-Za-z0-9_ ,.+\-*>()\[\]]{0,200}\Z")  # einsum equations, reduction and rounding modes …
_VERSION = re.compile(r"[A-Za-z0-9_.+\-]{0,64}\Z")
_TARGET = re.compile(r"torch\.ops\.(aten|prims)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\Z")
_GETITEM = "_operator.getitem"


_ARGUMENTS = frozenset({
    "as_none", "as_tensor", "as_tensors", "as_int", "as_ints", "as_float", "as_floats", "as_string", "as_strings",
    "as_scalar_type", "as_memory_format", "as_layout", "as_device", "as_bool", "as_bools", "as_optional_tensors",
    "as_optional_tensor", "as_int_lists", "as_float_lists",
})  # fmt: skip
_EVAL_MODE = {  # target -> the argument that is False when the program was exported in eval mode
    "torch.ops.aten.dropout.default": "train",
    "torch.ops.aten.native_dropout.default": "train",
    "torch.ops.aten.feature_dropout.default": "train",
    "torch.ops.aten.alpha_dropout.default": "train",
    "torch.ops.aten.batch_norm.default": "training",
    "torch.ops.aten.instance_norm.default": "use_input_stats",
}
_EVAL_ONLY = frozenset({"torch.ops.aten._native_batch_norm_legit_no_training.default"})


# ---- the program ----------------------------------------------------------------------------------------------


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > 1_000_000:
        raise _bad("expected a list", where)
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise _bad(f"{str(value)[:80]!r} is not an identifier", where)
    return value


def _empty(value: Any, where: str, why: str) -> None:
    if value not in ({}, [], None):
        raise _bad(why, where)


@dataclass
class _Graph:
    """What the node checks learn on the way: tensors' metadata, and integer inputs' bounds from embeddings."""

    tensors: dict[str, TensorMeta]
    highs: dict[str, int]
    #: tensor name -> (node, operator) of the node that makes it
    made_by: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    #: tensors of the sizes that factory calls ask for (``aten.ones.default``'s ``size``), whatever the metadata says
    created: list[TensorSize] = dataclasses.field(default_factory=list)


def _tensor(ref: Any, where: str, g: _Graph) -> str:
    name = _name(_fields(ref, {"name"}, where)["name"], where)
    if name not in g.tensors:
        raise _bad(f"tensor {name!r} has no metadata in tensor_values", where)
    return name


def _argument(arg: Any, where: str, g: _Graph) -> None:
    """A ``schema.Argument``: one field, of a kind memtune accepts, its value checked."""
    if not isinstance(arg, dict) or len(arg) != 1:
        raise _bad("an argument must have exactly one field", where)
    ((kind, value),) = arg.items()
    if kind not in _ARGUMENTS:
        why = _WHY_NOT.get(kind) or ("a symbolic value; " + _STATIC if kind.startswith("as_sym") else "not supported")
        raise _bad(f"argument of kind {kind}: {why}", where)
    if kind == "as_tensor":
        _tensor(value, where, g)
    elif kind == "as_tensors":
        for v in _list(value, where):
            _tensor(v, where, g)
    elif kind in ("as_optional_tensors", "as_optional_tensor"):
        for v in _list(value, where) if kind == "as_optional_tensors" else [value]:
            if len(_fields(v, {"as_tensor", "as_none"}, where, optional={"as_tensor", "as_none"})) != 1:
                raise _bad("an optional tensor must have exactly one field", where)
            if "as_tensor" in v:
                _tensor(v["as_tensor"], where, g)
    elif kind in ("as_string", "as_strings"):
        for v in _list(value, where) if kind == "as_strings" else [value]:
            if not isinstance(v, str) or not _PLAIN.match(v):
                raise _bad(f"string argument {str(v)[:80]!r} is not a short plain string", where)
    elif kind == "as_device":
        dev = _fields(value, {"type", "index"}, where)
        if dev["type"] not in _DEVICES or not (dev["index"] is None or type(dev["index"]) is int):
            raise _bad(f"device {str(dev)[:60]} is not cpu or cuda", where)
    elif kind in ("as_int", "as_ints", "as_int_lists", "as_scalar_type", "as_memory_format", "as_layout"):
        for v in value if isinstance(value, list) else [value]:
            for x in v if kind == "as_int_lists" else [v]:
                _int(x, where, lo=-_MAX_INT, hi=_MAX_INT)
    elif kind != "as_none":  # floats and booleans
        for v in value if isinstance(value, list) else [value]:
            for x in v if isinstance(v, list) else [v]:
                if not isinstance(x, (int, float)) and x not in ("Infinity", "-Infinity", "NaN"):
                    raise _bad(f"expected a number, got {str(x)[:40]!r}", where)


def _operator(target: Any, where: str) -> torch._ops.OpOverload | None:
    """An ATen or prims operator overload that exists here and touches no file, or ``operator.getitem`` (None):
    looked up by attribute under ``torch.ops`` (nothing is called)."""
    if target == _GETITEM:
        return None
    match = _TARGET.match(target) if isinstance(target, str) else None
    if not match:
        raise _bad(
            f"target {str(target)[:100]!r} is not an ATen or prims operator (torch.ops.aten.<op>.<overload>); "
            "higher-order operators (torch.cond, torch.no_grad() regions …), custom operators and Python callables "
            "are not accepted",
            where,
        )
    namespace, op, overload = match.groups()
    try:
        resolved = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except Exception:  # an unknown name: torch raises AttributeError or RuntimeError
        resolved = None
    if not isinstance(resolved, torch._ops.OpOverload):
        raise _bad(f"operator {target!r} does not exist in this server's torch {torch.__version__}", where)
    if any(a.name == "filename" for a in resolved._schema.arguments):
        raise _bad(f"operator {target!r} reads or writes files", where)
    return resolved


def _module_stack(text: Any, where: str) -> str:
    """``nn_module_stack`` metadata ("key,path,type;…"), each part checked."""
    if not isinstance(text, str) or len(text) > 20_000:
        raise _bad("nn_module_stack must be a string", where)
    for entry in text.split(";") if text else []:
        parts = entry.split(",")
        if len(parts) != 3 or not _STACK_KEY.match(parts[0]) or not _TYPE_NAME.match(parts[2]):
            raise _bad(f"nn_module_stack entry {entry[:80]!r} is not key,module path,type name", where)
        _fqn(parts[1], f"module path (node {where})", root=True)
    return text


def _nodes(nodes: Any, g: _Graph) -> list[dict[str, Any]]:
    """The graph's nodes checked; canonical copies whose metadata is ``nn_module_stack`` alone."""
    out = []
    listed = _list(nodes, "graph.nodes")
    if len(listed) > _MAX_NODES:
        raise _bad(f"the graph has {len(listed)} nodes, over the limit of {_MAX_NODES} (NOTE [ Upload limits ])")
    for k, node in enumerate(listed):
        _fields(
            node,
            {"target", "inputs", "outputs", "metadata", "is_hop_single_tensor_return", "name"},
            f"node {k}",
            optional={"is_hop_single_tensor_return", "name"},
        )
        where = _name(node.get("name") or f"node_{k}", f"node {k}")
        target = node["target"]
        op = _operator(target, where)
        if target in _EVAL_ONLY:
            raise _eval_mode(where, target)
        named: dict[str, Any] = {}
        for arg in _list(node["inputs"], where):
            _fields(arg, {"name", "arg", "kind"}, where)
            named[_name(arg["name"], where)] = arg["arg"]
            _argument(arg["arg"], f"{where}.{arg['name']}", g)
        made = target.removeprefix("torch.ops.")
        outputs = []
        for out_arg in _list(node["outputs"], where):
            _argument(out_arg, f"{where} output", g)
            listed_out = out_arg.get("as_tensors") or [out_arg.get("as_tensor")]
            outputs += [t["name"] for t in listed_out if isinstance(t, dict)]
        for name in outputs:
            g.made_by.setdefault(name, (where, made))
        _size_argument(op, named.get("size"), outputs, where, made, g)
        flag = _EVAL_MODE.get(target)
        if flag is not None and named.get(flag) == {"as_bool": False}:
            raise _eval_mode(where, target, flag)
        if target == "torch.ops.aten.embedding.default" and "as_tensor" in named.get("indices", {}):
            weight = g.tensors.get(named.get("weight", {}).get("as_tensor", {}).get("name", ""))
            index = named["indices"]["as_tensor"]["name"]
            if weight is not None and weight.sizes:
                g.highs[index] = min(g.highs.get(index, _MAX_INT), weight.sizes[0])
        if node.get("is_hop_single_tensor_return") not in (None, True, False):
            raise _bad("expected true, false or null", where)
        metadata = node["metadata"]
        if not isinstance(metadata, dict):
            raise _bad("metadata must be an object", where)
        canonical = (
            {"nn_module_stack": _module_stack(metadata["nn_module_stack"], where)}
            if "nn_module_stack" in metadata
            else {}
        )
        out.append(dict(node, metadata=canonical))
    return out


def _size_argument(
    op: torch._ops.OpOverload | None, size: Any, outputs: list[str], where: str, made: str, g: _Graph
) -> None:
    """A call that allocates a new tensor of the sizes it is given (``aten.ones.default``'s ``size``; not a view such
    as ``expand``) makes that tensor whatever its output's metadata declares: its bytes count too."""
    if op is None or not isinstance(size, dict) or set(size) != {"as_ints"} or not op._schema.returns:
        return
    if op._schema.returns[0].alias_info is not None:  # a view of its input: allocates nothing
        return
    sizes = tuple(_int(s, where, lo=0, hi=_MAX_INT) for s in size["as_ints"])
    out = g.tensors.get(outputs[0]) if outputs else None
    dtype, itemsize = (out.dtype, out.itemsize) if out is not None else ("int64", 8)
    meta = TensorMeta(dtype, itemsize, sizes, (), 0)
    g.created.append(TensorSize(where, "size argument of node", meta, op=made))


def _eval_mode(where: str, target: str, flag: str | None = None) -> ExportedError:
    op = target.removeprefix("torch.ops.")
    how = f"{op} with {flag}=False" if flag else op
    return _bad(
        f"the node runs {how}: the program was exported in eval mode, whose memory is not a training step's; call "
        "model.train() before torch.export.export",
        where,
    )


_STATE = {  # input spec kind -> its fields, the one holding the qualified name first
    "parameter": ("parameter_name", "arg"),
    "buffer": ("buffer_name", "arg", "persistent"),
    "tensor_constant": ("tensor_constant_name", "arg"),
}
_NOT_INPUTS = {
    "custom_obj": "script objects",
    "token": "side effects (effect tokens)",
    "constant_input": "non-tensor inputs (export bakes ints, floats and strings into the program)",
}


def _signature(signature: Any, g: _Graph) -> tuple[list[tuple[str, TensorMeta]], dict[str, str]]:
    """The user inputs (name, metadata) and the state tensors' kinds by qualified name, from the graph signature."""
    _fields(signature, {"input_specs", "output_specs"}, "signature")
    inputs: list[tuple[str, TensorMeta]] = []
    state: dict[str, str] = {}
    for i, spec in enumerate(_list(signature["input_specs"], "input_specs")):
        where = f"input spec {i}"
        if not isinstance(spec, dict) or len(spec) != 1:
            raise _bad("an input spec must have exactly one field", where)
        ((kind, body),) = spec.items()
        if kind == "user_input":
            arg = _fields(body, {"arg"}, where)["arg"]
            if not isinstance(arg, dict) or set(arg) != {"as_tensor"}:
                raise _bad("every input must be a tensor", where)
            name = _tensor(arg["as_tensor"], where, g)
            inputs.append((name, g.tensors[name]))
        elif kind in _STATE:
            _fields(body, set(_STATE[kind]), where)
            _tensor(body["arg"], where, g)
            state[_fqn(body[_STATE[kind][0]], f"{kind} name")] = kind
        else:
            raise _bad(f"{_NOT_INPUTS.get(kind, kind)} are not supported", where)
    for i, spec in enumerate(_list(signature["output_specs"], "output_specs")):
        where = f"output spec {i}"
        if not isinstance(spec, dict) or len(spec) != 1:
            raise _bad("an output spec must have exactly one field", where)
        ((kind, body),) = spec.items()
        if kind in ("user_output", "loss_output"):
            _argument(_fields(body, {"arg"}, where)["arg"], where, g)
        elif kind == "buffer_mutation":
            _tensor(_fields(body, {"arg", "buffer_name"}, where)["arg"], where, g)
            _fqn(body["buffer_name"], "buffer name")
        elif kind == "user_input_mutation":
            _tensor(_fields(body, {"arg", "user_input_name"}, where)["arg"], where, g)
            _name(body["user_input_name"], where)
        else:
            raise _bad(f"output kind {kind} is not supported", where)
    if not inputs or not inputs[0][1].sizes:
        raise _bad("the program must take a tensor input whose first dimension is the batch", "input_specs")
    return inputs, state


def _treespec(text: Any, where: str) -> None:
    """A pytree spec of the module call graph: tuples, lists, dicts and leaves only."""
    if not isinstance(text, str) or len(text) > 100_000:
        raise _bad("expected a pytree spec string", where)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _bad(f"pytree spec is not JSON ({e})", where) from e
    if not (isinstance(doc, list) and len(doc) == 2 and doc[0] == 1):
        raise _bad("unexpected pytree spec protocol", where)
    types = {None, "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict"}

    def walk(spec: Any, depth: int) -> None:
        _fields(spec, {"type", "context", "children_spec"}, where)
        if spec["type"] not in types or depth > 32:
            raise _bad(
                f"inputs and outputs must be tensors in tuples, lists and dicts (got {str(spec['type'])[:60]})", where
            )
        if spec["context"] is not None and (not isinstance(spec["context"], str) or len(spec["context"]) > 10_000):
            raise _bad("unexpected pytree context", where)
        for child in _list(spec["children_spec"], where):
            walk(child, depth + 1)

    walk(doc[1], 0)


def _call_graph(entries: Any, g: _Graph) -> None:
    for k, entry in enumerate(_list(entries, "module_call_graph")):
        _fields(entry, {"fqn", "signature"}, f"module_call_graph {k}")
        fqn = _fqn(entry["fqn"], "module path", root=True)
        sig = entry["signature"]
        if sig is None:
            continue
        where = f"module {fqn!r} signature"
        _fields(sig, {"inputs", "outputs", "in_spec", "out_spec", "forward_arg_names"}, where)
        for arg in _list(sig["inputs"], where) + _list(sig["outputs"], where):
            _argument(arg, where, g)
        _treespec(sig["in_spec"], where)
        _treespec(sig["out_spec"], where)
        for name in _list(sig["forward_arg_names"] or [], where):
            _name(name, where)


@dataclass(frozen=True)
class Program:
    """A program JSON that passed the checks.

    Attributes:
        canonical: the program as it is stored (node metadata reduced to ``nn_module_stack``).
        inputs: the user inputs, ``(name, metadata)`` in order.
        highs: integer inputs' exclusive bounds, from the embeddings they index.
        state: parameters', buffers' and tensor constants' kinds by qualified name.
        n_nodes: operator calls.
        tensors: every tensor the graph declares (inputs, parameters, buffers, constants, the nodes' outputs) and
            every one its factory calls ask for, by name.
    """

    canonical: dict[str, Any]
    inputs: list[tuple[str, TensorMeta]]
    highs: dict[str, int]
    state: dict[str, str]
    n_nodes: int
    tensors: list[TensorSize]

    @property
    def max_tensor_bytes(self) -> int:
        """The largest tensor's bytes (0 when there is none)."""
        top = largest_tensor(self.tensors)
        return top.nbytes if top is not None else 0

    @property
    def torch_version(self) -> str:
        return str(self.canonical["torch_version"])


_TOP = {
    "graph_module", "opset_version", "range_constraints", "schema_version", "verifiers", "torch_version", "guards_code",
}  # fmt: skip
_GRAPH = {
    "inputs", "outputs", "nodes", "tensor_values", "sym_int_values", "sym_bool_values", "is_single_tensor_return",
    "custom_obj_values", "sym_float_values",
}  # fmt: skip


def check_program(doc: Any) -> Program:
    """The program JSON (``models/model.json``) checked against the schema, in canonical form."""
    _fields(doc, _TOP, "program", optional=_TOP - {"graph_module", "schema_version"})
    version = _fields(doc["schema_version"], {"major", "minor"}, "schema_version")
    if version["major"] != SCHEMA_VERSION[0] or _int(version["minor"], "schema_version") > SCHEMA_VERSION[1]:
        raise _bad(
            f"program schema {version['major']}.{version['minor']} is not readable by this server's torch "
            f"{torch.__version__} (schema {SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}); export with that torch",
            "schema_version",
        )
    _empty(
        doc.get("guards_code"),
        "guards_code",
        "guards are Python source, which torch compiles and runs; memtune "
        "accepts programs with no guards (" + _STATIC + ", no torch._check)",
    )
    _empty(doc.get("range_constraints"), "range_constraints", "dynamic shapes are not supported: " + _STATIC)
    verifiers = doc.get("verifiers") or []
    if not isinstance(verifiers, list) or not set(verifiers) <= {"TRAINING", "ATEN"}:
        raise _bad(f"dialect {str(verifiers)[:60]} is not ATen's training or inference IR", "verifiers")
    opsets = doc.get("opset_version") or {}
    if not isinstance(opsets, dict) or not all(_NAME.match(str(k)) and type(v) is int for k, v in opsets.items()):
        raise _bad("opset_version must map names to integers", "opset_version")
    torch_version = doc.get("torch_version") or ""
    if not isinstance(torch_version, str) or not _VERSION.match(torch_version):
        raise _bad("unexpected torch_version", "torch_version")

    gm = _fields(
        doc["graph_module"],
        {"graph", "signature", "module_call_graph", "metadata", "treespec_namedtuple_fields"},
        "graph_module",
    )
    _empty(gm["metadata"], "graph_module.metadata", "graph-module metadata is not supported")
    _empty(
        gm["treespec_namedtuple_fields"],
        "treespec_namedtuple_fields",
        "named tuples are not supported as inputs or outputs; use tensors, tuples, lists or dicts",
    )
    graph = _fields(gm["graph"], _GRAPH, "graph")
    for field in ("sym_int_values", "sym_bool_values", "sym_float_values"):
        _empty(graph[field], field, "symbolic values are not supported: " + _STATIC)
    _empty(graph["custom_obj_values"], "custom_obj_values", "script objects are not supported")
    if type(graph["is_single_tensor_return"]) is not bool:
        raise _bad("expected true or false", "is_single_tensor_return")
    if not isinstance(graph["tensor_values"], dict):
        raise _bad("expected an object", "tensor_values")
    g = _Graph({_name(n, "tensor_values"): tensor_meta(m, n) for n, m in graph["tensor_values"].items()}, {})
    for i, arg in enumerate(_list(graph["inputs"], "graph.inputs") + _list(graph["outputs"], "graph.outputs")):
        _argument(arg, f"graph input or output {i}", g)
    nodes = _nodes(graph["nodes"], g)
    inputs, state = _signature(gm["signature"], g)
    _call_graph(gm["module_call_graph"], g)
    canonical = {
        "graph_module": {
            "graph": dict(graph, nodes=nodes),
            "signature": gm["signature"],
            "module_call_graph": gm["module_call_graph"],
            "metadata": {},
            "treespec_namedtuple_fields": {},
        },
        "opset_version": opsets,
        "range_constraints": {},
        "schema_version": version,
        "verifiers": verifiers,
        "torch_version": torch_version,
        "guards_code": [],
    }
    return Program(canonical, inputs, g.highs, state, len(nodes), _tensor_sizes(g, gm["signature"]))


def _tensor_sizes(g: _Graph, signature: dict[str, Any]) -> list[TensorSize]:
    """Every tensor of the graph by its most telling name: a state tensor by its qualified name, a node's output by
    its node, the rest (inputs) by their own; and the tensors factory calls ask for."""
    named: dict[str, tuple[str, str]] = {}
    for spec in signature["input_specs"]:
        ((kind, body),) = spec.items()
        if kind in _STATE:
            named[body["arg"]["name"]] = (body[_STATE[kind][0]], kind.replace("_", " "))
        else:
            named[body["arg"]["as_tensor"]["name"]] = (body["arg"]["as_tensor"]["name"], "input")
    out = []
    for name, meta in g.tensors.items():
        if name in g.made_by:
            node, op = g.made_by[name]
            out.append(TensorSize(node, "output of node", meta, op=op))
        else:
            who, what = named.get(name, (name, "tensor"))
            out.append(TensorSize(who, what, meta))
    return out + g.created


def check_graph(graph: torch.fx.Graph) -> None:
    """The graph ``torch.export.load`` returned calls ATen and prims operators and ``operator.getitem`` only (the
    JSON was checked for that; this checks what torch made of it)."""
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        t = node.target
        if not (
            node.op == "call_function"
            and (t is operator.getitem or (isinstance(t, torch._ops.OpOverload) and t.namespace in ("aten", "prims")))
        ):
            raise _bad(f"the loaded graph calls {node.op} {t!r}", node.name)
