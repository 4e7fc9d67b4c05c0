"""A run's identity: ``config_hash``, the fingerprint of what a run computes.

It names sweep jobs' directories (``${config_hash:}`` in conf/config.yaml), tells a stored
result or a checkpoint of this config from one of another, and groups runs in a report.
Imports nothing of normbench, so the run directory, the sweep and the report can all use it
without loading the model or the training loop.
"""

from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

# Keys that say how or where a run goes, not what it computes: the same run with a progress
# bar or more threads, under another results root, or mirrored to another tracker, is still the same run.
# Checkpoint cadence, resuming and keeping the weights don't change what a run computes either.
NOT_HASHED = ("results_dir", "train.progress", "train.threads", "logger",
              "train.checkpoint_every", "train.resume", "train.save_model")

# Keys added after runs were stored, each with the value that computes what a config computed
# before the key existed. At that value a key is left out of the hash, so the runs and sweep
# directories stored before it keep their identity (a gpt2 model without soft-capping is the model
# of before), and a report fills it into an older run's config (normbench.report.load).
ADDED_KEYS = {"model.arch": "gpt2", "model.attn_softcap": 0.0, "model.logit_softcap": 0.0}


def config_hash(cfg: DictConfig) -> str:
    """A stable fingerprint of what a run computes: the resolved config without Hydra's node and NOT_HASHED."""
    # Drop the hydra node before resolving: it may hold ${config_hash:} itself (the sweep subdir).
    plain = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    for dotted in NOT_HASHED:
        *parents, leaf = dotted.split(".")
        node = plain
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    for dotted, value in ADDED_KEYS.items():
        *parents, leaf = dotted.split(".")
        node = plain
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] == value and type(node[leaf]) is not bool:
            del node[leaf]
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


# ${config_hash:} in a Hydra config (conf/config.yaml names sweep jobs' directories with it), so a
# job's directory follows from its config: the same config lands in the same directory whatever
# the order or spelling of the overrides. Registered on import, which every Hydra job process
# does (it unpickles normbench.job.hydra_main, which imports this module through normbench.config).
if not OmegaConf.has_resolver("config_hash"):
    OmegaConf.register_new_resolver("config_hash", lambda *, _root_: config_hash(_root_)[:8])
