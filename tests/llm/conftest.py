"""Lowered tiny LLM programs, built once per test session and model kind."""
import pytest

from tests.llm.models import make_model
from tests.vulkan_skip import vulkan_unavailable

#: Cache positions: a 8-token prompt plus 64 new tokens fit.
MAX_SEQ_LEN = 80
_PROGRAMS = {}


@pytest.fixture(scope="session")
def lowered():
    """``lowered(kind)`` -> (HF model, LoweredProgram on Vulkan), built once."""
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("transformers")
    from vkdelegate.llm import lower

    def get(kind: str):
        if kind not in _PROGRAMS:
            model = make_model(kind)
            _PROGRAMS[kind] = (model, lower(model, MAX_SEQ_LEN))
        model, program = _PROGRAMS[kind]
        program.reset_state()
        return model, program
    return get



@pytest.fixture(scope="session")
def saved(lowered, tmp_path_factory):
    """(HF model, path of its lowered "llama" program saved with an empty cache): the
    file the CLI tests run."""
    model, program = lowered("llama")
    path = tmp_path_factory.mktemp("saved") / "llama.vkp"
    program.reset_state()
    program.save(path)
    return model, path
