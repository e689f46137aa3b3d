"""``DelegateGraph``: one partition built once on a device and replayed per inference.

Load (constructor): allocate every tensor (upper-bound sizes; shared ``mem_obj_id``
memory aliased), upload constants, run each node's op ``impl`` (which declares its
dispatches through a ``NodeBuilder``), create descriptor sets and record ONE command
buffer. ``execute``: write inputs into mapped memory, one queue submit, one fence wait,
read outputs; host cost does not depend on the number of nodes. New input sizes within
the upper bounds trigger a resize walk (each op's ``shape_fn`` gives its output sizes;
metadata uniform buffers are rewritten) and never a re-recording: ``recordings`` counts
how often the main command buffer was recorded (always 1).

How to add an op: docs/RUNTIME.md, section "How to add an op". In short, an op is an
``OpSpec(name, dtypes, impl, shape_fn)`` registered in vkdelegate/ops/families/<family>.py;
``impl(b: NodeBuilder, node: OperatorCall) -> None`` declares dispatches with
``b.dispatch(shader, defines, outputs, inputs, params, global_size, local_size)``;
``shape_fn(args) -> tuple | list[tuple]`` gets the node's arguments without the output
(tensors as objects with ``.shape``/``.dtype``, scalars and lists as Python values) and
returns the output sizes.
"""
from __future__ import annotations

import contextlib
import time
import weakref
from typing import Callable, Sequence

import numpy as np
import vulkan as vk

from vkdelegate.dtypes import ITEMSIZE
from vkdelegate.errors import VkDelegateError, node_label
from vkdelegate.limits import resolve_limits
from vkdelegate.runtime import commands
from vkdelegate.runtime.builder import ErrorFlag, NodeBuilder
from vkdelegate.runtime.device import Device, default_device
from vkdelegate.runtime.device_state import DeviceState
from vkdelegate.runtime.dtypes import (ZERO_DIVISION, ZERO_DIVISION_BIT, device_dtype,
                                       from_device, to_device)
from vkdelegate.runtime.graph_resources import GraphResources, owned
from vkdelegate.runtime.host_copy import copy_bytes
from vkdelegate.runtime.op_table import OpTable, resolve_ops
from vkdelegate.runtime.memory import STAGING_USAGE, STORAGE_USAGE, Allocator
from vkdelegate.runtime.profiler import Profile
from vkdelegate.runtime.tensor import Tensor
from vkdelegate.runtime.values import GraphValues
from vkdelegate.runtime.vkcall import FenceSubmit, vk_call
from vkdelegate.serialization import vkgraph as g
from vkdelegate.serialization.graph_checks import check_graph
from vkdelegate.serialization.tensor_budget import check_tensor_budget


#: Default fence wait per execute (seconds) on a GPU, and on a CPU (software) device.
GPU_TIMEOUT_S = 30.0
CPU_DEVICE_TIMEOUT_S = 300.0
#: Most runs of one ``execute(repeat=)`` (its fence wait: the timeout times at most 8).
MAX_REPEAT = 1024
#: Repeat counts whose submits (``_repeat_submit``) a graph keeps built.
REPEAT_SUBMITS_KEPT = 4


