"""Mutable state kept on the device between runs of a ``DelegateGraph``.

A module buffer updated in place (``self.count.add_(1)``, a KV cache written with
``copy_``) is, after export, a graph input (the old value) plus a graph output (the
new value). Bound with ``bind_state``, the input is uploaded once; the recorded
command buffer ends with a copy of the output into the input's memory (after every
dispatch, so after the last one reading the input) and a barrier that makes it
visible to the next run, so the state never crosses to the host unless asked for
(``read_state``, or ``download=True`` when the new value is also a user output).
Bound to a shared StateBuffer, a state whose only reader copies it whole into the new
value before writing a region of it (a KV-cache update, ``NodeBuilder.mark_whole_copy``)
is updated in place instead: that copy is dropped, the new value lives in the buffer
itself, and the copy at the end is skipped (a decode step writes only its new rows).
"""
from __future__ import annotations

import numpy as np
import vulkan as vk

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import commands
from vkdelegate.runtime.dtypes import from_device, to_device
from vkdelegate.runtime.tensor import Tensor


class DeviceState:
    """Mixin of ``DelegateGraph``: ``bind_state``, ``read_state``. Uses the graph's
    ``inputs``, ``outputs``, ``graph``, ``state_bindings``, ``_downloaded_states``,
    ``_skip_download``, ``_record_again``, ``_in_views``, ``_lock``, ``_record``,
    ``dispatches``, ``_pool`` and ``shared_states`` (input index -> StateBuffer)."""

    def bind_state(self, input_index: int, output_index: int,
                   initial: "np.ndarray | None", download: bool = False,
                   shared=None) -> None:
        """Keep graph input ``input_index`` on the device as mutable state whose new
        value is graph output ``output_index`` (a buffer a module updates in place).

        ``initial`` (graph dtype, the input's full sizes) is uploaded now. Every later
        run copies the output into the input's memory after the last dispatch, in the
        same command buffer, so the next run reads it without a host upload.
        ``execute`` then takes None at ``input_index`` and returns None at
        ``output_index`` unless ``download`` is true; ``read_state`` gives the value.
        The command buffer is recorded again (once) before the next run.
        shared: a ``runtime.state_buffer.StateBuffer`` of this graph's Device, dtype
        and sizes: the input reads it instead of its own memory and the new value is
        copied into it, so graphs bound to one StateBuffer share the state (``initial``
        is then ignored: the buffer holds the value); ``state_buffer`` makes one.
        Raises VkDelegateError when the pair cannot be kept this way: an index out of
        range, an input already bound, dtypes or sizes that differ, an input listed
        twice or also an output, an output that is also an input, an input whose
        memory is shared with other tensors, or ``initial`` of the wrong dtype/sizes.
        """
        with self._lock:
            if self._closed:
                raise VkDelegateError("bind_state() on a closed DelegateGraph")
            if not (0 <= input_index < len(self.inputs)
                    and 0 <= output_index < len(self.outputs)):
                raise VkDelegateError(f"state input {input_index} / output {output_index} "
                                      f"out of range ({len(self.inputs)} inputs, "
                                      f"{len(self.outputs)} outputs)")
            t_in, t_out = self.inputs[input_index], self.outputs[output_index]
            v_in, v_out = self.graph.input_ids[input_index], self.graph.output_ids[output_index]
            where = f"state input {input_index} / output {output_index}"
            problem = None
            if input_index in self.state_bindings:
                problem = "the input is already state"
            elif self.graph.input_ids.count(v_in) != 1 or v_in in self.graph.output_ids:
                problem = "the input is listed twice or is also an output"
            elif v_out in self.graph.input_ids:
                problem = "the output is a graph input"
            elif getattr(self.graph.values[v_in], "mem_obj_id", -1) >= 0:
                problem = "the input shares memory with other tensors"
            elif t_in.dtype != t_out.dtype or t_in.max_shape != t_out.max_shape:
                problem = (f"the input is {t_in.dtype}{list(t_in.max_shape)}, the output "
                           f"{t_out.dtype}{list(t_out.max_shape)}")
            if shared is not None:
                if problem is None and (shared.device is not self.device
                                        or shared.dtype != t_in.dtype
                                        or shared.shape != t_in.max_shape):
                    problem = (f"the shared state is {shared.dtype}{list(shared.shape)} "
                               f"on another device or of other dtype/sizes than the "
                               f"input {t_in.dtype}{list(t_in.max_shape)}")
                if problem is None and shared.closed:
                    problem = "the shared state buffer is closed"
                if problem is not None:
                    raise VkDelegateError(f"{where} cannot be kept on the device: "
                                          f"{problem}")
                copy = self._whole_copy(t_in, t_out, output_index, download)
                if copy is not None:  # update in place: the new value IS the state
                    self.dispatches.remove(copy)
                    self._redirect(t_out, shared.buffer)
                    self._out_views[output_index] = None  # never downloaded
                    self.values.free_own(t_out.staging)
                    t_out.staging = None
                self._use_shared(t_in, shared.buffer)
                self.shared_states[input_index] = shared
                if t_in.set_shape(t_in.max_shape):
                    self._shapes = None
                self._finish_binding(input_index, output_index, download)
                return
            initial = np.asarray(initial)
            if problem is None and (initial.dtype.name != t_in.dtype
                                    or initial.shape != t_in.max_shape):
                problem = (f"initial value is {initial.dtype.name}{list(initial.shape)}, "
                           f"the input is {t_in.dtype}{list(t_in.max_shape)}")
            if problem is not None:
                raise VkDelegateError(f"{where} cannot be kept on the device: {problem}")
            if t_in.set_shape(t_in.max_shape):
                self._shapes = None
            data = to_device(initial, t_in.device_dtype, f"state input {input_index}")
            self._in_views[input_index][:data.size] = data.reshape(-1)
            if t_in.staging is not None:
                nbytes = Tensor.nbytes_for(t_in.device_dtype, t_in.max_shape)
                commands.copy_once(self.device, [(t_in.staging, t_in.buffer, nbytes)],
                                   self.timeout_s)
            self._finish_binding(input_index, output_index, download)

    def _finish_binding(self, input_index: int, output_index: int, download: bool):
        self.state_bindings[input_index] = output_index
        if download:
            self._downloaded_states.add(input_index)
        # An output two states share is downloaded if either asks for it.
        self._skip_download = ({j for j in self.state_bindings.values()}
                               - {self.state_bindings[k] for k in self._downloaded_states})
        self._record_again = True

    def state_buffer(self, input_index: int, initial: np.ndarray):
        """A new StateBuffer fitting graph input ``input_index`` (its dtype and full
        sizes, this graph's staging choice) holding ``initial``; bind it here and in
        other graphs of the same Device with ``bind_state(..., shared=buffer)``.
        The caller owns it (``close()``). Raises VkDelegateError for an index out of
        range or an initial value of another dtype or sizes."""
        from vkdelegate.runtime.state_buffer import StateBuffer

        if not 0 <= input_index < len(self.inputs):
            raise VkDelegateError(f"state input {input_index} out of range "
                                  f"({len(self.inputs)} inputs)")
        t = self.inputs[input_index]
        return StateBuffer(self.device, t.dtype, t.device_dtype, t.max_shape,
                           self.staging, initial, self.timeout_s)

    def _whole_copy(self, t_in: Tensor, t_out: Tensor, output_index: int,
                    download: bool):
        """The dispatch to drop so that state output ``t_out`` is written in place
        into its state input ``t_in``'s memory, or None: it must be the only one that
        binds ``t_in`` and copy it whole into ``t_out`` (``NodeBuilder.mark_whole_copy``,
        a KV-cache update's copy of the cache), and ``t_out`` must be this state's
        output alone (not downloaded, not another output or state, memory of its own)."""
        v_out = self.graph.output_ids[output_index]
        if download or self.graph.output_ids.count(v_out) != 1 \
                or output_index in self.state_bindings.values() \
                or getattr(self.graph.values[v_out], "mem_obj_id", -1) >= 0:
            return None
        users = [d for d in self.dispatches if any(b is t_in.buffer for b in d.buffers)]
        if len(users) != 1 or len(users[0].whole_copy) != 2:
            return None
        src, dst = users[0].whole_copy
        return users[0] if src is t_in and dst is t_out else None

    def _redirect(self, tensor: Tensor, buffer) -> None:
        """Point every dispatch that binds ``tensor``'s memory at ``buffer`` instead;
        the tensor's own memory is left unused."""
        old = tensor.buffer
        for d in self.dispatches:
            if any(b is old for b in d.buffers):
                d.buffers = [buffer if b is old else b for b in d.buffers]
                d.reads = {buffer.region if r == old.region else r for r in d.reads}
                d.writes = {buffer.region if r == old.region else r for r in d.writes}
        tensor.buffer = buffer
        if old is not buffer:
            self.values.free_own(old)  # a graph input / output's own memory

    def _use_shared(self, tensor: Tensor, buffer) -> None:
        """Point every dispatch that binds input ``tensor``'s memory at ``buffer``
        instead (descriptor sets written again); the tensor's own memory is left
        unused."""
        self._redirect(tensor, buffer)
        self.values.free_own(tensor.staging)
        tensor.staging = None  # never uploaded: the buffer holds the value
        self._in_views[self.inputs.index(tensor)] = None
        if self._pool is not None:
            vk.vkDestroyDescriptorPool(self.device.device, self._pool, None)
            self._pool = None
        self._pool = commands.create_descriptor_sets(self.device, self.dispatches,
                                                     self.allocator.texel_view)

    def read_state(self, input_index: int) -> np.ndarray:
        """The current value (a new array, graph dtype) of state input ``input_index``
        (see ``bind_state``). Raises VkDelegateError if that input is not state."""
        with self._lock:
            if self._closed:
                raise VkDelegateError("read_state() on a closed DelegateGraph")
            if input_index not in self.state_bindings:
                raise VkDelegateError(f"input {input_index} is not state kept on the "
                                      f"device (bind_state)")
            t = self.inputs[input_index]
            if input_index in self.shared_states:
                return self.shared_states[input_index].read()
            if t.staging is not None:
                nbytes = Tensor.nbytes_for(t.device_dtype, t.max_shape)
                commands.copy_once(self.device, [(t.buffer, t.staging, nbytes)],
                                   self.timeout_s)
            view = self._in_views[input_index]
            return from_device(view[:t.numel], t.dtype).reshape(t.shape)

    def _record_with_state(self) -> None:
        """Record the command buffers again after ``bind_state`` (before a run)."""
        dev = self.device.device
        old = [c for c in (self._cmd, self._profile_cmd) if c is not None]
        self._cmd = self._profile_cmd = None
        if old:
            vk.vkFreeCommandBuffers(dev, self.device.command_pool, len(old), old)
        if self._query_pool is not None:  # the profiling buffer is recorded anew
            vk.vkDestroyQueryPool(dev, self._query_pool, None)
            self._query_pool = None
        self._cmd, self.barriers = self._record()
        self.recordings += 1
        self._submit_main()
        self._record_again = False
