"""normbench: measured answers to "LayerNorm or RMSNorm? pre or post?" on small GPT models.

The stable public API for extending it from your own code, whatever the package's inner layout::

    from normbench import register_norm, register_placement, Block

A norm is an ``nn.Module`` built as ``cls(dim, **options)`` with a ``statistics`` attribute ("token",
"batch" or None); a placement subclasses ``Block``, built from a ``BlockSpec`` (the model's config,
the block's layer) and a ``make_norm(position)`` factory. docs/extending.md has the whole contract,
the ways to tell normbench about them (your config folder, entry points) and ``normbench check``.

Names are imported on first use, so ``import normbench`` (and the report, which imports no torch)
stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "register_norm": "normbench.model.norms",
    "build_norm": "normbench.model.norms",
    "NORMS": "normbench.model.norms",
    "register_placement": "normbench.model.placements",
    "PLACEMENTS": "normbench.model.placements",
    "Block": "normbench.model.placements",
    "BlockSpec": "normbench.model.placements",
    "GPT": "normbench.model.gpt",
    "ModelConfig": "normbench.model.gpt",
    "run_report": "normbench.report",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'normbench' has no attribute {name!r}")
