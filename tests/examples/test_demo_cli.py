"""`vkdelegate demo` as a user runs it: exit status, top-5 printout, errors."""
import re
import subprocess
import sys

import pytest

pytest.importorskip("efficientnet_lite_pytorch", reason="needs the examples extra")

from vkdelegate.cli import main  # noqa: E402
from tests.vulkan_skip import requires_vulkan


@requires_vulkan
def test_demo_classifies_a_user_image_file(tmp_path):
    import skimage.data
    import skimage.io

    image = tmp_path / "cat.png"
    skimage.io.imsave(image, skimage.data.chelsea())
    out = tmp_path / "prog.vkdp"
    proc = subprocess.run(
        [sys.executable, "-m", "vkdelegate", "demo", "--image", str(image), "--runs", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout
    rank1 = next(line for line in table.splitlines() if line.strip().startswith("1 "))
    assert rank1.count("Egyptian cat") == 2  # ours and eager
    assert re.search(r"\b(\d+) of \1 nodes delegated to Vulkan", table), table
    assert out.exists()


def test_demo_with_a_missing_image_exits_2_with_one_line(tmp_path, capsys):
    status = main(["demo", "--image", str(tmp_path / "missing.jpg"), "--runs", "1",
                   "--out", str(tmp_path / "p.vkdp")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and "missing.jpg" in err[0]


def test_demo_rejects_zero_runs(capsys):
    assert main(["demo", "--runs", "0"]) == 2
    assert "--runs must be at least 1" in capsys.readouterr().err
