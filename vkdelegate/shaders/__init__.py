"""GLSL compute shader sources and the SPIR-V compiler with its on-disk cache."""
