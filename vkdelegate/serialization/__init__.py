"""The delegate blob: VH00 header, VK00 flatbuffer (VkGraph), constants, and the
fx-graph -> VkGraph builder."""
