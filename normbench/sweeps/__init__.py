"""Sweeps: the plan of a grid, the live view and closing account, and Hydra's multirun around them.

Imports training (for typed configs) and the core; never the report.
"""
