"""Sweeps: the plan of a grid, the local launcher's workers, the live view and closing account, and
Hydra's multirun around them (normbench's Hydra plugins, hydra_plugins/normbench_plugins, call in here).

Imports training (for typed configs) and the core; never the report.
"""
