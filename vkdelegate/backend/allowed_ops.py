"""The one allow-list of operators a program's CPU part and the reference executor call.

A program file is untrusted data, and its glue nodes and delegate blobs name operators
by string. A name resolves to a callable only if it is listed here: pure tensor
operators (their result depends only on their arguments, they write none of them and
touch no file, storage, pinned memory or device), the size arithmetic that
dynamic-shape programs need, and our passes' custom ops. Everything else, every other
ATen overload of the installed torch included, is refused when the program or blob is
loaded, and ``to_backend`` refuses to write it (``refusal``).

The list is a literal, so that a review reads exactly what a program may call. It is
what lowering can leave on the CPU: the core ATen opset's pure functional overloads
(``to_backend`` decomposes to core ATen), pure ATen ops outside it that decomposition
leaves whole (``NON_CORE``: cumprod, var_mean, unfold, median, unique, ...), every op
the Vulkan registry implements (kept whole at lowering; the reference executor runs
them), the linear algebra that
``torch.linalg.inv``, ``solve`` and ``cholesky`` decompose to, the size and assert ops
torch.export emits, the value checks of decompositions (``F.one_hot``), and the
creation ops, allowed because the bytes they make are checked at load
(``vkdelegate.backend.creation_ops``). A name the installed torch does
not define (torch 2.11 lacks some) is simply unresolvable. Torch-free.

docs/LOWERING.md lists these names (``allowed_ops_doc.render``);
tests/backend/test_allowed_ops.py keeps it current and checks the schemas of the
installed torch against the rules.
"""
from __future__ import annotations

from vkdelegate.backend import custom_ops
from vkdelegate.kernels import swiglu
from vkdelegate.errors import VkDelegateError, printable


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


#: The core ATen opset (torch's ``Tag.core``) without the overloads that write an
#: argument (``_native_batch_norm_legit.default`` updates running stats, ``atan2.out``)
#: and ``as_strided`` (addresses storage by raw strides and offset).
CORE_ATEN = _names("""
aten._adaptive_avg_pool2d.default aten._adaptive_avg_pool2d_backward.default
aten._adaptive_avg_pool3d.default aten._cdist_forward.default aten._embedding_bag.default
aten._fft_c2r.default aten._fft_r2c.default aten._local_scalar_dense.default
aten._log_softmax.default aten._native_batch_norm_legit.no_stats
aten._native_batch_norm_legit_no_training.default aten._pdist_forward.default
aten._softmax.default aten._to_copy.default aten.abs.default aten.acos.default
aten.acosh.default aten.add.Scalar aten.add.Tensor aten.addmm.default aten.alias.default
aten.amax.default aten.amin.default aten.any.default aten.any.dim aten.any.dims
aten.argmax.default aten.argmin.default aten.asin.default aten.asinh.default
aten.atan.default aten.atan2.default aten.atanh.default aten.avg_pool2d.default
aten.avg_pool2d_backward.default aten.avg_pool3d.default aten.bitwise_and.Scalar
aten.bitwise_and.Tensor aten.bitwise_not.default aten.bitwise_or.Scalar
aten.bitwise_or.Tensor aten.bitwise_xor.Scalar aten.bitwise_xor.Tensor aten.bmm.default
aten.cat.default aten.ceil.default aten.clamp.Tensor aten.clamp.default aten.clone.default
aten.col2im.default aten.constant_pad_nd.default aten.convolution.default
aten.convolution_backward.default aten.copy.default aten.cos.default aten.cosh.default
aten.cumsum.default aten.diagonal.default aten.div.Scalar aten.div.Scalar_mode
aten.div.Tensor aten.div.Tensor_mode aten.elu.default aten.embedding.default
aten.embedding_dense_backward.default aten.eq.Scalar aten.eq.Tensor aten.erf.default
aten.exp.default aten.expand.default aten.expm1.default aten.fill.Scalar aten.flip.default
aten.floor.default aten.fmod.Scalar aten.fmod.Tensor aten.gather.default aten.ge.Scalar
aten.ge.Tensor aten.gelu.default aten.grid_sampler_2d.default aten.gt.Scalar aten.gt.Tensor
aten.hardtanh.default aten.index.Tensor aten.index_put.default aten.index_select.default
aten.isinf.default aten.isnan.default aten.le.Scalar aten.le.Tensor aten.leaky_relu.default
aten.log.default aten.log10.default aten.log1p.default aten.log2.default
aten.logical_and.default aten.logical_not.default aten.logical_or.default
aten.logical_xor.default aten.lt.Scalar aten.lt.Tensor aten.masked_scatter.default
aten.max.dim aten.max_pool2d_with_indices.default
aten.max_pool2d_with_indices_backward.default aten.max_pool3d_with_indices.default
aten.maximum.default aten.mean.default aten.mean.dim aten.min.dim aten.minimum.default
aten.mm.default aten.mul.Scalar aten.mul.Tensor aten.native_dropout.default
aten.native_group_norm.default aten.native_group_norm_backward.default
aten.native_layer_norm.default aten.native_layer_norm_backward.default aten.ne.Scalar
aten.ne.Tensor aten.neg.default aten.nonzero.default aten.permute.default aten.pow.Scalar
aten.pow.Tensor_Scalar aten.pow.Tensor_Tensor aten.prod.default aten.prod.dim_int
aten.reciprocal.default aten.reflection_pad1d.default aten.reflection_pad2d.default
aten.reflection_pad3d.default aten.relu.default aten.remainder.Scalar
aten.remainder.Tensor aten.repeat.default aten.replication_pad2d.default
aten.replication_pad3d.default aten.round.default aten.rsqrt.default aten.scatter.src
aten.scatter.value aten.scatter_add.default aten.scatter_reduce.two aten.select.int
aten.select_scatter.default aten.sigmoid.default aten.sign.default aten.sin.default
aten.sinh.default aten.slice.Tensor aten.slice_scatter.default aten.sort.default
aten.split_with_sizes.default aten.sqrt.default aten.squeeze.dim aten.squeeze.dims
aten.sub.Scalar aten.sub.Tensor aten.sum.dim_IntList aten.tan.default aten.tanh.default
aten.topk.default aten.trunc.default aten.unsqueeze.default aten.upsample_bilinear2d.vec
aten.upsample_nearest2d.vec aten.var.correction aten.var.dim aten.view.default
aten.where.self
""")

