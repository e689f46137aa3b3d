"""``vkdelegate inspect`` on crafted value graphs: a ValueList that contains itself,
deep nesting and exponential sharing are shown in bounded form, never recursed into
without end."""
from vkdelegate.cli import main
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import write_blob
from vkdelegate.serialization.describe import readable

F32 = vk.VkDataType.FLOAT32


def test_a_list_that_contains_itself_is_cut_off():
    graph = vk.VkGraph(values=[vk.VkTensor(F32, [2]), vk.ValueList([0, 1])])
    # Eight levels are shown, then the rest of the cycle as [...].
    assert readable(graph, 1) == "[%0:float32[2], " * 8 + "[...]" + "]" * 8


def test_deep_nesting_is_cut_off():
    values = [vk.Int(5)] + [vk.ValueList([i]) for i in range(10_000)]
    graph = vk.VkGraph(values=values)
    assert readable(graph, 10_000) == "[" * 8 + "[...]" + "]" * 8
    assert readable(graph, 3) == "[[[5]]]"


def test_shared_lists_do_not_blow_up():
    # Each list holds the previous one 16 times: 16**20 leaves if fully expanded.
    values = [vk.Int(1)] + [vk.ValueList([i] * 16) for i in range(20)]
    text = readable(vk.VkGraph(values=values), 20)
    assert len(text) < 20_000 and text.startswith("[[[[") and "..." in text


def _blob_with_cycle():
    values = [vk.VkTensor(F32, [2]), vk.ValueList([0, 1]), vk.VkTensor(F32, [2])]
    chain = [vk.OperatorCall(0, "aten.cat.default", [1, 2])]
    return write_blob(vk.VkGraph(values=values, chain=chain, input_ids=[0],
                                 output_ids=[2]))


def test_cli_on_a_cycle_prints_or_refuses_in_one_line(tmp_path, capsys):
    path = tmp_path / "cycle.vkblob"
    path.write_bytes(_blob_with_cycle())
    for extra in ([], ["--json"]):
        status = main(["inspect", str(path), *extra])
        out, err = capsys.readouterr()
        if status == 2:  # the blob reader refuses cycles
            assert err.startswith("vkdelegate inspect: error: ") and err.count("\n") == 1
            assert "value 1" in err
        else:
            assert status == 0 and "[...]" in out
