"""Training: the run's typed config (`config`), the loop (`loop`), its diagnostics, throughput,
checkpoints, stop signals, metric sinks, DDP, and the tools built on a training step (`bench`,
`coordcheck`).

Imports the model, the data and the core; nothing from sweeps or the report.
"""
