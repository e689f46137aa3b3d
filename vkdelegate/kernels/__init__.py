"""Kernels shared by several op families (vkdelegate/ops/families/).

An op family (one module under ops/families/) registers its ops and records their
dispatches; the pieces more than one family needs live here, public and documented,
so that families import kernels and never each other (tests/backend/test_layering.py
checks it):

- ``workgroup``: workgroup shapes for 3-D grids.
- ``loop_limit``: llvmpipe's shader loop budget, as builders check it.
- ``rows``: one output per row of a reduction, in its per-invocation or cooperative
  form (sum, the other reductions, softmax).
- ``gemm``: the one GEMM entry point and its kernel selection (mm, bmm, addmm, linear,
  and the pointwise convolution's channel loop).
- ``affine_copy``: the strided copy every data-movement op is built on.
- ``broadcast``: broadcast shapes and index plans of elementwise ops.
- ``elementwise``: operand dtype promotion and loads of elementwise shaders.
- ``plane_grid``: the (column, row, plane) grid of 2-D window shaders.
- ``dims``: ATen's dim wrapping.

Torch-free; importing a kernel registers no op.
"""