class DelegateGraph(DeviceState):
    """An executable partition.

    graph: the VkGraph. constant_bytes: ``f(i) -> bytes`` resolving
    ``graph.constants[i]``. device: a Device, a selector (index or name substring) or
    None (default device). staging: None picks per device: zero-copy (tensor memory
    mapped) on integrated and CPU devices whose device-local memory is host-visible,
    staging buffers in host-cached memory on discrete GPUs (host reads of mapped VRAM
    cross the bus uncached); True or False forces either. timeout_s: fence wait limit per
    execute, in seconds (None: GPU_TIMEOUT_S, or CPU_DEVICE_TIMEOUT_S on a CPU device).
    progress: show a tqdm bar over the nodes while building (shader compilation and
    weight packing are the slow steps of a first load). limits: the resource budget
    (``vkdelegate.limits.LoadLimits``; None: the defaults). ops: the OpTable the nodes
    are looked up and checked in (runtime/op_table.py; None: every registered op, with
    ``vkdelegate.ops.load_checks``). kernel_options: switches op impls read with
    ``NodeBuilder.option`` (``CompileOptions.kernel_options``; None: all defaults).
    constant_pools: the program's ``runtime.constant_pool.ConstantPools``: named
    constants (and their packed copies) are then held once on the device for all the
    graphs built with it (the methods of one program); None: in the graph's memory.
    Raises VkDelegateError on malformed graphs, unsupported ops, declared output sizes
    that differ from the op's (the table's ``check_nodes``), device limits;
    ResourceLimitError for a graph over ``limits``. All of these are checked before
    any memory is allocated or any shader compiled.
    Call ``close()`` (or use ``with``) to free device memory; a graph dropped without
    it is freed when it is collected (a finalizer), and ``Device.close()`` closes the
    graphs still open on it.

    Attributes: ``inputs``/``outputs`` (Tensors), ``dispatches`` (recorded in order),
    ``barriers`` (pipeline barriers between dispatches), ``recordings`` (times the main
    command buffer was recorded: 1, once more after ``bind_state``), ``last_profile`` (Profile of the last
    ``profile=True`` run), ``last_timing`` (seconds of the last run: ``total_s``,
    ``fence_wait_s``, ``host_s`` = total - fence wait, and the input copies
    ``upload_s`` and output reads ``download_s`` within the host part), ``last_transfer`` (bytes written into and read from host-visible memory by
    the last run: ``upload_bytes``, ``download_bytes``), ``state_bindings`` (input
    index -> output index of the state kept on the device, see ``bind_state``).
    """

    #: The state methods of DeviceState are available (backend/executor.py's Executor).
    keeps_state = True

    # Owned Vulkan objects and the run lock live in self._res (graph_resources.py).
    _cmd = owned()
    _profile_cmd = owned()
    _join_cmd = owned()
    _query_pool = owned()
    _fence = owned()
    _pool = owned()
    _closed = owned()

    def __init__(self, graph: g.VkGraph, constant_bytes: Callable[[int], bytes],
                 device=None, staging: bool | None = None, timeout_s: float | None = None,
                 progress: bool = False, limits=None, ops: OpTable | None = None,
                 kernel_options=None, constant_pools=None):
        self.progress = progress
        self.kernel_options = dict(kernel_options or {})
        self.limits = resolve_limits(limits)
        self.device = device if isinstance(device, Device) else default_device(device)
        self.graph = graph
        # Untrusted data: structure, budget and every node's arguments and sizes are
        # checked before the first allocation or pipeline.
        check_graph(graph, self.limits)
        info = self.device.info
        check_tensor_budget(graph, self.limits,
                            lambda name: ITEMSIZE[device_dtype(name, info)])
        self._specs = resolve_ops(ops).ops_for(graph)
        # A software driver (lavapipe) runs a real model's batch in tens of seconds on a
        # loaded 2-core machine; a GPU that has not finished in 30 s is stuck.
        self.timeout_s = timeout_s if timeout_s is not None else (
            CPU_DEVICE_TIMEOUT_S if info.type == "cpu" else GPU_TIMEOUT_S)
        self.allocator = Allocator(self.device)
        self._res = GraphResources(self.device, self.allocator)
        # The finalizer holds the resources, never the graph. Not run at interpreter
        # exit: the process's memory and the driver go with it.
        self._finalizer = weakref.finalize(self, self._res.release)
        self._finalizer.atexit = False
        self._lock = self._res.lock  # inputs, outputs and fence serve one run at a time
        self.dispatches: list = []
        self.resize_hooks: list = []
        self.error_flags: list[ErrorFlag] = []  # NodeBuilder.error_flag, in chain order
        self._error_view = None  # uint32 host view of the error-flag buffer
        # NodeBuilder.dispatch's ``grid``: per indirect dispatch, () -> its workgroup
        # counts now; their host-visible VkDispatchIndirectCommand buffer and view.
        self._indirect_fns: list = []
        self._indirect_buffer = None
        self._indirect_view = None
        self.recordings = 0
        self.last_profile: Profile | None = None
        self.last_timing: dict[str, float] = {}
        self.last_transfer: dict[str, int] = {}
        self.state_bindings: dict[int, int] = {}  # input index -> output index
        self.shared_states: dict = {}  # input index -> StateBuffer (bind_state shared=)
        self._downloaded_states: set[int] = set()  # state inputs bound with download
        self._skip_download: set[int] = set()     # state outputs the host never reads
        self._record_again = False
        if staging is None:
            staging = (self.device.info.type == "discrete"
                       or not self.device.mappable_device_local)
        self.staging = staging
        pool = None
        if constant_pools is not None:
            pool = constant_pools.for_device(self.device, staging)
            pool.attach()
            self._res.constant_pool = pool  # detached when the graph is released
        self.values = self._res.values = GraphValues(graph, self.device, self.allocator,
                                                     staging, pool)
        # With a pool: no other graph binds a pooled constant before its upload ran.
        with pool.lock if pool is not None else contextlib.nullcontext():
            try:
                self._load(constant_bytes)
            except BaseException:
                self.values.drop_unwritten()  # none without a pool
                self.close()
                raise

    # ---- load ------------------------------------------------------------------------
    def _load(self, constant_bytes):
        graph = self.graph
        self.values.allocate(set(graph.input_ids) | set(graph.output_ids), constant_bytes,
                             {k for k, spec in enumerate(self._specs)
                              if getattr(spec, "may_alias", False)})
        self.inputs = [self._io_tensor(v, "input") for v in graph.input_ids]
        self.outputs = [self._io_tensor(v, "output") for v in graph.output_ids]
        if self.staging:
            for t in {id(t): t for t in self.inputs + self.outputs}.values():
                # A tensor that may become shared state: its staging is freed with it.
                make = (self.values.own_buffer if id(t.buffer) in self.values.owned_ids
                        else self.allocator.buffer)
                t.staging = make(t.buffer.size, STAGING_USAGE, True,
                                 f"staging of {t.name}", cached=True)
        self._build_nodes()
        if self._indirect_fns:  # VkDispatchIndirectCommand x, y, z (16-byte stride)
            n = len(self._indirect_fns)
            self._indirect_buffer = self.allocator.buffer(
                16 * n, vk.VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT, True,
                "the indirect dispatch counts")
            self._indirect_view = self._indirect_buffer.host[:16 * n].view(
                np.uint32).reshape(n, 4)
            self._write_indirect()
        self._pool = commands.create_descriptor_sets(self.device, self.dispatches,
                                                     self.allocator.texel_view)
        self.values.flush_uploads(self.timeout_s)
        self.values.upload_timeout_s = self.timeout_s
        self._cmd, self.barriers = self._record()
        self.recordings += 1
        dev = self.device.device
        self._fence = vk_call(vk.vkCreateFence, dev, vk.VkFenceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None, what="the graph")
        self._submit_main()
        self._in_views = [t.host_view() for t in self.inputs]
        # The inputs' numpy dtypes, for execute's check (numpy's dtype.name is Python
        # code: ~10 us a call on a 2-core host); None where numpy has no such dtype.
        self._in_np_dtypes = [_np_dtype(t.dtype) for t in self.inputs]
        self._out_views = [t.host_view() for t in self.outputs]
        self._shapes = tuple(t.shape for t in self.inputs)
        self._closed = False

    def indirect_slot(self, current) -> int:
        """A slot of the graph's indirect buffer for one dispatch whose workgroup
        counts ``current()`` gives for the current sizes (NodeBuilder.dispatch's
        ``grid``): written at load and after every resize."""
        self._indirect_fns.append(current)
        return len(self._indirect_fns) - 1

    def _write_indirect(self) -> None:
        """Write every indirect dispatch's workgroup counts for the current sizes
        (host-coherent memory: the next submit sees them)."""
        for i, current in enumerate(self._indirect_fns):
            self._indirect_view[i, :3] = current()

    def error_flag(self, call: g.OperatorCall, message) -> ErrorFlag:
        """The error-flag word of node ``call`` (see NodeBuilder.error_flag). The
        buffer, allocated on first use, holds one uint32 per node of the chain."""
        for flag in self.error_flags:
            if flag.node_id == call.node_id:
                return flag
        if self._error_view is None:
            n = max(len(self.graph.chain), 1)
            self._error_buffer = self.allocator.buffer(4 * n, STORAGE_USAGE, True,
                                                       "the error flags")
            self._error_view = self._error_buffer.host[:4 * n].view(np.uint32)
            self._error_view[:] = 0
        flag = ErrorFlag(self._error_buffer, len(self.error_flags), call.node_id,
                         call.name, message)
        self.error_flags.append(flag)
        return flag

    def _check_error_flags(self) -> None:
        """Raise VkDelegateError for the first node whose error-flag word the last run
        set (one read of a few host-visible bytes)."""
        words = self._error_view[:len(self.error_flags)]
        if not words.any():
            return
        first = int(np.flatnonzero(words)[0])
        flag = self.error_flags[first]
        if int(words[first]) & ZERO_DIVISION_BIT:
            message = ZERO_DIVISION
        else:
            message = flag.message() if callable(flag.message) else flag.message
        raise VkDelegateError(f"{node_label(flag.node_id, flag.op)}: {message}")

    def resolve(self, vid: int):
        """Value ``vid`` as a Tensor or Python value (see NodeBuilder.value)."""
        return self.values.resolve(vid)

    def _io_tensor(self, vid: int, kind: str) -> Tensor:
        t = self.resolve(vid) if isinstance(self.graph.values[vid], g.VkTensor) else None
        if not isinstance(t, Tensor):
            raise VkDelegateError(f"graph {kind} {vid} is not a tensor")
        return t

    def _build_nodes(self):
        builder = NodeBuilder(self)
        chain = self.graph.chain
        if self.progress:
            from tqdm import tqdm

            chain = tqdm(chain, desc="building: shaders and weights", unit="node",
                         leave=False, disable=None)  # None: off without a TTY
        for call, spec in zip(chain, self._specs):
            builder.node = call
            where = node_label(call.node_id, call.name)
            try:
                spec.impl(builder, call)
            except VkDelegateError as exc:
                if str(exc).startswith(where):
                    raise
                # Raised below the NodeBuilder (a uniform or specialization constant
                # out of range): name the node, keep the error's class.
                raise type(exc)(f"{where}: {exc}") from exc
            except (AttributeError, IndexError, KeyError, TypeError, ValueError,
                    OverflowError) as exc:
                # An impl unpacking the wrong number of args, or an arg of the wrong
                # kind: a malformed node, reported as such rather than as a traceback.
                raise VkDelegateError(f"{where}: malformed arguments {call.args}: "
                                      f"{exc}") from exc

    def _staged(self, tensors):
        return list({id(t): t for t in tensors if t.staging is not None}.values())

    def _record(self, timestamps=None):
        """Record the main (or, with ``timestamps``, the profiling) command buffer:
        state inputs are not uploaded, state outputs the host never reads are not
        downloaded, and each state output is copied into its input at the end."""
        ins = [t for i, t in enumerate(self.inputs) if i not in self.state_bindings]
        outs = [t for j, t in enumerate(self.outputs) if j not in self._skip_download]
        pairs = [(self.outputs[j], self.inputs[i]) for i, j in self.state_bindings.items()]
        copies = [(o, i) for o, i in pairs if o.buffer is not i.buffer]  # not in place
        return commands.record(self.device, self.dispatches, self._staged(ins),
                               self._staged(outs), timestamps=timestamps,
                               state_copies=copies,
                               state_in_place=len(copies) < len(pairs),
                               indirect_buffer=self._indirect_buffer)

    # ---- run -------------------------------------------------------------------------
    def execute(self, inputs: Sequence[np.ndarray], profile: bool = False,
                repeat: int = 1) -> list[np.ndarray]:
        """Run the graph on ``inputs`` (one numpy array per graph input, in order, with
        the graph's dtypes; sizes up to the serialized upper bounds; None for a state
        input, see ``bind_state``). Returns new arrays, one per graph output (None for
        a state output bound without ``download``). With ``profile=True`` the run uses
        a command buffer with timestamps and ``self.last_profile`` holds per-node GPU times.
        Raises VkDelegateError for a wrong count, dtype, rank or size, a timeout, or an
        input error a shader flagged (NodeBuilder.error_flag, e.g. an index out of range).
        Thread-safe: concurrent calls on one graph run one after the other, and
        ``close()`` waits for a call in flight; a call after it raises VkDelegateError.
        repeat: run the graph this many times on the same inputs in ONE submit (a full
        barrier between runs, one fence wait at the end): with every state bound on the
        device (``bind_state``), ``repeat`` calls in a row without the host in between
        (an LLM decode loop whose token and position are state). The outputs are the
        last run's; an error flag of any run is raised. Not with ``profile``; at most
        ``MAX_REPEAT``; VkDelegateError otherwise.
        """
        with self._lock:
            return self._execute(inputs, profile, repeat)

    def _execute(self, inputs, profile: bool, repeat: int = 1) -> list[np.ndarray]:
        start = time.perf_counter()
        if self._closed:
            raise VkDelegateError("execute() on a closed DelegateGraph")
        if isinstance(repeat, bool) or not isinstance(repeat, int) \
                or not 1 <= repeat <= MAX_REPEAT:
            raise VkDelegateError(f"repeat must be an int in 1..{MAX_REPEAT}, got {repeat!r}")
        if repeat > 1 and profile:
            raise VkDelegateError("repeat > 1 cannot be profiled (one run per profile)")
        if len(inputs) != len(self.inputs):
            raise VkDelegateError(f"graph takes {len(self.inputs)} inputs, got {len(inputs)}")
        arrays = []
        for i, (x, t) in enumerate(zip(inputs, self.inputs)):
            if i in self.state_bindings:
                if x is not None:
                    raise VkDelegateError(f"input {i} is state kept on the device "
                                          f"(bind_state): pass None")
                arrays.append(None)
                continue
            a = np.asarray(x)
            # The name decides (a byte-swapped float32 is float32); equal dtypes skip it.
            if a.dtype != self._in_np_dtypes[i] and a.dtype.name != t.dtype:
                raise VkDelegateError(f"input {i} has dtype {a.dtype.name}, the graph "
                                      f"expects {t.dtype}")
            if a.ndim != t.ndim:
                raise VkDelegateError(f"input {i} has rank {a.ndim}, the graph expects "
                                      f"{t.ndim} (sizes up to {list(t.max_shape)})")
            arrays.append(a)
        shapes = tuple(t.shape if a is None else a.shape
                       for a, t in zip(arrays, self.inputs))
        if shapes != self._shapes:
            self.resize(shapes)
            for i, j in self.state_bindings.items():
                if self.outputs[j].shape != self.inputs[i].shape:
                    self._shapes = None
                    raise VkDelegateError(
                        f"state output {j} has sizes {list(self.outputs[j].shape)} for "
                        f"these inputs, its state input {i} {list(self.inputs[i].shape)}")
        if self._record_again:
            self._record_with_state()
        uploaded = 0
        upload_start = time.perf_counter()
        for i, (a, t, view) in enumerate(zip(arrays, self.inputs, self._in_views)):
            if a is not None:
                data = to_device(a, t.device_dtype, f"input {i}")
                copy_bytes(view, data)
                uploaded += data.nbytes
        upload_s = time.perf_counter() - upload_start
        if self.error_flags:
            self._error_view[:len(self.error_flags)] = 0
        submit = self._submit if not profile else self._profile_submit()
        if repeat > 1:
            submit = self._repeat_submit(repeat)
        # The fence is reset just before it is reused (in submit) rather than right
        # after the wait: a driver may still hold it briefly after signalling
        # (lavapipe's queue thread does), and resetting it then would block the host
        # for no reason.
        submit.submit()
        wait_start = time.perf_counter()
        submit.wait(self.timeout_s * min(repeat, 8), "execute")
        wait_s = time.perf_counter() - wait_start
        if profile:
            self.last_profile = Profile.from_queries(self.device, self._query_pool,
                                                     self.dispatches)
        if self.error_flags:
            self._check_error_flags()
        download_start = time.perf_counter()
        outputs = [None if j in self._skip_download else _download(view, t)
                   for j, (t, view) in enumerate(zip(self.outputs, self._out_views))]
        download_s = time.perf_counter() - download_start
        self.last_transfer = {
            "upload_bytes": uploaded,
            "download_bytes": sum(Tensor.nbytes_for(t.device_dtype, t.shape)
                                  for t, o in zip(self.outputs, outputs) if o is not None)}
        total = time.perf_counter() - start
        # Host time is everything but the fence wait: what the CPU spends per run.
        self.last_timing = {"total_s": total, "fence_wait_s": wait_s,
                            "host_s": total - wait_s, "upload_s": upload_s,
                            "download_s": download_s}
        return outputs

    def resize(self, shapes) -> None:
        """Set new input sizes and propagate them through every node's shape_fn;
        VkDelegateError naming the node if a size exceeds its bound, the sizes do not
        fit the op, or the node cannot be resized. After a failure the next execute
        resizes from scratch, so no half-updated metadata survives."""
        self._shapes = None
        for t, s in zip(self.inputs, shapes):
            t.set_shape(s)
        for call, spec in zip(self.graph.chain, self._specs):
            out = self.resolve(call.args[-1])
            args = [self.resolve(a) for a in call.args[:-1]]
            where = node_label(call.node_id, call.name)
            if spec.returns == "symint":  # a SymInt's new number, on the host
                try:
                    self.values.set_symint(call.args[-1], spec.shape_fn(args))
                except VkDelegateError as exc:
                    raise VkDelegateError(f"{where}: {exc}") from None
                continue
            if spec.shape_fn is None:
                tensors = [t for a in args for t in (a if isinstance(a, list) else [a])
                           if isinstance(t, Tensor)]
                if any(t.shape != t.max_shape for t in tensors):
                    raise VkDelegateError(f"{where} cannot run on resized inputs (the op "
                                          f"has no shape function)")
                continue
            try:
                new = spec.shape_fn(args)
                outs = out if isinstance(out, list) else [out]
                news = new if isinstance(new, list) else [new]
                for t, size in zip(outs, news):
                    t.set_shape(size)
            except VkDelegateError as exc:
                raise VkDelegateError(f"{where}: {exc}") from None
        for hook in self.resize_hooks:
            hook()
        if self._indirect_fns:
            self._write_indirect()
        self._shapes = tuple(t.shape for t in self.inputs)

    def _submit_main(self) -> None:
        """The submits of the main command buffer (made anew when it is recorded
        again): once, and ``_repeat_submit``'s, made on first use."""
        self._submit = FenceSubmit(self.device, [self._cmd], self._fence, "the graph")
        self._repeat_submits = {}

    def _repeat_submit(self, repeat: int) -> FenceSubmit:
        """A submit of the main command buffer ``repeat`` times, the join barrier
        (commands.record_join) between each two; the last REPEAT_SUBMITS_KEPT counts'
        submits are kept (a decode loop uses one or two)."""
        made = self._repeat_submits.pop(repeat, None)
        if made is None:
            if self._join_cmd is None:
                self._join_cmd = commands.record_join(self.device)
            cmds = [self._cmd, self._join_cmd] * (repeat - 1) + [self._cmd]
            made = FenceSubmit(self.device, cmds, self._fence, "the graph")
            while len(self._repeat_submits) >= REPEAT_SUBMITS_KEPT:
                del self._repeat_submits[next(iter(self._repeat_submits))]
        self._repeat_submits[repeat] = made  # the most recent last
        return made

    def _profile_submit(self):
        if self.device.timestamp_bits == 0:
            raise VkDelegateError(f"device {self.device.info.name} has no timestamp "
                                  f"queries on its compute queue: cannot profile")
        if self._profile_cmd is None:
            info = vk.VkQueryPoolCreateInfo(sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                            queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                                            queryCount=len(self.dispatches) + 1)
            self._query_pool = vk_call(vk.vkCreateQueryPool, self.device.device, info, None,
                                       what="the profiling query pool")
            self._profile_cmd, _ = self._record(timestamps=self._query_pool)
            self._profile_submits = FenceSubmit(self.device, [self._profile_cmd],
                                                self._fence, "the profiled graph")
        return self._profile_submits

    @property
    def device_bytes(self) -> int:
        """Bytes of device (and staging) memory the graph holds: its blocks and the
        memory of its own of its inputs and outputs that may be state (not the
        program's constant pool or shared state buffers)."""
        return self.allocator.allocated_bytes + self.values.own_bytes

    def close(self) -> None:
        """Free the command buffers, descriptor sets, fence and memory (idempotent,
        thread-safe: waits for a call in flight in another thread)."""
        self._finalizer()

    def __repr__(self) -> str:
        state = "closed" if self._closed else (
            f"{len(self.dispatches)} dispatches, {getattr(self, 'barriers', 0)} barriers, "
            f"{self.device_bytes / 2**20:.1f} MiB in blocks, "
            f"{'staged' if self.staging else 'mapped'} inputs/outputs")
        return (f"DelegateGraph({len(self.graph.chain)} nodes on {self.device.info.name}: "
                f"{state})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _np_dtype(name: str) -> "np.dtype | None":
    """numpy's dtype of graph dtype ``name``, None where numpy has none."""
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _download(view: np.ndarray, t: Tensor) -> np.ndarray:
    """Output ``t`` read out of its mapped ``view`` into a new array of its graph dtype
    and current sizes (one memmove, split across threads when large, where the device
    stores the graph dtype; a conversion otherwise)."""
    if t.device_dtype != t.dtype:
        return from_device(view[:t.numel], t.dtype).reshape(t.shape)
    out = np.empty(t.shape, dtype=t.dtype)
    copy_bytes(out, view[:t.numel])
    return out
