"""The runtime layer runs without torch: import and execute with torch made unimportable."""
import subprocess
import sys
import textwrap

import pytest

from tests.vulkan_skip import requires_vulkan, vulkan_unavailable


@requires_vulkan
def test_runtime_runs_without_torch():
    code = textwrap.dedent("""
        import sys
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
                return None
        sys.meta_path.insert(0, NoTorch())
        import numpy as np
        import vkdelegate.runtime
        from vkdelegate.serialization import vkgraph as g
        from vkdelegate.runtime import DelegateGraph
        vals = [g.VkTensor(g.VkDataType.FLOAT32, [4]), g.VkTensor(g.VkDataType.FLOAT32, [4])]
        graph = g.VkGraph(chain=[g.OperatorCall(0, "aten.relu.default", [0, 1])],
                          values=vals, input_ids=[0], output_ids=[1])
        with DelegateGraph(graph, lambda i: b"") as dg:
            out = dg.execute([np.array([-1, 2, -3, 4], np.float32)])[0]
        assert out.tolist() == [0, 2, 0, 4], out
        assert "torch" not in sys.modules
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")



def test_llm_generate_runs_without_torch(tmp_path):
    """A saved LLM program generates without torch (vkdelegate.llm.generate and the
    CLI): the same greedy and sampled tokens as with torch (draws are numpy's MT19937,
    bit for bit torch's CPU generator); lower and the other torch parts say in one
    line that they need it."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("transformers")
    from tests.llm.models import make_model
    from vkdelegate.llm import generate, lower

    program = lower(make_model("llama"), 40)
    path = tmp_path / "llama.vkp"
    program.save(path)
    greedy = generate(program, [3, 1, 4, 1, 5], 12)
    program.reset_state()
    sampled = generate(program, [3, 1, 4, 1, 5], 12, temperature=0.9, top_k=20, seed=7)
    program.close()
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # as when torch is not installed
        import vkdelegate
        from vkdelegate.cli import main
        from vkdelegate.llm import generate
        program = vkdelegate.load({str(path)!r})
        print(generate(program, [3, 1, 4, 1, 5], 12))
        program.reset_state()
        print(generate(program, [3, 1, 4, 1, 5], 12, temperature=0.9, top_k=20, seed=7))
        try:
            from vkdelegate.llm import lower
        except ModuleNotFoundError as exc:
            assert exc.name == "torch", exc.name
            print(exc)
        assert main(["generate", {str(path)!r}, "--prompt-ids", "3,1,4,1,5",
                     "--max-new-tokens", "12"]) == 0
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == str(greedy) and lines[1] == str(sampled)
    assert "vkdelegate.llm.lower needs the Python package 'torch'" in lines[2]
    assert lines[3].split() == [str(t) for t in greedy]  # the CLI's streamed ids


def test_draws_equal_torchs_generator():
    torch = pytest.importorskip("torch")
    from vkdelegate.llm import draws

    for seed in (0, 1, 77, 2 ** 31 - 1, 2 ** 32 - 1, 2 ** 32 + 5, 2 ** 40 + 3):
        gen = torch.Generator().manual_seed(seed)
        ours = draws(seed)
        for _ in range(50):
            assert next(ours) == float(torch.rand((), generator=gen, dtype=torch.float64))
