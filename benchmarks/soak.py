"""Soak: host and device memory over many calls of a small CNN and EfficientNet-Lite0.

Every ``--every`` calls prints a row: calls so far, resident set (RSS, MiB), device
memory the program's allocators hold (MiB), and the heap usage VK_EXT_memory_budget
reports (MiB, "n/a" where the device lacks the extension, e.g. lavapipe); then the
growth per call after the warm-up, which should stay under 4 KiB (issue 9). Not a
timed test: run it on the device to check (``VKDELEGATE_DEVICE`` picks one).

    python benchmarks/soak.py [--calls 10000 1000] [--every 1000] [--models cnn effnet]
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch
import vulkan as vk
from tabulate import tabulate
from torch import nn

import vkdelegate
from vkdelegate.runtime.device import default_device

MIB = 2 ** 20


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc, else psutil)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


def budget_usage(device) -> int | None:
    """Bytes in use over all memory heaps per VK_EXT_memory_budget, or None."""
    if "VK_EXT_memory_budget" not in device.info.extensions:
        return None
    budget = vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT)
    props = vk.VkPhysicalDeviceMemoryProperties2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2, pNext=budget)
    vk.vkGetPhysicalDeviceMemoryProperties2(device.physical, props)
    return sum(budget.heapUsage[i] for i in range(props.memoryProperties.memoryHeapCount))


def allocator_bytes(program) -> int:
    """Device memory the program's built Vulkan delegates hold in blocks."""
    return sum(d.loaded.allocator.allocated_bytes
               for name in program.method_names for d in program.runner(name).delegates
               if d.loaded is not None and hasattr(d.loaded, "allocator"))


def small_cnn():
    """Conv-BN-ReLU, max pool, conv-ReLU, global mean, linear, softmax: the families
    of the issue's soak (conv, add, relu, mean reduction, linear, softmax)."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16),
                                   nn.ReLU(), nn.MaxPool2d(2))
            self.b = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            h = self.a(x)
            h = h + self.b(h)
            return torch.softmax(self.fc(h.mean(dim=(2, 3))), dim=-1)

    torch.manual_seed(0)
    return Net().eval(), torch.randn(1, 3, 32, 32)


def efficientnet():
    from vkdelegate.examples import efficientnet_lite as model_zoo

    model = model_zoo.load_model()
    return model, torch.from_numpy(model_zoo.preprocess(model_zoo.load_image()))


MODELS = {"cnn": ("small CNN", small_cnn), "effnet": ("EfficientNet-Lite0", efficientnet)}


def soak(name: str, make, calls: int, every: int, warmup: int, device) -> dict:
    model, x = make()
    program = vkdelegate.to_backend(torch.export.export(model, (x,)),
                                    vkdelegate.VulkanPartitioner())
    with torch.no_grad():
        eager = model(x)
    rows = []
    start = time.perf_counter()
    for i in range(1, warmup + calls + 1):
        out = program(x)
        if i == warmup:
            base_rss, base_dev, t0 = rss_bytes(), allocator_bytes(program), time.perf_counter()
        if i > warmup and ((i - warmup) % every == 0 or i == warmup + calls):
            used = budget_usage(device)
            rows.append([i - warmup, rss_bytes() / MIB, allocator_bytes(program) / MIB,
                         "n/a" if used is None else f"{used / MIB:.1f}"])
    elapsed = time.perf_counter() - t0
    diff = float((out - eager).abs().max())
    growth = (rss_bytes() - base_rss) / calls
    dev_growth = (allocator_bytes(program) - base_dev) / calls
    program.close()
    print(f"\n{name}: {calls} calls after {warmup} warm-up ({elapsed:.1f} s, "
          f"{1e3 * elapsed / calls:.2f} ms/call, total {time.perf_counter() - start:.1f} s), "
          f"max |diff| vs eager {diff:.2e}")
    print(tabulate(rows, headers=["calls", "RSS MiB", "allocator MiB", "heap usage MiB"],
                   floatfmt=".1f"))
    print(f"growth per call: RSS {growth / 1024:.2f} KiB, device allocator "
          f"{dev_growth / 1024:.2f} KiB (goal < 4 KiB)")
    return {"model": name, "calls": calls, "rss_growth_per_call": growth,
            "device_growth_per_call": dev_growth}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["cnn", "effnet"], choices=MODELS)
    ap.add_argument("--calls", type=int, nargs="+", default=[10000, 1000],
                    help="calls per model, in --models order (one value: all models)")
    ap.add_argument("--every", type=int, default=None,
                    help="calls between rows (default: a tenth of the calls)")
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    calls = args.calls * len(args.models) if len(args.calls) == 1 else args.calls
    if len(calls) != len(args.models):
        ap.error(f"--calls takes one value or one per model ({len(args.models)})")
    device = default_device()
    print(f"machine {platform.node()} ({os.cpu_count()} CPUs), device {device.info.name}, "
          f"driver {device.info.driver}, parameter blocks as "
          f"{'storage' if device.params_in_storage else 'uniform'} buffers")
    results = [soak(MODELS[m][0], MODELS[m][1], n, args.every or max(1, n // 10),
                    args.warmup, device)
               for m, n in zip(args.models, calls)]
    worst = max(r["rss_growth_per_call"] for r in results)
    print(f"\nworst RSS growth per call: {worst / 1024:.2f} KiB "
          f"({'under' if worst < 4096 else 'OVER'} the 4 KiB goal)")


if __name__ == "__main__":
    main()
