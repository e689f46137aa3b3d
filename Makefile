# Two commands for users (see README): `make demo` and `make test`; CI also runs
# `make fuzz` (docs/FUZZING.md: each fuzz target for FUZZ_SECONDS seconds).
# Both first make sure the system packages and the virtual environment exist; re-running
# is fast because each step leaves a stamp that is newer than its inputs.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMPS := .stamps
# Vulkan loader, lavapipe (software Vulkan 1.3 driver), shader compiler and tools,
# the Khronos validation layer the tests run under, and flatc (the tests check that
# schema.fbs and the Python flatbuffer code agree by compiling the schema).
SYS_PACKAGES := python3 python3-venv libvulkan1 mesa-vulkan-drivers glslang-tools \
                spirv-tools vulkan-validationlayers vulkan-tools flatbuffers-compiler

FUZZ_SECONDS ?= 60

.PHONY: demo test fuzz setup system-packages clean bench et-venv et-efficientnet peers-venv bench-peers

demo: setup
	$(VENV)/bin/vkdelegate demo

# The fuzz extra too: tests/fuzzing runs the harness on its seeds (it skips without it).
test: setup $(VENV)/.fuzz-installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Seeds are rebuilt from the current code each time; a finding fails the target.
fuzz: setup $(VENV)/.fuzz-installed
	$(PY) -m fuzz.run --rebuild-seeds --seconds $(FUZZ_SECONDS) $(FUZZ_ARGS)

setup: $(STAMPS)/system $(VENV)/.installed

$(STAMPS)/system:
	@missing=""; for p in $(SYS_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "vkdelegate needs these Debian packages:$$missing"; \
	    echo "Install them as root:  apt-get install -y$$missing   then run make again."; \
	    exit 1; \
	  fi; \
	  echo "Installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(STAMPS) && touch $@

$(VENV)/.installed: setup.py pyproject.toml requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q -e '.[test,examples,quant]'
	@touch $@

$(VENV)/.fuzz-installed: $(VENV)/.installed setup.py
	$(PY) -m pip install -q -e '.[fuzz]'
	@touch $@

# ExecuTorch 1.5.1 in a virtual environment of its own (.venv-et) for the .pte interop
# tests; tools/et-venv.sh says why it is separate. Built only when missing.
et-venv:
	bash tools/et-venv.sh

# EfficientNet-Lite0 lowered by ExecuTorch's own VulkanPartitioner, run by `vkdelegate run`
# on the cat photo; prints the top-5 classes (docs/LOWERING.md, "ExecuTorch").
ET_OUT := build/et-efficientnet
et-efficientnet: setup et-venv
	mkdir -p $(ET_OUT)
	$(PY) tests/data/pte/efficientnet_lite.py $(ET_OUT)/efficientnet_lite0.pte $(ET_OUT)/cat.npy
	$(VENV)/bin/vkdelegate run $(ET_OUT)/efficientnet_lite0.pte --input arg0=$(ET_OUT)/cat.npy \
		--output-dir $(ET_OUT)
	$(PY) -c "import numpy as np; from vkdelegate.examples import efficientnet_lite as z; \
		[print(z.labels()[i], round(p, 4)) for i, p in z.top_k(np.load('$(ET_OUT)/output_0.npy'))]"

bench: setup
	$(PY) benchmarks/runtime_overhead.py

# ncnn-Vulkan and IREE-Vulkan in a virtual environment of their own (.venv-peers), and
# the side-by-side benchmark against them on the default Vulkan device (docs/PERF.md).
peers-venv:
	bash tools/peers-venv.sh

bench-peers: setup peers-venv
	$(PY) benchmarks/lavapipe_peers.py

clean:
	rm -rf $(VENV) .venv-et .venv-peers $(STAMPS) build *.egg-info