#: Ops the Vulkan registry implements that are not core ATen: kept whole at lowering
#: (``VulkanPartitioner.ops_to_preserve``), made by a lowering pass
#: (``_weight_int8pack_mm``: passes/quantized_linear.py) or the ``*_copy`` forms
#: ExecuTorch blobs use.
REGISTRY_EXTRA = _names("""
aten._weight_int8pack_mm.default aten.adaptive_max_pool2d.default aten.alias_copy.default
aten.hardshrink.default aten.erfinv.default aten.exp2.default aten.expand_copy.default
aten._unsafe_view.default aten.full_like.default aten.group_norm.default aten.hardswish.default aten.layer_norm.default
aten.linalg_vector_norm.default aten.linear.default aten.max.default aten.min.default
aten.ones_like.default aten.permute_copy.default aten.rms_norm.default
aten.scaled_dot_product_attention.default
aten.select_copy.int aten.slice_copy.Tensor aten.split.Tensor
aten.split_with_sizes_copy.default aten.squeeze_copy.dims aten.t_copy.default
aten.unsqueeze_copy.default aten.view_copy.default aten.zeros_like.default
aten.index_copy.default
""")

#: Linear algebra that ``run_decompositions`` leaves for ``torch.linalg.inv`` (and
#: ``torch.inverse``), ``linalg.solve`` and ``linalg.cholesky``: LAPACK on the CPU,
#: each result sized by its inputs, and the check that raises, as eager does, where the
#: matrix is singular or not positive-definite (its ``api_name`` only names the
#: function in that error).
LINALG = _names("""
aten.linalg_inv_ex.default aten._linalg_solve_ex.default aten.linalg_cholesky_ex.default
aten._linalg_check_errors.default
""")

