"""et_vk.embedding_q4gsw: torchao's int4 embedding fused and run on Vulkan, against
eager execution of the same quantized model. Each output is one product of an int4
value and its fp32 scale, exact in fp32 on both sides: compared exactly."""
import pytest
import torch

from tests.ops.harness import check_op, delegated_nodes
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.custom_ops import EMBEDDING_Q4GSW
from vkdelegate.errors import VkDelegateError

pytest.importorskip("torchao")
OP = EMBEDDING_Q4GSW.name


def _int4_embedding(rows, dim, group):
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(rows, dim)).eval()
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                          granularity=PerGroup(group)),
              filter_fn=lambda m, _fqn: isinstance(m, torch.nn.Embedding))
    return model


@pytest.mark.parametrize("group,index_shape", [(32, (3, 5)), (64, (7,)), (128, (2, 2, 3))])
def test_torchao_int4_embedding(group, index_shape):
    model = _int4_embedding(50, 256, group)
    ids = torch.randint(0, 50, index_shape)
    program = check_op(model, (ids,), ops=[OP], rtol=0, atol=0)
    assert [name for name, _ in delegated_nodes(program)] == [OP]


def _executorch_packed(q):
    """int8 [V, D] in [-8, 7] -> ExecuTorch's embedding packing: k even in the HIGH
    nibble (is_linear_weight=False), + 8."""
    shifted = q.to(torch.int16) + 8
    return ((shifted[:, ::2] << 4) | shifted[:, 1::2]).to(torch.uint8)


@pytest.mark.parametrize("scale_dtype,index_dtype", [(torch.float32, torch.int64),
                                                     (torch.float16, torch.int32)])
def test_executorch_packing(scale_dtype, index_dtype):
    torch.manual_seed(0)
    q = torch.randint(-8, 8, (20, 64), dtype=torch.int8)
    scales = (torch.rand(20, 2) / 10).to(scale_dtype)
    weight = _executorch_packed(q)
    table = (q.float().view(20, 2, 32) * scales.float().unsqueeze(-1)).view(20, 64)
    ids = torch.randint(0, 20, (4, 3), dtype=index_dtype)
    op = EMBEDDING_Q4GSW.overload()
    torch.testing.assert_close(op(weight, scales, 32, ids), table[ids.long()], rtol=0,
                               atol=0)
    check_op(lambda i: op(weight, scales, 32, i), (ids,), ops=[OP], rtol=0, atol=0)


@pytest.mark.skipif(vulkan_unavailable() is not None, reason=vulkan_unavailable() or "")
def test_index_out_of_range_raises():
    model = _int4_embedding(10, 32, 32)
    program = to_backend(torch.export.export(model, (torch.tensor([1, 2]),)),
                         VulkanPartitioner())
    with pytest.raises(VkDelegateError, match="out of range"):
        program(torch.tensor([3, 10]))


@pytest.mark.skipif(vulkan_unavailable() is not None, reason=vulkan_unavailable() or "")
def test_without_8bit_storage(vk_device):
    # Each table byte is an int32 on such a device; the shader assembles the words.
    from vkdelegate.runtime import Device, load_delegate

    model = _int4_embedding(30, 64, 32)
    ids = torch.randint(0, 30, (2, 4))
    (delegate,) = to_backend(torch.export.export(model, (ids,)),
                             VulkanPartitioner()).methods["forward"].delegates
    dev = Device(vk_device.info.name, validation=True, small_storage=False)
    try:
        with load_delegate(delegate.blob, delegate.named_data, device=dev) as loaded:
            (dispatch,) = loaded.dispatches
            assert "W_WORDS" not in dict(dispatch.pipeline.defines)
            out = torch.from_numpy(loaded.execute([ids.numpy()])[0])
        assert not dev.validation_messages
    finally:
        dev.close()
    torch.testing.assert_close(out, model(ids).detach(), rtol=0, atol=0)
