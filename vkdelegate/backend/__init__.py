"""Lowering: the operator registry, VulkanPartitioner, passes, to_backend, programs.

Modules here that the runtime reads (``registry``, ``ops``) import no torch."""
