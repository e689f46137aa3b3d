"""Runs one model on a peer Vulkan runtime; started by benchmarks/lavapipe_peers.py with
the Python of .venv-peers (tools/peers-venv.sh), never imported by vkdelegate.

    .venv-peers/bin/python benchmarks/peers/worker.py {ncnn,iree} DIR [--runs N]
        [--warmup W] [--iree-target llvmpipe]

DIR holds ``model.ts`` (TorchScript, traced by the caller: ncnn's converter pnnx reads
it), ``model.pt2`` (``torch.export.save``: IREE's turbine imports it) and
``input.npy`` (one input). Writes ``DIR/<peer>_out.npy`` (the output of the last run)
and prints one JSON line: {"times_ms": [...], "note": "..."}; wall-clock times of
whole calls, host array in and host array out, after the warm-up calls.

Both peers run fp32: ncnn with fp16 packing, storage and arithmetic switched off
(its Winograd and packed-layout convolutions stay on, as users run it); IREE compiled
for the Vulkan SPIR-V backend with ``--iree-vulkan-target`` (llvmpipe for lavapipe).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def _timed(fn, runs: int, warmup: int):
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def run_ncnn(d: Path, x: np.ndarray, runs: int, warmup: int):
    import ncnn
    import pnnx
    import torch

    pnnx.convert(str(d / "model.ts"), inputs=[torch.from_numpy(x)])
    net = ncnn.Net()
    net.opt.use_vulkan_compute = True
    for flag in ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic",
                 "use_bf16_storage"):
        setattr(net.opt, flag, False)
    net.load_param(str(d / "model.ncnn.param"))
    net.load_model(str(d / "model.ncnn.bin"))
    # ncnn's Mat has no batch dim: a batch-1 NCHW input is a CHW Mat, a 2-D input h x w.
    sample = x[0] if x.ndim == 4 else x

    def call():
        ex = net.create_extractor()
        ex.input("in0", ncnn.Mat(np.ascontiguousarray(sample)))
        _, out = ex.extract("out0")
        return np.array(out)

    times, out = _timed(call, runs, warmup)
    return times, out, f"ncnn {ncnn.__version__}, Vulkan, fp32"


def _iree_to_host(array) -> np.ndarray:
    """IREE 3.13's DeviceArray.to_host imports a numpy buffer as host memory, which
    lavapipe refuses (VK_EXT_external_memory_host needs 4096-byte alignment): copy
    through a mapped staging buffer instead (IREE's own non-import path)."""
    from iree.runtime import BufferUsage, HalFence, MemoryType

    source, device = array._buffer_view.get_buffer(), array._device
    host = device.allocator.allocate_buffer(
        memory_type=int(MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(BufferUsage.TRANSFER_TARGET | BufferUsage.MAPPING_SCOPED),
        allocation_size=source.byte_length())
    sem = device.create_semaphore(0)
    device.queue_copy(source, host, wait_semaphores=HalFence.create_at(sem, 0),
                      signal_semaphores=HalFence.create_at(sem, 1))
    HalFence.create_at(sem, 1).wait()
    return np.array(host.map().asarray(array._buffer_view.shape, array._get_raw_dtype()))


def run_iree(d: Path, x: np.ndarray, runs: int, warmup: int, target: str):
    import iree.compiler as compiler
    import iree.runtime as rt
    import iree.turbine.aot as aot
    import torch

    ep = torch.export.load(str(d / "model.pt2"))
    mlir = str(aot.export(ep).mlir_module)
    vmfb = compiler.compile_str(mlir, target_backends=["vulkan-spirv"],
                                extra_args=[f"--iree-vulkan-target={target}"])
    ctx = rt.SystemContext(config=rt.Config("vulkan"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    main = ctx.modules.module["main"]
    times, out = _timed(lambda: _iree_to_host(main(x)), runs, warmup)
    from importlib.metadata import version
    return times, out, (f"IREE {version('iree-base-runtime')} vulkan-spirv, "
                        f"--iree-vulkan-target={target}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("peer", choices=["ncnn", "iree"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iree-target", default="llvmpipe")
    args = ap.parse_args()
    x = np.load(args.dir / "input.npy")
    if args.peer == "ncnn":
        times, out, note = run_ncnn(args.dir, x, args.runs, args.warmup)
    else:
        times, out, note = run_iree(args.dir, x, args.runs, args.warmup, args.iree_target)
    np.save(args.dir / f"{args.peer}_out.npy", out)
    print(json.dumps({"times_ms": times, "note": note}))


if __name__ == "__main__":
    main()
