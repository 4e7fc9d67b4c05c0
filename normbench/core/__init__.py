"""The shared core every other part builds on: user-facing errors, atomic file writing, a config's
identity (its hash), run directories and their locks, the config tree's location, device names.

Imports nothing from the rest of normbench (tests/test_structure.py holds it to that).
"""
