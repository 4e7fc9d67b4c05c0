"""normbench's Hydra plugins: the sweeper that plans a resumable grid (``hydra/sweeper=normbench``) and
the launcher that runs its jobs on warm worker processes (``hydra/launcher=local``).

Hydra imports every module of the ``hydra_plugins`` namespace package when it starts, so these
modules import little; the work is in ``normbench.sweeps.planning`` and ``normbench.sweeps.launching``.
"""
