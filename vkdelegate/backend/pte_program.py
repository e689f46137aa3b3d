"""Load an ExecuTorch program (.pte) as a LoweredProgram.

Each ExecutionPlan becomes a method whose plan is the same JSON form as our own
programs' (``vkdelegate.backend.interpreter``), so inputs are checked, numpy or torch
goes in and out, and the CPU part runs under the same allow-list:

- value ``i`` of the ExecutionPlan is glue value ``v<i>``; constant tensors (the
  constant segment) are method constants; Int/Double/Bool/String/lists are literals;
- a DelegateCall of a ``VulkanBackend`` delegate is a delegate node (its blob runs on
  our runtime with the program's named data); its arguments are the blob's inputs
  then its outputs, which the node defines. Other backends are refused by name;
- a KernelCall is a glue node (``pte_kernels``); a FreeCall does nothing here;
  control flow (MoveCall, JumpFalseCall) is refused.

Inputs of dynamic shape (ExecuTorch stores their upper bounds) accept any size from
1 up to the bound in each dim; the blob checks what it can run.
"""
from __future__ import annotations

import numpy as np

from vkdelegate.backend.pte_kernels import KernelMapper, typed_int
from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization import pte_reader
from vkdelegate.serialization.manifest_json import parse_manifest

VULKAN_BACKEND = "VulkanBackend"


def _spec_from_json(node, depth: int = 0):
    """Our pytree spec from a node of torch's treespec JSON, or None when it holds a
    container we do not rebuild (the caller then uses a flat spec)."""
    if not isinstance(node, dict) or depth > 64:
        return None
    kind, children = node.get("type"), node.get("children_spec")
    if kind is None:
        return {"t": "leaf"}
    if not isinstance(children, list):
        return None
    if kind == "builtins.NoneType":
        return {"t": "none"}
    converted = [_spec_from_json(c, depth + 1) for c in children]
    if any(c is None for c in converted):
        return None
    if kind in ("builtins.tuple", "builtins.list"):
        return {"t": kind.split(".")[1], "c": converted}
    if kind == "builtins.dict":
        try:
            import json

            keys = json.loads(node.get("context") or "[]")
        except (ValueError, TypeError, RecursionError):
            return None
        if isinstance(keys, list) and len(keys) == len(converted) and all(
                isinstance(k, str) for k in keys):
            return {"t": "dict", "k": keys, "c": converted}
    return None


def _spec(encoded: "str | None", leaves: int, flat: dict, where: str, limits) -> dict:
    from vkdelegate.backend import pytree_spec

    spec = None
    if encoded:
        parsed = parse_manifest(encoded.encode(), f"{where} (pytree spec)", limits)
        if isinstance(parsed, list) and len(parsed) == 2:
            spec = _spec_from_json(parsed[1])
    if spec is None or pytree_spec.num_leaves(spec) != leaves:
        return flat
    return spec


def _constant(tensor: pte_reader.PteTensor, where: str):
    data = bytes(tensor.constant)
    if tensor.dtype == "bfloat16":
        try:
            import torch
        except ImportError:
            raise VkDelegateError(f"{where}: bfloat16 constants need torch") from None
        return torch.frombuffer(bytearray(data), dtype=torch.int16).view(
            torch.bfloat16).reshape(tensor.sizes)
    return np.frombuffer(data, dtype=tensor.dtype).reshape(tensor.sizes).copy()


def _boundary_cast(value: pte_reader.PteValue, graph, vid: int) -> "bool":
    """Whether an int64 tensor of the program is an int32 tensor of the blob (which
    ExecuTorch's runtime converts at the delegate boundary, and so do we)."""
    from vkdelegate.serialization import vkgraph as vk

    inner = graph.values[vid] if 0 <= vid < len(graph.values) else None
    return (value.kind == "Tensor" and value.value.dtype == "int64"
            and isinstance(inner, vk.VkTensor) and inner.datatype == vk.VkDataType.INT32)


