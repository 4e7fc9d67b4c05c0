"""``normbench new norm NAME`` / ``new placement NAME``: a starting module, its config and its test.

What it writes passes ``normbench check`` as it is (a norm like RMSNorm, a placement like Pre-LN),
so a user edits from something sound. Nothing is overwritten; each file is written atomically.
"""

from __future__ import annotations

import re
from pathlib import Path

from normbench.core.errors import ConfigError
from normbench.core.fileio import write_atomic

KINDS = ("norm", "placement")

NORM = '''"""{title}: a norm for normbench (started by `normbench new norm {name}`)."""

import torch
from torch import nn


class {cls}(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension: RMSNorm, to start from."""

    statistics = "token"  # "token": each vector by its own statistics; "batch"; or None

    def __init__(self, dim: int, *, eps: float = 1e-6):  # options: keyword-only, with defaults
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()  # statistics in float32 under half precision
        y = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)
'''

PLACEMENT = '''"""{title}: a placement for normbench (started by `normbench new placement {name}`)."""

import torch

from normbench import Block


class {cls}(Block):
    """x + f(N(x)): Pre-LN, to start from. ``spec.model`` is the model's config, ``spec.layer`` this
    block's 1-based index; ``make_norm(position)`` builds the chosen norm ("attn" or "mlp")."""

    def __init__(self, spec, make_norm, *, scale: float = 1.0):  # options: keyword-only, with defaults
        super().__init__(spec, make_norm)  # self.attn and self.mlp
        self.norm_attn, self.norm_mlp = make_norm("attn"), make_norm("mlp")
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.scale * self.attn(self.norm_attn(x))
        return x + self.scale * self.mlp(self.norm_mlp(x))
'''

FOUND = "your class, found through this folder (--config-dir or hydra.searchpath)"
YAML = {
    "norm": "# norm={name}: " + FOUND + ".\nname: {name}\n_target_: {module}.{cls}\neps: 1.0e-06\n",
    "placement": "# placement={name}: " + FOUND + ".\n"
    "name: {name}\nfinal_norm: true\n_target_: {module}.{cls}\nscale: 1.0\n",
}

TEST = '''"""normbench check on {kind}={name}: every property that must hold holds (run: pytest {test})."""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_{name}_passes_normbench_check():
    env = {{**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}}
    result = subprocess.run(
        [sys.executable, "-m", "normbench.cli", "check", "--config-dir", str(HERE / "conf"), "{kind}={name}",
         "--json", "--no-compile", "--no-speed"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = json.loads(result.stdout)["lines"]
    assert all(line["result"] != "FAIL" for line in lines)
'''


def write(kind: str, name: str, folder: Path) -> list[Path]:
    """Write the module, conf/KIND/NAME.yaml and a test into ``folder``; the paths written."""
    if kind not in KINDS:
        raise ConfigError(f"normbench new makes a norm or a placement, not '{kind}'", allowed=list(KINDS))
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ConfigError(
            f"'{name}' cannot name a {kind}: it is also its module's name",
            allowed=["lower-case letters, digits and _, starting with a letter"],
        )
    builtins = _builtin_names(kind)
    if name in builtins:
        raise ConfigError(
            f"'{name}' is normbench's own {kind}", allowed=[f"a name not in: {', '.join(builtins)}"]
        )
    module = f"{name}_{kind}"
    cls = "".join(part.title() for part in name.split("_")) + ("Norm" if kind == "norm" else "Block")
    fields = {"name": name, "cls": cls, "module": module, "kind": kind, "title": f"{kind} {name}"}
    files = {
        folder / f"{module}.py": (NORM if kind == "norm" else PLACEMENT).format(**fields),
        folder / "conf" / kind / f"{name}.yaml": YAML[kind].format(**fields),
        folder / f"test_{module}.py": TEST.format(**fields, test=f"test_{module}.py"),
    }
    existing = [str(p) for p in files if p.exists()]
    if existing:
        raise ConfigError(f"{', '.join(existing)} already exists; normbench new overwrites nothing")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    return list(files)


def _builtin_names(kind: str) -> list[str]:
    from normbench.model.norms import NORMS
    from normbench.model.placements import PLACEMENTS
    from normbench.model.targets import is_builtin

    registry = NORMS if kind == "norm" else PLACEMENTS
    return sorted(n for n, c in registry.items() if is_builtin(c))
