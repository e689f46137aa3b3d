"""Crafted blobs of the paired decode ops (vkdelegate.rotary_half_pair,
vkdelegate.rotary_index_put_pair,
vkdelegate.index_put_pair): a program file is untrusted, so their rules run at load and
refuse mismatched arguments before anything is recorded."""
import pytest

from tests.runtime.graphs import GraphMaker
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import load_delegate
from vkdelegate.serialization import vkgraph as g


def _pair_node(m, name, args, shapes, dtype="float32"):
    """Append a two-output node: its output is a ValueList of two tensors."""
    outs = [m.tensor(s, dtype) for s in shapes]
    m.graph.values.append(g.ValueList(outs))
    lst = len(m.graph.values) - 1
    m.graph.chain.append(g.OperatorCall(len(m.graph.chain), name, list(args) + [lst]))
    for o in outs:
        m.output(o)


def _rotary(q_shape, k_shape, f_shape, s_shape=None, k_dtype="float32"):
    m = GraphMaker()
    q, k = m.input(q_shape), m.input(k_shape, k_dtype)
    c, s = m.input(f_shape), m.input(s_shape or f_shape)
    _pair_node(m, "vkdelegate.rotary_half_pair.default", [q, k, c, s], [q_shape, k_shape])
    return m.blob()


def test_rotary_half_pair_blob_checks(vk_device):
    load_delegate(_rotary((1, 4, 1, 8), (1, 2, 1, 8), (1, 1, 1, 8)))
    for blob, match in (
            (_rotary((1, 4, 1, 7), (1, 2, 1, 7), (1, 1, 1, 7)), "even last dim"),
            (_rotary((1, 4, 1, 8), (1, 2, 1, 6), (1, 1, 1, 8)), "one dtype and last dim"),
            (_rotary((1, 4, 1, 8), (1, 2, 1, 8), (1, 1, 2, 8)), "do not broadcast"),
            (_rotary((1, 4, 1, 8), (1, 2, 1, 8), (1, 1, 1, 8), (1, 1, 1, 4)),
             "cos and sin"),
            (_rotary((1, 4, 1, 8), (1, 2, 1, 8), (1, 1, 1, 8), k_dtype="float16"),
             "dtype")):
        with pytest.raises(VkDelegateError, match=match):
            load_delegate(blob)


def _index_put(x_shape, x2_shape, v_shape, v2_shape, index_dtype="int64", indices=None):
    m = GraphMaker()
    x, x2 = m.input(x_shape), m.input(x2_shape)
    i = m.input((1,), index_dtype)
    v, v2 = m.input(v_shape), m.input(v2_shape)
    none = m.scalar(None)
    m.graph.values.append(g.ValueList(indices(none, i) if indices else [none, none, i]))
    lst = len(m.graph.values) - 1
    _pair_node(m, "vkdelegate.index_put_pair.default", [x, x2, lst, v, v2],
               [x_shape, x2_shape])
    return m.blob()


def test_index_put_pair_blob_checks(vk_device):
    c, v = (1, 2, 8, 4), (1, 2, 1, 4)
    load_delegate(_index_put(c, c, v, v))
    for blob, match in (
            (_index_put(c, (1, 2, 8, 2), v, v), "differ"),
            (_index_put(c, c, v, (1, 2, 1, 2)), "values"),
            (_index_put(c, c, (1, 2, 2, 4), (1, 2, 2, 4)), "values"),
            (_index_put(c, c, v, v, index_dtype="float32"), "dtype"),
            (_index_put(c, c, v, v, indices=lambda n, i: [n, i, i]), "index tensors")):
        with pytest.raises(VkDelegateError, match=match):
            load_delegate(blob)


def _rotary_put(q_shape, k_shape, v_shape, c_shape=(1, 2, 8, 4), f_shape=(1, 1, 1, 4)):
    m = GraphMaker()
    q, k, c, s = m.input(q_shape), m.input(k_shape), m.input(f_shape), m.input(f_shape)
    x, x2 = m.input(c_shape), m.input(c_shape)
    i, v = m.input((1,), "int64"), m.input(v_shape)
    none = m.scalar(None)
    m.graph.values.append(g.ValueList([none, none, i]))
    lst = len(m.graph.values) - 1
    _pair_node(m, "vkdelegate.rotary_index_put_pair.default", [q, k, c, s, x, x2, lst, v],
               [q_shape, c_shape, c_shape])
    return m.blob()


def test_rotary_index_put_pair_blob_checks(vk_device):
    q, kv = (1, 4, 1, 4), (1, 2, 1, 4)
    load_delegate(_rotary_put(q, kv, kv))
    for blob, match in (
            (_rotary_put(q, (1, 2, 2, 4), (1, 2, 2, 4)), "values"),
            (_rotary_put(q, kv, (1, 2, 1, 2)), "values"),
            (_rotary_put(q, kv, kv, f_shape=(1, 1, 2, 4)), "do not broadcast"),
            (_rotary_put((1, 4, 1, 6), (1, 2, 1, 6), (1, 2, 1, 6), c_shape=(1, 2, 8, 6),
                         f_shape=(1, 1, 1, 5)), "cos"),
            (_rotary_put(q, kv, kv, c_shape=(1, 2, 8, 2)), "values")):
        with pytest.raises(VkDelegateError, match=match):
            load_delegate(blob)
