"""Real models used by the demo, its test and the benchmarks (need the `examples` extra)."""
