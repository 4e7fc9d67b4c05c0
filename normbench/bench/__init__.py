"""The norm benchmark behind ``normbench bench``: the timing of each norm against PyTorch's own ops
(`timing`) and the goals its ratios are held to (`goals`).

Imports the model and the core. ``goals`` imports nothing, so the report reads bench CSVs against the
same numbers without loading torch.
"""