#: Pure ATen operators outside the core opset that decomposition leaves whole and
#: models use (torch.cumprod, var_mean, Tensor.unfold, sort(stable=True), round with
#: decimals, searchsorted / bucketize, median, kthvalue, cummax / cummin, logcumsumexp,
#: masked_select, unique, antialiased interpolation): each result is sized by its
#: inputs (``masked_select`` and ``_unique2`` at most their input's elements), none
#: writes an argument. ``searchsorted``'s ``side`` is a checked choice (STR_CHOICES).
NON_CORE = _names("""
aten.cumprod.default aten.var_mean.correction aten.unfold.default aten.sort.stable
aten.round.decimals aten.searchsorted.Tensor aten.searchsorted.Scalar
aten.bucketize.Tensor aten.bucketize.Scalar aten.median.default aten.median.dim
aten.kthvalue.default aten.cummax.default aten.cummin.default aten.logcumsumexp.default
aten.masked_select.default aten._unique2.default aten.unique_dim.default
aten.unique_consecutive.default aten._upsample_bilinear2d_aa.default
aten._upsample_bicubic2d_aa.default
""")

#: Sizes and checks torch.export emits for dynamic shapes (they read only metadata).
SIZES_AND_CHECKS = _names("""
aten.sym_size.int aten.sym_numel.default aten.sym_stride.int
aten.sym_storage_offset.default aten._assert_tensor_metadata.default
aten.sym_constrain_range.default aten.sym_constrain_range_for_size.default
aten._assert_scalar.default
""")

#: Checks of tensor values that decompositions emit (``F.one_hot``'s class range):
#: each raises its message where its bool tensor is false, as eager does, and returns
#: nothing; the values they test may come from a delegate.
VALUE_CHECKS = _names("""
aten._assert_async.default aten._assert_async.msg
""")

#: Ops that make a tensor from size arguments: allowed because ``creation_ops`` checks
#: the bytes each makes against the load limits (at load for literal sizes, before the
#: call for sizes computed at run time). ``*_like`` ops are bounded by their input.
CREATION = _names("""
aten.full.default aten.zeros.default aten.ones.default aten.empty.memory_format
aten.empty_strided.default aten.arange.default aten.arange.start aten.arange.start_step
aten.scalar_tensor.default aten.rand.default aten.randn.default aten.randperm.default
aten.new_full.default aten.new_zeros.default aten.new_ones.default aten.new_empty.default
aten.new_empty_strided.default aten.empty_like.default aten.rand_like.default
aten.randn_like.default
""")

#: Custom ops the CPU glue may call: those ``custom_ops`` declares with ``glue=True``
#: (ET-VK's fused conv, RMS norm and SDPA, ExecuTorch's dim-order copy).
CUSTOM = custom_ops.names(glue=True)

#: Integer operators on SymInts (``operator.<name>`` in the glue; blobs use the bare
#: name, ``mul``). Their arguments must be ints (see ``glue_ops.BUILTINS``).
OPERATORS = _names("""
operator.add operator.sub operator.mul operator.floordiv operator.mod operator.neg
operator.eq operator.ne operator.lt operator.le operator.gt operator.ge
operator.or_ operator.and_
""")

#: Delegate-internal ops only the reference executor runs (``custom_ops``, glue=False).
REFERENCE_ONLY = custom_ops.names(glue=False)
#: ``sym_size.int``: the blob name (ExecuTorch's, and our builder's) of aten.sym_size.int,
#: which the reference executor resolves to the glue's torch-free sym_size.
BLOB_SIZE_OPS = _names("sym_size.int")

#: Everything the CPU glue may call (``getitem`` and ``delegate`` are node forms).
ALLOWED = frozenset(CORE_ATEN + REGISTRY_EXTRA + NON_CORE + LINALG + SIZES_AND_CHECKS
                    + VALUE_CHECKS + CREATION + CUSTOM + OPERATORS)

#: An assert's message: any text up to ``MAX_MESSAGE`` characters (it is only raised).
MESSAGE = "any message"
MAX_MESSAGE = 4096

#: A fused elementwise chain's steps: text in the grammar of
#: kernels/elementwise_chain.py, parsed at load (only its fusable ATen ops).
CHAIN = "a fused elementwise chain"

#: A linear_swiglu's (and its RMS-norm, int4 and int8 forms') steps: one of the fixed
#: SwiGLU chains (kernels/swiglu.py).
SWIGLU_CHAINS = swiglu.CHAINS

