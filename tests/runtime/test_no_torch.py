"""The runtime layer runs without torch: import and execute with torch made unimportable."""
import subprocess
import sys
import textwrap

from tests.vulkan_skip import requires_vulkan


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


def test_llm_package_without_torch_says_what_it_needs():
    # torch missing (None in sys.modules: ModuleNotFoundError, as when not installed):
    # one message naming torch and what still runs, not a traceback from generate.py.
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        try:
            import vkdelegate.llm
        except ModuleNotFoundError as exc:
            assert exc.name == "torch", exc.name
            print(exc)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "vkdelegate.llm needs the Python package 'torch'" in result.stdout
    assert "program.run('prefill'" in result.stdout
