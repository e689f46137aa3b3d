"""Operators: the registry and the op families that declare and implement them.

Data flow: the partitioner (vkdelegate/backend/) asks the registry which nodes run on
Vulkan; the serializer writes them; the runtime (vkdelegate/runtime/) builds each node
through the implementation the registry holds, injected as an ``OpTable``
(``vkdelegate.ops.default_table``). This package sits between the two and imports
neither torch nor the backend:

- ``registry``: ``OpSpec``/``NodeSpec``/``TensorSpec`` and ``register``/``lookup``;
- ``families/``: one module per op family (its OpSpecs next to its dispatch code);
  importing ``vkdelegate.ops.families`` registers every op;
- ``load_checks``: the load-time checks of a blob's nodes against the registry;
- ``default_table``: the runtime's default op table;
- ``coverage``: docs/OPS.md, generated from the registry.

Families share code through ``vkdelegate.kernels``, never by importing each other.
"""
