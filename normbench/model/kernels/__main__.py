"""``python -m normbench.model.kernels``: build the fused CPU kernels now (once per machine), not in a run."""

from __future__ import annotations

import sys

from normbench.model import kernels

if kernels.available():
    took = kernels.build_seconds()
    done = f"built in {took:.0f} s" if took else "already built"
    print(f"fused CPU norm kernels {done}: {kernels.build_dir()}")
else:
    print(f"fused CPU norm kernels not built: {kernels.why()}", file=sys.stderr)
    sys.exit(1)
