"""Training: the run's typed config (`config`), the loop (`loop`), its diagnostics, throughput,
checkpoints, stop signals, metric sinks and DDP.

Imports the model, the data and the core; nothing from sweeps or the report.
"""
