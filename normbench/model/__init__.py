"""The model: the norm zoo (`norms`), where a norm sits (`placements`), attention and MLP (`layers`),
the GPT and its initialisation (`gpt`), the fused CPU kernels (`kernels`) and the causality probe.

Imports only the core: nothing from data, training, sweeps or the report.
"""
