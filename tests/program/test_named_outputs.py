"""Methods that return HF ModelOutput records or namedtuples (a SigLIP vision tower
returns ``BaseModelOutputWithPooling``: lowering refused it as an unsupported
container until 2026-12-05). A loaded program returns a ``Record`` (keys, attributes,
int indices, as ModelOutput allows) or a namedtuple of the same name and fields.
torch.return_types (``torch.topk``'s result) come back as that class for torch
inputs and as a namedtuple of the same name and fields for numpy inputs."""
import collections
import json

import numpy as np
import pytest
import torch

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
from vkdelegate.backend.pytree_spec import Record
from vkdelegate.cli import main
from vkdelegate.serialization import program_file

from tests.vulkan_skip import vulkan_unavailable

Pair = collections.namedtuple("Pair", ["scores", "mean"])


class NamedTupleOut(torch.nn.Module):
    def forward(self, x):
        s = torch.softmax(x, dim=-1)
        return Pair(s, s.mean(dim=0))


def _siglip():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.SiglipVisionConfig(hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4,
                                             image_size=32, patch_size=8)
    return transformers.SiglipVisionModel(config).eval()


def test_hf_model_output_record(tmp_path):
    """A real HF vision tower, fully delegated, its ModelOutput back as a Record that
    reads like the eager one, before and after save / load."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    model = _siglip()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    program = to_backend(torch.export.export(model, (x,)), VulkanPartitioner())
    assert "0 on CPU" in str(program.report)
    program.save(tmp_path / "siglip.vkp")
    with torch.no_grad():
        want = model(x)
    for p in (program, vkdelegate.load(tmp_path / "siglip.vkp")):
        got = p(x)
        assert isinstance(got, Record) and got.record_name == type(want).__name__
        assert list(got) == list(want.keys())
        for key in want.keys():
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=1e-4,
                                   atol=1e-5)
        torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
        assert len(got[:2]) == 2
        # A pytree node of torch's: tree_leaves reaches the tensors.
        from torch.utils import _pytree
        assert len(_pytree.tree_leaves(got)) == len(want.keys())
        with pytest.raises(AttributeError, match="has no field 'logits'"):
            got.logits
        # Outputs a user keeps: pickled and copied as they are.
        import copy
        import pickle
        for again in (pickle.loads(pickle.dumps(got)), copy.deepcopy(got)):
            assert isinstance(again, Record) and again.record_name == got.record_name
            torch.testing.assert_close(again.pooler_output, got.pooler_output)


@pytest.mark.parametrize("executor", ["vulkan", "reference"])
def test_namedtuple_output(tmp_path, executor):
    if executor == "vulkan" and vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    program = to_backend(torch.export.export(NamedTupleOut(), (x,)),
                         VulkanPartitioner({"executor": executor}))
    program.save(tmp_path / "p.vkp")
    want = NamedTupleOut()(x)
    got = vkdelegate.load(tmp_path / "p.vkp")(x)
    assert type(got).__name__ == "Pair" and got._fields == ("scores", "mean")
    torch.testing.assert_close(got.scores, want.scores)
    scores, mean = got
    torch.testing.assert_close(mean, want.mean)


class TopK(torch.nn.Module):
    def forward(self, x):
        return torch.topk(x, 3)


class SortAndMax(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1, descending=True), x.max(dim=1)


@pytest.mark.parametrize("executor", ["vulkan", "reference"])
@pytest.mark.parametrize("module", [TopK(), SortAndMax()], ids=["topk", "sort_max"])
def test_torch_return_types_output(tmp_path, executor, module):
    """torch.return_types results returned as they are (refused at lowering as an
    unsupported container until 2027-01): the same class for torch inputs, a
    namedtuple of the same name and fields for numpy ones, before and after save /
    load; vkdelegate run names the files by field."""
    if executor == "vulkan" and vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    program = to_backend(torch.export.export(module, (x,)),
                         VulkanPartitioner({"executor": executor}))
    program.save(tmp_path / "p.vkp")
    want = module(x)
    want = want if isinstance(want, tuple) and not hasattr(want, "values") else (want,)
    for p in (program, vkdelegate.load(tmp_path / "p.vkp")):
        got = p(x)
        got = got if type(got) is tuple else (got,)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert type(g) is type(w)
            torch.testing.assert_close(g.values, w.values)
            torch.testing.assert_close(g[1], w[1])
        from_numpy = p(x.numpy())
        from_numpy = from_numpy if type(from_numpy) is tuple else (from_numpy,)
        for g, w in zip(from_numpy, want):
            assert type(g).__name__ == type(w).__name__ and g._fields == w.__match_args__
            values, indices = g
            np.testing.assert_array_equal(values, w.values.numpy())
            np.testing.assert_array_equal(g.indices, w.indices.numpy())
    if isinstance(module, TopK):
        np.save(tmp_path / "x.npy", x.numpy())
        assert main(["run", str(tmp_path / "p.vkp"), "--input", f"x={tmp_path / 'x.npy'}",
                     "--output-dir", str(tmp_path / "out")]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / "out" / "output_indices.npy"),
                                      want[0].indices.numpy())


def _crafted(tmp_path, edit):
    x = torch.randn(3, 5)
    program = to_backend(torch.export.export(NamedTupleOut(), (x,)),
                         VulkanPartitioner({"executor": "reference"}))
    program.save(tmp_path / "p.vkp")
    manifest, segments = program_file.read_program(tmp_path / "p.vkp")
    edit(manifest["methods"]["forward"]["plan"]["out_spec"])
    program_file.write_program(tmp_path / "c.vkp", manifest, [bytes(s) for s in segments])
    return tmp_path / "c.vkp"


@pytest.mark.parametrize("edit, words", [
    (lambda s: s.update(n="os.system"), "not a Python identifier"),
    (lambda s: s.update(n="class"), "not a Python identifier"),
    (lambda s: s.update(n="A" * 300), "not a Python identifier"),
    (lambda s: s.update(k=["_x", "mean"]), "fields"),
    (lambda s: s.update(k=["mean", "mean"]), "bad namedtuple keys"),
    (lambda s: s.update(t="record", n="Out\n"), "not a Python identifier"),
    (lambda s: s.update(t="module"), "malformed tree spec"),
    (lambda s: s.update(t="structseq", n="__class__", k=["scores", "scores"]),
     "bad structseq keys"),
    (lambda s: s.update(t="structseq", n="os.system"), "not a Python identifier"),
])
def test_crafted_names_are_refused_at_load(tmp_path, edit, words):
    path = _crafted(tmp_path, edit)
    with pytest.raises(VkDelegateError, match=words) as info:
        vkdelegate.load(path)
    assert "\n" not in str(info.value)


class Keyed(torch.nn.Module):
    def forward(self, x):
        return {"a/b": x + 1, "../up": x * 2, "a.b": x - 1}


def test_run_cli_output_names_stay_in_the_folder(tmp_path, capsys):
    """Output keys become file names: '/' and '.' of a key are '_' (a key read from a
    program file cannot name a path outside --output-dir), repeats get ~N."""
    x = torch.randn(2, 3)
    to_backend(torch.export.export(Keyed(), (x,)),
               VulkanPartitioner({"executor": "reference"})).save(tmp_path / "p.vkp")
    np.save(tmp_path / "x.npy", x.numpy())
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "p.vkp"), "--input", f"x={tmp_path / 'x.npy'}",
                 "--output-dir", str(out)]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["output____up.npy", "output_a_b.npy", "output_a_b~1.npy"], files
    want = Keyed()(x)
    np.testing.assert_array_equal(np.load(out / "output_a_b.npy"), want["a/b"].numpy())
    np.testing.assert_array_equal(np.load(out / "output_a_b~1.npy"), want["a.b"].numpy())
    np.testing.assert_array_equal(np.load(out / "output____up.npy"), want["../up"].numpy())
    assert json.dumps(files)  # plain names
