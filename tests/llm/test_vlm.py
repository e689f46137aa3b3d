"""A tiny VLM (vision tower with a pooler + linear projector + Llama decoder) through
all four methods, with a padded pooler mask, against an eager reference of the same
splice: the valid soft tokens replace the image placeholder, padded rows are skipped."""
import pytest
import torch
from torch import nn

from tests.llm.conftest import MAX_SEQ_LEN
from tests.llm.models import TinyVision, make_model
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VkDelegateError
from vkdelegate.llm import generate, lower

IMAGE_TOKEN = 255


@pytest.fixture(scope="module")
def vlm():
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    model = make_model("llama", seed=4)
    torch.manual_seed(5)
    tower, projector = TinyVision().eval(), nn.Linear(32, 64)
    return model, tower, projector, lower(model, MAX_SEQ_LEN, vision=(tower, projector))


def _image(rows: int, seed: int = 0):
    """Patches of the top ``rows`` rows of a 4 x 4 grid: with rows <= 2 the pooler's
    lower two soft tokens get no patch (padded)."""
    gen = torch.Generator().manual_seed(seed)
    grid = [(r, c) for r in range(rows) for c in range(4)]
    pixels = torch.randn(1, len(grid), 48, generator=gen)
    return pixels, torch.tensor([grid], dtype=torch.int64)


def _eager_reference(model, tower, projector, prompt, image, n):
    with torch.no_grad():
        hidden, mask = tower(*image)
        rows = projector(hidden)[0][mask[0]]          # valid soft tokens only
        at = prompt.index(IMAGE_TOKEN)
        text = model.get_input_embeddings()(torch.tensor([prompt]))[0]
        embeds = torch.cat([text[:at], rows, text[at + 1:]]).unsqueeze(0)
        out = model.generate(inputs_embeds=embeds, max_new_tokens=n, min_new_tokens=n,
                             do_sample=False)
    return out[0, -n:].tolist(), int(mask.sum())


def test_vision_encoder_matches_eager(vlm):
    _, tower, projector, program = vlm
    for rows in (1, 2, 4):  # P = 4, 8, 16: dynamic
        image = _image(rows, seed=rows)
        embeds, mask = program.vision_encoder(*image)
        with torch.no_grad():
            hidden, want_mask = tower(*image)
            want = projector(hidden)
        assert mask.dtype == torch.bool and mask.tolist() == want_mask.tolist()
        assert int(mask.sum()) == (2 if rows <= 2 else 4)
        torch.testing.assert_close(embeds[mask], want[want_mask], rtol=1e-4, atol=1e-5)


def test_generate_with_padded_image(vlm):
    model, tower, projector, program = vlm
    prompt = [5, 17, IMAGE_TOKEN, 42, 9, 100]
    image = _image(2, seed=7)
    expected, valid = _eager_reference(model, tower, projector, prompt, image, 24)
    assert valid == 2  # two of the four soft tokens are padding
    assert generate(program, prompt, 24, image=image, image_token_id=IMAGE_TOKEN) == expected
    # A prompt that already holds one placeholder per valid soft token: same result.
    expanded = [5, 17, IMAGE_TOKEN, IMAGE_TOKEN, 42, 9, 100]
    assert generate(program, expanded, 24, image=image,
                    image_token_id=IMAGE_TOKEN) == expected


def test_image_errors(vlm):
    _, _, _, program = vlm
    image = _image(2)
    with pytest.raises(VkDelegateError, match="needs image_token_id"):
        generate(program, [1, IMAGE_TOKEN], 2, image=image)
    with pytest.raises(VkDelegateError, match="holds 0 image placeholders"):
        generate(program, [1, 2, 3], 2, image=image, image_token_id=IMAGE_TOKEN)
    with pytest.raises(VkDelegateError, match="cache positions"):
        generate(program, [1, IMAGE_TOKEN], MAX_SEQ_LEN, image=image,
                 image_token_id=IMAGE_TOKEN)


def test_cli_generate_with_an_image_file(vlm, tmp_path, capsys):
    """`vkdelegate generate --image`: the picture is cut into the 4 x 4 patches of
    3 x 4 x 4 pixels the tower takes; the ids equal generate() on those patches."""
    from PIL import Image

    from vkdelegate.cli import main
    from vkdelegate.cli.generate import image_patches

    _, _, _, program = vlm
    rng = torch.Generator().manual_seed(9)
    pixels = (torch.rand(20, 24, 3, generator=rng) * 255).to(torch.uint8).numpy()
    Image.fromarray(pixels).save(tmp_path / "pic.png")
    values, positions = image_patches(str(tmp_path / "pic.png"),
                                      program.methods["vision_encoder"].plan)
    assert values.shape == (1, 16, 48) and positions[0, 5].tolist() == [1, 1]
    program.save(tmp_path / "vlm.vkp")
    status = main(["generate", str(tmp_path / "vlm.vkp"), "--prompt-ids", "4,255,8",
                   "--image", str(tmp_path / "pic.png"), "--image-token-id", "255",
                   "--max-new-tokens", "8"])
    out, err = capsys.readouterr()
    assert status == 0, err
    expected = generate(program, [4, IMAGE_TOKEN, 8], 8, image=(values, positions),
                        image_token_id=IMAGE_TOKEN)
    assert out.split() == [str(t) for t in expected]
    assert "prefill: 6 tokens" in err  # 2 text tokens + 4 valid soft tokens