#: The only str arguments an allowed op takes: enum-like choices, checked at load, so
#: that no string from a file reaches an operator as anything but one of these values.
STR_CHOICES = {
    "aten.div.Scalar_mode": {"rounding_mode": ("trunc", "floor")},
    "aten.div.Tensor_mode": {"rounding_mode": ("trunc", "floor")},
    "aten.gelu.default": {"approximate": ("none", "tanh")},
    "aten.scatter_reduce.two": {"reduce": ("sum", "prod", "mean", "amax", "amin")},
    "aten.searchsorted.Tensor": {"side": ("left", "right")},
    "aten.searchsorted.Scalar": {"side": ("left", "right")},
    # torch._check(...) in a dynamic-shape program: the text only becomes the message
    # of the error the assert raises.
    "aten._assert_scalar.default": {"assert_msg": MESSAGE},
    # A value check's error (F.one_hot: "Class values must be non-negative.").
    "aten._assert_async.msg": {"assert_msg": MESSAGE},
    # The function a linear-algebra error names ("linalg.inv").
    "aten._linalg_check_errors.default": {"api_name": MESSAGE},
    "vkdelegate.fused_elementwise.default": {"steps": CHAIN},
    "vkdelegate.linear_swiglu.default": {"steps": SWIGLU_CHAINS},
    "vkdelegate.rms_norm_linear_swiglu.default": {"steps": SWIGLU_CHAINS},
    "vkdelegate.linear_q4gsw_swiglu.default": {"steps": SWIGLU_CHAINS},
    "vkdelegate.weight_int8pack_mm_swiglu.default": {"steps": SWIGLU_CHAINS},
    "vkdelegate.rms_norm_linear_q4gsw_swiglu.default": {"steps": SWIGLU_CHAINS},
    "vkdelegate.rms_norm_weight_int8pack_mm_swiglu.default": {"steps": SWIGLU_CHAINS},
    "vkdelegate.linear_dq8ca_q4gsw_swiglu.default": {"steps": SWIGLU_CHAINS},
}


def is_allowed(name: str, reference: bool = False) -> bool:
    """Whether the glue (or, with ``reference``, the reference executor) may call
    ``name``."""
    # In a blob, the integer operators go by their bare names ("mul"), as in ET-VK.
    return name in ALLOWED or (reference and (name in REFERENCE_ONLY + BLOB_SIZE_OPS or (
        isinstance(name, str) and f"operator.{name}" in OPERATORS)))


_FILE = ("file", "save", "load")
_PINNING = ("pin_memory", "is_pinned")
_STORAGE = ("storage", "resize", "as_strided", "set_", "_share", "_make_", "data_ptr",
            "record_stream", "from_blob", "_copy_from", "_unsafe", "_nested_view")


def refusal_class(name: str) -> "str | None":
    """Why a known-bad kind of op is refused (from its name: "file access", ...), or
    None when the name belongs to no such class."""
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 3:
        return None
    namespace, op, overload = parts
    if namespace != "aten":
        return "a custom operator"
    if any(word in op for word in _FILE):
        return "file access"
    if any(word in op for word in _PINNING):
        return "memory pinning"
    if op == "set" or any(word in op for word in _STORAGE):
        return "storage or raw memory access"
    if overload == "out" or overload.endswith("_out") or (
            op.endswith("_") and not op.endswith("__")) or op.startswith("__i"):
        return "writes its arguments (in-place or out= overload)"
    return _schema_class(op, overload)


def _schema_class(op: str, overload: str) -> "str | None":
    """A class read from the installed torch's schema, where torch is importable."""
    import sys

    torch = sys.modules.get("torch")
    packet = getattr(torch.ops.aten, op, None) if torch is not None else None
    overload_fn = getattr(packet, overload, None) if packet is not None else None
    schema = getattr(overload_fn, "_schema", None)
    if schema is None:
        return None
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return "writes its arguments (in-place or out= overload)"
    if any("str" in str(a.type) for a in schema.arguments):
        return "takes a str argument"
    return None


def refusal(name, where: str, caller: str = "a program's CPU part") -> VkDelegateError:
    """The error for ``where`` (e.g. "node 3 of method 'forward'") calling ``name``,
    which ``caller`` may not call; names the refusal class where one is known."""
    why = refusal_class(name)
    detail = "not on the glue allow-list" + (f": {why}" if why else "")
    return VkDelegateError(f"{where} calls {printable(name)}, which {caller} may not call "
                           f"({detail})")
