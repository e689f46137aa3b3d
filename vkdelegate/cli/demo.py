"""``vkdelegate demo [efficientnet|minilm]``: a real model on Vulkan, end to end.

``efficientnet`` (the default) classifies a photo with EfficientNet-Lite0; ``minilm``
ranks sentences by similarity with all-MiniLM-L6-v2 (vkdelegate/cli/demo_minilm.py).

Steps: build the model with its ImageNet weights, export it with torch.export, lower it
with ``to_backend(ep, VulkanPartitioner())`` (every node must be delegated), save the
program file, load it back, classify the image with the loaded program and with eager
PyTorch, and print both top-5 lists, the largest absolute logit difference and the
median latency of each.
"""
from __future__ import annotations

import os
import statistics
import time

from vkdelegate.cli import help_description
from vkdelegate.errors import VkDelegateError


def register(sub) -> None:
    p = sub.add_parser("demo", help="run a real model on Vulkan (EfficientNet-Lite0 "
                       "or all-MiniLM-L6-v2) and compare with eager PyTorch",
                       description=help_description(__doc__))
    p.add_argument("model", nargs="?", choices=("efficientnet", "minilm"),
                   default="efficientnet", help="which demo (default: %(default)s)")
    p.add_argument("--image", metavar="PATH",
                   help="image file to classify (default: scikit-image's 'chelsea' cat)")
    p.add_argument("--out", metavar="FILE",
                   help="where to save the lowered program (default: "
                        "out/efficientnet_lite0.vkdp or out/minilm.vkdp)")
    p.add_argument("--runs", type=int, default=10,
                   help="timed runs for the median latency (default: %(default)s)")
    p.add_argument("--device", metavar="N", type=int,
                   help="Vulkan device index, as `vkdelegate devices` lists them (default: "
                        "$VKDELEGATE_DEVICE, an index or name substring, else the best "
                        "device)")
    p.set_defaults(func=run)


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(args) -> int:
    if args.runs < 1:
        raise VkDelegateError(f"--runs must be at least 1, got {args.runs}")
    if args.model == "minilm":
        from vkdelegate.cli import demo_minilm

        args.out = args.out or "out/minilm.vkdp"
        return demo_minilm.run(args)
    args.out = args.out or "out/efficientnet_lite0.vkdp"
    from tabulate import tabulate
    from tqdm import tqdm

    from vkdelegate.examples import efficientnet_lite as model_zoo
    from vkdelegate.runtime.device import default_device

    # Bad arguments fail before the slow steps: the image, then the device.
    image = model_zoo.load_image(args.image)
    device = default_device(args.device).info.name
    steps = tqdm(total=6, desc="demo", unit="step", leave=False, disable=None)
    try:
        program, report, ours, eager, ours_ms, eager_ms = _pipeline(args, image, steps)
    finally:
        steps.close()

    labels = model_zoo.labels()
    ours_top = model_zoo.top_k(ours.numpy())
    eager_top = model_zoo.top_k(eager.numpy())
    rows = [(i + 1, labels[a], f"{pa:.4f}", labels[b], f"{pb:.4f}")
            for i, ((a, pa), (b, pb)) in enumerate(zip(ours_top, eager_top))]
    diff = float((ours - eager).abs().max())
    print(f"EfficientNet-Lite0 on {args.image or 'skimage.data.chelsea()'}, "
          f"program saved to {args.out} ({os.path.getsize(args.out) / 2**20:.1f} MiB)")
    print(f"{report.summary()}")
    print(tabulate(rows, headers=("#", f"vkdelegate ({device})", "p", "eager PyTorch (CPU)",
                                  "p")))
    print(f"max |logit difference|: {diff:.2e}")
    print(f"median latency over {args.runs} runs: vkdelegate {ours_ms:.1f} ms, "
          f"eager PyTorch {eager_ms:.1f} ms")
    program.close()
    if [a for a, _ in ours_top] != [b for b, _ in eager_top]:
        raise VkDelegateError("top-5 differs between vkdelegate and eager PyTorch")
    return 0


def _pipeline(args, image, steps):
    """Export, lower, save, load, build and time; ``steps`` is the progress bar.
    Returns (loaded program, partition report, our logits, eager logits, our median
    ms, eager median ms)."""
    import torch

    import vkdelegate
    from vkdelegate.examples import efficientnet_lite as model_zoo

    def step(text):
        steps.set_description(text)
        steps.update(1)

    x = torch.from_numpy(model_zoo.preprocess(image))
    model = model_zoo.load_model()
    step("exporting")
    ep = torch.export.export(model, (x,))
    step("lowering")
    lowered = vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner())
    report = lowered.report
    if report.cpu_nodes:
        raise VkDelegateError("not every node was delegated to Vulkan:\n" + str(report))
    step("saving")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    lowered.save(args.out)
    lowered.close()
    step("loading")
    program = vkdelegate.load(args.out, device=args.device)
    step("building on the device")
    program.build(progress=True)  # compiles shaders, uploads weights, records commands
    ours = program(x)
    step("running")
    with torch.no_grad():
        eager = model(x)
    ours_ms = _median_ms(lambda: program(x), args.runs)
    with torch.no_grad():
        eager_ms = _median_ms(lambda: model(x), args.runs)
    return program, report, ours, eager, ours_ms, eager_ms