class _MethodBuilder:
    def __init__(self, plan: pte_reader.PtePlan, named: dict, where: str, limits):
        self.p, self.named, self.where, self.limits = plan, named, where, limits
        self.constants, self.nodes, self.produced = {}, [], set()
        self.mapper = KernelMapper(self.arg, self.dtype_of)
        for i, v in enumerate(plan.values):
            if v.kind == "Tensor" and v.value.constant is not None:
                self.constants[f"v{i}"] = _constant(v.value, f"{where}, value {i}")

    def dtype_of(self, index: int) -> str:
        v = self.p.values[index]
        if v.kind != "Tensor":
            raise VkDelegateError(f"{self.where}: value {index} is a {v.kind}, not a "
                                  f"Tensor")
        return v.value.dtype

    def arg(self, index: int, type_str: "str | None"):
        """The glue argument for value ``index``."""
        v = self.p.values[index]
        if v.kind == "Tensor" or index in self.produced:
            return {"v": f"v{index}"}
        if v.kind == "Null":
            return None
        if v.kind == "Int":
            return typed_int(v.value, type_str, f"{self.where}, value {index}")
        if v.kind in ("IntList", "TensorList"):
            item = "Int" if v.kind == "IntList" else "Tensor"
            for k in v.value:
                if self.p.values[k].kind != item:
                    raise VkDelegateError(f"{self.where}: value {index} ({v.kind}) "
                                          f"holds value {k}, a {self.p.values[k].kind}")
            return [self.arg(k, None) for k in v.value]
        if v.kind == "OptionalTensorList":
            for k in v.value:
                if k != -1 and self.p.values[k].kind != "Tensor":
                    raise VkDelegateError(f"{self.where}: value {index} ({v.kind}) "
                                          f"holds value {k}, a {self.p.values[k].kind}")
            return [None if k == -1 else {"v": f"v{k}"} for k in v.value]
        return v.value  # Bool, Double, String, DoubleList, BoolList

    def delegate(self, k: int, ins: pte_reader.PteInstruction, delegates: list) -> None:
        from vkdelegate.serialization.blob import read_blob

        if not 0 <= ins.index < len(self.p.delegates):
            raise VkDelegateError(f"{self.where}: instruction {k} calls delegate "
                                  f"{ins.index}; the method has {len(self.p.delegates)}")
        graph = read_blob(self.p.delegates[ins.index].data, self.limits).graph
        n_in, n_out = len(graph.input_ids), len(graph.output_ids)
        if len(ins.args) != n_in + n_out:
            raise VkDelegateError(f"{self.where}: instruction {k} passes delegate "
                                  f"{ins.index} {len(ins.args)} values; its blob has "
                                  f"{n_in} inputs and {n_out} outputs")
        args = []
        node = {"op": "delegate", "index": ins.index, "args": args, "out": f"call{k}"}
        casts = [_boundary_cast(self.p.values[i], graph, vid)
                 for i, vid in zip(ins.args, list(graph.input_ids) + list(graph.output_ids))]
        if any(casts[:n_in]):
            node["cast_inputs"] = ["int32" if c else None for c in casts[:n_in]]
        if any(casts[n_in:]):
            node["cast_outputs"] = ["int64" if c else None for c in casts[n_in:]]
        for i in ins.args[:n_in]:
            ref = self.arg(i, None)
            if not isinstance(ref, dict):  # a literal Int input: a 0-d constant
                kind = self.p.values[i].kind
                if kind != "Int":  # what a lowering passes a delegate: tensors, ints
                    raise VkDelegateError(f"{self.where}: instruction {k} passes delegate "
                                          f"{ins.index} value {i}, a {kind}; a delegate "
                                          f"input is a Tensor or an Int")
                self.constants[f"v{i}"] = np.asarray(ref, dtype=np.int64)
                ref = {"v": f"v{i}"}
            args.append(ref)
        out = node["out"]
        self.nodes.append(node)
        for j, i in enumerate(ins.args[n_in:]):
            self.nodes.append({"op": "getitem", "args": [{"v": out}, j], "out": f"v{i}"})
            self.produced.add(i)

    def kernel(self, k: int, ins: pte_reader.PteInstruction) -> None:
        if not 0 <= ins.index < len(self.p.operators):
            raise VkDelegateError(f"{self.where}: instruction {k} calls operator "
                                  f"{ins.index}; the method has {len(self.p.operators)}")
        name = self.p.operators[ins.index]
        node, outs = self.mapper.node(name, ins.args, f"{self.where}, instruction {k}")
        if len(outs) == 1:
            self.nodes.append({**node, "out": f"v{outs[0]}"})
        else:
            self.nodes.append({**node, "out": f"call{k}"})
            self.nodes.extend({"op": "getitem", "args": [{"v": f"call{k}"}, j],
                               "out": f"v{i}"} for j, i in enumerate(outs))
        self.produced.update(outs)

    def build(self):
        from vkdelegate.backend.program import Delegate, Method

        p = self.p
        for k, d in enumerate(p.delegates):
            if d.backend != VULKAN_BACKEND:
                raise VkDelegateError(f"{self.where}: delegate {k} is for backend "
                                      f"{d.backend!r}; vkdelegate runs {VULKAN_BACKEND} "
                                      f"delegates only")
        delegates = [Delegate(d.data, self.named) for d in p.delegates]
        inputs, ranges = [], {}
        for n, i in enumerate(p.inputs):
            v = p.values[i]
            if v.kind != "Tensor":
                raise VkDelegateError(f"{self.where}: input {n} is a {v.kind}; vkdelegate "
                                      f"runs .pte methods with tensor inputs only")
            shape = list(v.value.sizes)
            if v.value.dynamic:
                for d, bound in enumerate(v.value.sizes):
                    sym = f"s{n}_{d}"
                    shape[d], ranges[sym] = {"sym": sym}, [min(1, bound), bound]
            inputs.append({"name": f"arg{n}", "value": f"v{i}", "dtype": v.value.dtype,
                           "shape": shape})
            self.produced.add(i)
        for k, ins in enumerate(p.instructions):
            if ins.kind == "DelegateCall":
                self.delegate(k, ins, delegates)
            elif ins.kind == "KernelCall":
                self.kernel(k, ins)
            elif ins.kind != "FreeCall":
                raise VkDelegateError(f"{self.where}: instruction {k} is a {ins.kind} "
                                      f"(control flow), which vkdelegate does not run")
        outputs = [self.arg(i, None) for i in p.outputs]
        leaf = {"t": "leaf"}
        flat_in = {"t": "tuple", "c": [{"t": "tuple", "c": [leaf] * len(inputs)},
                                       {"t": "dict", "k": [], "c": []}]}
        plan = {
            "inputs": inputs, "ranges": ranges, "nodes": self.nodes, "outputs": outputs,
            "user_outputs": list(range(len(outputs))),
            "in_spec": _spec(p.encoded_inputs, len(inputs), flat_in, self.where,
                             self.limits),
            "out_spec": _spec(p.encoded_outputs, len(outputs),
                              {"t": "tuple", "c": [leaf] * len(outputs)}, self.where,
                              self.limits),
        }
        return Method(plan=plan, constants=self.constants, state={}, delegates=delegates)


def load_pte(raw: bytes, where: str, options: dict, limits):
    """A LoweredProgram running the .pte bytes ``raw`` (``where`` names the file in
    errors). Raises VkDelegateError for a malformed program, a delegate of another
    backend, an operator off the allow-list and control flow (see the module doc)."""
    from vkdelegate.backend.program import LoweredProgram

    program = pte_reader.read_pte(raw, where, limits)
    methods = {}
    for plan in program.plans:
        if plan.name in methods:
            raise VkDelegateError(f"{where}: method {plan.name!r} appears twice")
        w = f"{where}, method {plan.name!r}"
        methods[plan.name] = _MethodBuilder(plan, program.named_data, w, limits).build()
    try:
        return LoweredProgram(methods, options, limits)
    except VkDelegateError as exc:  # keeps the subclass
        raise type(exc)(f"{where}, {exc}") from exc
