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
NOT_HASHED = (
    "results_dir",
    "train.progress",
    "train.threads",
    "logger",
    "train.checkpoint_every",
    "train.checkpoint_minutes",
    "train.resume",
    "train.save_model",
    # A placement's own recipe acts only through model.init and model.tie_head, which follow it and are
    # hashed: Post-LN with model.init=gpt2 model.tie_head=true is the run stored before recipes existed.
    "placement.init",
    "placement.tie_head",
)

# Keys added after runs were stored, each with the value that computes what a config computed
# before the key existed. At that value a key is left out of the hash, so the runs and sweep
# directories stored before it keep their identity (a gpt2 model without soft-capping is the model
# of before), and a report fills it into an older run's config (normbench.report.load).
ADDED_KEYS = {
    "model.arch": "gpt2",
    "model.attn_softcap": 0.0,
    "model.logit_softcap": 0.0,
    "model.param": "sp",
    "model.base_width": None,
    "model.attn_gate": False,
    "model.qk_norm_scope": "head",
    "model.v_norm": "none",
    "model.ln_scaling": False,
    "norm.alpha_init_attn": None,
    "norm.alpha_init_mlp": None,
    "norm.alpha_init_final": None,
    # The norms' implementation computes the same math (tests/test_norms.py holds each fused kernel to
    # the eager one, to float rounding), but not at the same speed, and speed is a result here. auto
    # (the default: fused where it builds) keeps every stored run's identity, and where it ran which is
    # the summary's provenance.norm_impl; a run asking for eager or fused is its own config, so its
    # tokens/s are never a reused result of the other implementation, and norm.impl=auto,eager sweeps.
    "norm.impl": "auto",
    # Seeds trained as one batched model (normbench.training.batched) compute the same math as
    # sequential runs but not in the same order: a batched result is never reused for a sequential
    # request, nor the other way. How many seeds shared the batch is provenance (batched: K), not
    # identity, so a sweep that adds a seed keeps the results of the seeds it had.
    "train.batched": False,
    # One forward over the batch or several accumulated: the same gradients to float rounding, but not the
    # same memory nor speed; the whole batch at once is what every stored run did.
    "train.micro_batch_size": None,
    # The end-of-run checks sized to the run: auto runs every check a stored (short) run ran.
    "train.end_checks": "auto",
    # The head tied to the token embedding, as every stored run's.
    "model.tie_head": True,
}

# train.compile=cuda compiles on a CUDA device (as auto does) and not elsewhere: it hashes as what it does
# on the device the run trains on, so a compiled and an eager run on a GPU never share an identity (speed
# is a result), and on the CPU, where every stored run trained, it hashes as false, as those runs did.
# Whether a run compiled is its summary's provenance ("compile"), as norm.impl=auto's choice is.
COMPILE_ON_CUDA = ("cuda", "auto")


def device_type(name: str) -> str:
    """The kind of device ``train.device=name`` trains on (cpu, cuda): auto is CUDA where this machine has
    one. Explicit names need no device here, so a plan made on a machine without the GPU names the jobs'
    directories as the GPU's jobs do."""
    if name == "auto":
        import torch  # here: the run directory and the report hash configs without loading torch otherwise

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(name).split(":")[0]


def config_hash(cfg: DictConfig) -> str:
    """A stable fingerprint of what a run computes: the resolved config without Hydra's node and
    NOT_HASHED."""
    # Without Hydra's node, which may hold ${config_hash:} itself (the sweep subdir); group by group,
    # not through a masked copy, which copies every node (a sweep hashes every job, twice).
    plain = {
        key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        for key, value in ((key, cfg[key]) for key in cfg if key != "hydra")
    }
    for dotted in NOT_HASHED:
        _drop(plain, dotted)
    for dotted, value in ADDED_KEYS.items():
        _drop(plain, dotted, only_if=value)
    train = plain.get("train")
    if isinstance(train, dict) and train.get("compile") == COMPILE_ON_CUDA[0]:
        # The batched seeds never compile (normbench.training.batched), as TrainConfig.compiles_on says.
        on_cuda = device_type(str(train.get("device", "auto"))) == "cuda" and not train.get("batched")
        train["compile"] = COMPILE_ON_CUDA[1] if on_cuda else False
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


_ANY = object()


def _drop(tree: dict, dotted: str, only_if=_ANY) -> None:
    """Remove a dotted key from a nested dict, if present (and, with ``only_if``, holding that value)."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.get(key) if isinstance(tree, dict) else None
    if isinstance(tree, dict) and leaf in tree:
        value = tree[leaf]
        # False == 0.0, but false is not a cap of 0 nor 0 a gate that is off: a bool matches a bool only.
        if only_if is _ANY or (value == only_if and isinstance(value, bool) == isinstance(only_if, bool)):
            del tree[leaf]


# ${config_hash:} in a Hydra config (conf/config.yaml names sweep jobs' directories with it), so a
# job's directory follows from its config: the same config lands in the same directory whatever
# the order or spelling of the overrides. Registered on import, which every Hydra job process
# does (it unpickles normbench.sweeps.job.hydra_main, which imports this module through
# normbench.training.config).
if not OmegaConf.has_resolver("config_hash"):
    OmegaConf.register_new_resolver("config_hash", lambda *, _root_: config_hash(_root_)[:8])
