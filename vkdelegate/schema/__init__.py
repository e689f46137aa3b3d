"""schema.fbs: the VkGraph flatbuffer schema, the one source of truth for the wire format."""
