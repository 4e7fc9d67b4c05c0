"""A claim's family: the claims Holm's correction runs across, whose first level plans its confirmation.

normbench's own claims (conf/claim/) are one family, the registry. A user's claims (CONFIG_DIR/claim/,
given with --config-dir) are a family of their own: a user's question does not make the registry's
verdicts stricter, and the registry's many claims do not make a user's one claim need many more
seeds. A user who means their claims as part of the registry's question asks to join it
(``--join-registry``): then both are one family.

The folder a claim's runs go to is one meaning for every verb (``claims run``, ``preregister``,
``confirm``): ``--out``, by default results/claims-local. The published registry's folder,
results/claims, holds normbench's own claims only: a user's claim never writes there.
"""

from __future__ import annotations

from pathlib import Path

from normbench.claims.checking import claim_config_dir
from normbench.claims.schema import Claim
from normbench.core.configtree import conf_dir
from normbench.core.errors import ConfigError

PUBLISHED = Path("results/claims")  # the registry's committed runs and verdicts
LOCAL = Path("results/claims-local")  # every verb's default folder


def is_users(claim: Claim) -> bool:
    """Whether the claim is a user's (from a --config-dir), not one of normbench's registry."""
    return claim_config_dir(claim.path) is not None


def families(claims: list[Claim], join: bool = False) -> list[list[Claim]]:
    """The claims split into the families Holm corrects across, each in the order given: the
    registry's, then the user's; one family with ``join``."""
    if join:
        return [claims]
    split = [[c for c in claims if not is_users(c)], [c for c in claims if is_users(c)]]
    return [family for family in split if family]


def family_of(claim: Claim, claims: list[Claim], join: bool = False) -> list[Claim]:
    """The family ``claim`` is corrected in, among ``claims`` (itself counted)."""
    for family in families(claims, join):
        if any(c.id == claim.id for c in family):
            return family
    return [claim]


def check_folder(claims: list[Claim], out: Path) -> None:
    """Refuse, in one line, a user's claim whose runs would go into the published registry's folder
    (results/claims of normbench's checkout)."""
    users = [c.id for c in claims if is_users(c)]
    if users and out.resolve() == (conf_dir().parent / PUBLISHED).resolve():
        raise ConfigError(
            f"{out} holds normbench's published registry; your claim {users[0]} writes to a folder of "
            f"your own (--out DIR, default {LOCAL})"
        )


def command(verb: str, claim: Claim, out: Path, *flags: str) -> str:
    """The command line that runs ``verb`` on the claim with its runs in ``out``: 'normbench claims
    --config-dir DIR preregister ID --out DIR' (the options at their defaults left out)."""
    config_dir = claim_config_dir(claim.path)
    words = ["normbench claims", *([f"--config-dir {config_dir}"] if config_dir else []), verb, claim.id]
    if Path(out) != LOCAL:
        words.append(f"--out {out}")
    return " ".join([*words, *flags])
