"""The reference executor on crafted blobs: an op that fails, an argument of the
wrong kind, a multi-output op whose output list does not match, a bad constant or a
bad input give VkDelegateError naming the node and op (never a bare ValueError,
KeyError or torch RuntimeError)."""
import numpy as np
import pytest
import torch

from vkdelegate import VkDelegateError
from vkdelegate.backend.reference import load_reference
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import write_blob

F32 = vk.VkDataType.FLOAT32


def _graph(values, chain, inputs, outputs, constants=()):
    return write_blob(vk.VkGraph(chain=list(chain), values=list(values), input_ids=inputs,
                                 output_ids=outputs, constants=list(constants)),
                      b"\0" * 64)


def _add(x_dims, y_dims, alpha=vk.Int(1)):
    """out = aten.add.Tensor(x, y, alpha) with inputs x, y."""
    values = [vk.VkTensor(F32, x_dims), vk.VkTensor(F32, y_dims), alpha,
              vk.VkTensor(F32, x_dims)]
    return _graph(values, [vk.OperatorCall(7, "aten.add.Tensor", [0, 1, 2, 3])], [0, 1], [3])


def test_a_well_formed_add_matches_eager():
    x, y = np.random.rand(2, 3).astype(np.float32), np.random.rand(2, 3).astype(np.float32)
    (out,) = load_reference(_add([2, 3], [2, 3])).execute([x, y])
    np.testing.assert_allclose(out, torch.add(torch.from_numpy(x), torch.from_numpy(y)))


def test_sizes_the_op_refuses_are_refused_at_load():
    # The load checks run the op's shape function on the declared sizes, as the Vulkan
    # runtime does, so torch never sees them.
    with pytest.raises(VkDelegateError, match=r"node 7 \(aten.add.Tensor\): sizes "
                                              r"\[2, 3\] and \[4, 5\] do not broadcast"):
        load_reference(_add([2, 3], [4, 5]))


def test_argument_of_the_wrong_kind():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(VkDelegateError, match=r"node 7 \(aten.add.Tensor\) failed: "
                                              r"RuntimeError: aten::add\(\) Expected a "
                                              r"value of type 'number' for argument "
                                              r"'alpha'"):
        load_reference(_add([2, 3], [2, 3], alpha=vk.IntList([1, 2]))).execute([x, x])


def test_string_argument_is_refused_at_load():
    with pytest.raises(VkDelegateError, match=r"node 7 of the delegate passes "
                                              r"aten.add.Tensor the string 'x' as argument "
                                              r"'alpha', which takes no string"):
        load_reference(_add([2, 3], [2, 3], alpha=vk.String("x")))


def test_dtype_argument_out_of_range():
    # _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
    values = [vk.VkTensor(F32, [2]), vk.Int(999), vk.Null(), vk.Bool(False),
              vk.VkTensor(F32, [2])]
    blob = _graph(values, [vk.OperatorCall(3, "aten._to_copy.default",
                                           [0, 1, 2, 2, 2, 3, 2, 4])], [0], [4])
    with pytest.raises(VkDelegateError, match=r"node 3 \(aten._to_copy.default\) "
                                              r"argument dtype: 999 is not a VkDataType"):
        load_reference(blob).execute([np.zeros(2, np.float32)])


@pytest.mark.parametrize("items", [1, 3])
def test_multi_output_list_of_the_wrong_length(items):
    values = [vk.VkTensor(F32, [5]), vk.Int(0), vk.Bool(False),
              vk.VkTensor(F32, [5]), vk.VkTensor(vk.VkDataType.INT64, [5]),
              vk.VkTensor(F32, [5]), vk.ValueList([3, 4, 5][:items])]
    blob = _graph(values, [vk.OperatorCall(2, "aten.sort.default", [0, 1, 2, 6])],
                  [0], [3])
    # sort is no Vulkan op: a blob holding it is refused at load (no lowering writes it).
    with pytest.raises(VkDelegateError, match=r"aten.sort.default is not supported"):
        load_reference(blob)


def test_multi_output_op_with_one_output_value():
    values = [vk.VkTensor(F32, [5]), vk.Int(0), vk.Bool(False), vk.VkTensor(F32, [5])]
    blob = _graph(values, [vk.OperatorCall(2, "aten.sort.default", [0, 1, 2, 3])], [0], [3])
    with pytest.raises(VkDelegateError, match=r"aten.sort.default is not supported"):
        load_reference(blob)


def test_constant_of_the_wrong_size():
    values = [vk.VkTensor(F32, [2, 3]), vk.VkTensor(F32, [2, 3], constant_id=0),
              vk.Int(1), vk.VkTensor(F32, [2, 3])]
    blob = _graph(values, [vk.OperatorCall(0, "aten.add.Tensor", [0, 1, 2, 3])], [0], [3],
                  constants=[vk.VkBytes(0, 8)])
    with pytest.raises(VkDelegateError, match=r"value 1: constant 0 holds 8 bytes, "
                                              r"float32\[2, 3\] needs 24"):
        load_reference(blob)


def test_symint_input_that_is_not_one_number():
    values = [vk.SymInt(2), vk.SymInt(3), vk.SymInt(0)]
    blob = _graph(values, [vk.OperatorCall(0, "mul", [0, 1, 2])], [0, 1], [2])
    assert load_reference(blob).execute([np.array(4), np.array(5)])[0] == 20
    with pytest.raises(VkDelegateError, match=r"input 0 \(value 0, a SymInt\) must be "
                                              r"one integer, got an array of shape \(2,\)"):
        load_reference(blob).execute([np.array([4, 4]), np.array(5)])


def test_output_that_is_no_array():
    values = [vk.VkTensor(F32, [2]), vk.VkTensor(F32, [3]), vk.ValueList([0, 1])]
    blob = _graph(values, [], [0, 1], [0, 2])
    with pytest.raises(VkDelegateError, match=r"output 1 \(value 2, a ValueList\) is not "
                                              r"one array"):
        load_reference(blob).execute([np.zeros(2, np.float32), np.zeros(3, np.float32)])
