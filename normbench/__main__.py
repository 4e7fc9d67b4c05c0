"""``python -m normbench`` (what ``torchrun -m normbench`` runs)."""

from normbench.cli import main

main()
