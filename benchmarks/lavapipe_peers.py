"""vkdelegate against the Vulkan peers a user would pick instead, on the same device
in one run: ncnn-Vulkan (fp32) and IREE-Vulkan, plus eager PyTorch on the CPU.

Models: EfficientNet-Lite0 (real ImageNet weights, the cat photo, batch 1), a small
conv net (4 convolutions, pooling, a classifier; 1 x 3 x 64 x 64) and an MLP
(64 x 256 -> 1024 -> 1024 -> 256, ReLU). Each is exported once here; the peers run in
their own virtual environment (``make peers-venv``, tools/peers-venv.sh) through
benchmarks/peers/worker.py in a subprocess: ncnn reads a TorchScript trace through
pnnx, IREE a ``torch.export.save`` file through iree-turbine. Every backend's output is
compared with eager (max |diff| column); times are whole calls, host arrays in and out,
median and p10-p90 of ``--runs`` after a warm-up; the ratio column is
vkdelegate / peer (below 1: we are faster). Prints a table and writes JSON.

    python benchmarks/lavapipe_peers.py [--model efficientnet convnet mlp] [--runs 10]
        [--peers ncnn iree] [--iree-target llvmpipe] [--rounds 1] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from efficientnet import stats, timed  # noqa: E402

import vkdelegate  # noqa: E402
from vkdelegate.runtime.device import default_device  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: The peers' interpreter: ``--peers-python``, else this checkout's .venv-peers (a git
#: worktree without one may point at the main checkout's).
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
WORKER = Path(__file__).resolve().parent / "peers" / "worker.py"


class SmallConvNet(torch.nn.Module):
    """conv3x3 16 -> pool -> conv3x3 32 -> pool -> conv3x3 64 -> conv1x1 64 -> global
    average -> linear 10, ReLU after each convolution."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.c3, self.c4 = nn.Conv2d(32, 64, 3, padding=1), nn.Conv2d(64, 64, 1)
        self.pool, self.fc = nn.MaxPool2d(2), nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.c1(x)))
        x = self.pool(torch.relu(self.c2(x)))
        x = torch.relu(self.c4(torch.relu(self.c3(x))))
        return self.fc(x.mean(dim=(2, 3)))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.a, self.b, self.c = nn.Linear(256, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _efficientnet():
    from vkdelegate.examples import efficientnet_lite as zoo
    return zoo.load_model(), torch.from_numpy(zoo.preprocess(zoo.load_image()))


def _seeded(cls, shape):
    torch.manual_seed(0)
    return cls().eval(), torch.randn(*shape)


MODELS = {
    "efficientnet": ("EfficientNet-Lite0, 1x3x224x224", _efficientnet),
    "convnet": ("small conv net, 1x3x64x64", lambda: _seeded(SmallConvNet, (1, 3, 64, 64))),
    "mlp": ("MLP 64x256-1024-1024-256", lambda: _seeded(Mlp, (64, 256))),
}


def run_peer(peer: str, d: Path, args) -> "tuple[list, str, np.ndarray] | str":
    """(times, note, output) from the worker, or the reason it failed."""
    if not PEERS_PYTHON.exists():
        return "no .venv-peers (make peers-venv)"
    cmd = [str(PEERS_PYTHON), str(WORKER), peer, str(d), "--runs", str(args.runs),
           "--warmup", str(args.warmup), "--iree-target", args.iree_target]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return f"failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:120]}"
    result = json.loads(lines[-1])
    return result["times_ms"], result["note"], np.load(d / f"{peer}_out.npy")


def bench_model(key: str, args, results: dict, rows: list) -> None:
    title, build = MODELS[key]
    model, x = build()
    with torch.no_grad():
        eager = model(x).numpy()
    ep = torch.export.export(model, (x,))
    program = vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner())
    ours_rounds = [timed(lambda: program(x), args.runs, args.warmup)]
    measured = {"vkdelegate (Vulkan)": (ours_rounds[0], str(program.report.summary()),
                                        program(x).numpy())}
    with torch.no_grad():
        measured["eager PyTorch CPU"] = (timed(lambda: model(x), args.runs, args.warmup),
                                         f"{torch.get_num_threads()} threads", eager)
    peer_rounds: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        with torch.no_grad():
            torch.jit.trace(model, (x,)).save(str(d / "model.ts"))
        torch.export.save(ep, str(d / "model.pt2"))
        np.save(d / "input.npy", x.numpy())
        for round_ in range(args.rounds):
            if round_:  # ours again, right before the peers of this round
                ours_rounds.append(timed(lambda: program(x), args.runs, args.warmup))
            for peer in args.peers:
                got = run_peer(peer, d, args)
                name = {"ncnn": "ncnn-Vulkan fp32", "iree": "IREE-Vulkan"}[peer]
                if isinstance(got, str):
                    if not round_:
                        rows.append((title, name, "-", "-", "-", "-", got))
                        results["rows"].append({"model": key, "backend": name,
                                                "error": got})
                    continue
                peer_rounds.setdefault(name, []).append(got[0])
                measured[name] = (sum(peer_rounds[name], []),) + got[1:]
    program.close()
    measured["vkdelegate (Vulkan)"] = (sum(ours_rounds, []),) + \
        measured["vkdelegate (Vulkan)"][1:]
    ours = stats(measured["vkdelegate (Vulkan)"][0])["median_ms"]
    for name, rounds in peer_rounds.items():
        # Per round: our median over the peer's, measured back to back (the machine's
        # load drifts between rounds); the median of those ratios.
        ratios = [stats(o)["median_ms"] / stats(t)["median_ms"]
                  for o, t in zip(ours_rounds, rounds)]
        results.setdefault("round_ratios", {})[f"{key} / {name}"] = ratios
        print(f"{title}, ours / {name} per round: "
              f"{', '.join(f'{r:.2f}' for r in ratios)}; median "
              f"{float(np.median(ratios)):.2f}")
    for name, (times, note, out) in measured.items():
        s = stats(times)
        diff = float(np.abs(out.reshape(eager.shape) - eager).max())
        rows.append((title, name, f"{s['median_ms']:.2f}",
                     f"{s['p10_ms']:.2f}-{s['p90_ms']:.2f}", f"{ours / s['median_ms']:.2f}",
                     f"{diff:.1e}", note))
        results["rows"].append({"model": key, "backend": name, **s, "max_abs_diff": diff,
                                "ours_over_this": ours / s["median_ms"], "note": note})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    ap.add_argument("--peers", nargs="+", choices=["ncnn", "iree"], default=["ncnn", "iree"])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure ours and each peer back to back this many times; "
                         "prints the per-round ratios (load drifts between rounds)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iree-target", default="llvmpipe",
                    help="--iree-vulkan-target for IREE (llvmpipe for lavapipe)")
    ap.add_argument("--json", default="out/lavapipe_peers.json")
    ap.add_argument("--peers-python", type=Path, default=None,
                    help="the peers' virtual environment's python (default: .venv-peers here)")
    args = ap.parse_args()
    if args.peers_python is not None:
        globals()["PEERS_PYTHON"] = args.peers_python
    device = default_device()
    results = {"machine": platform.node(), "vulkan_device": device.info.name,
               "driver": device.info.driver, "torch": torch.__version__, "rows": []}
    rows: list = []
    for key in args.model:
        bench_model(key, args, results, rows)
    print(f"\nVulkan device: {device.info.name} ({device.info.driver}), "
          f"torch {torch.__version__}")
    print(tabulate(rows, headers=("model", "backend", "median ms", "p10-p90 ms",
                                  "vkdelegate / this", "max |diff| to eager", "note")))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
