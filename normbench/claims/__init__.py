"""The claims registry: every headline claim about normalization as an experiment with a verdict.

A claim is data, one YAML per claim in conf/claim/ (a user's own in their config folder's claim/):
its source, the sentence with the source's number and setting, the sweep that tests it, the
comparison and the predicate that decides it. ``schema`` reads and checks the YAML, ``running``
runs a claim's sweep through ``normbench sweep``'s machinery, ``predicates`` turns the runs into a
verdict with its evidence (through the report's loading, tuning and statistics), ``output`` writes
claims.csv, claims.md, claims.html and the terminal table, ``cli`` is ``normbench claims``.

It sits above the sweeps and the report: it imports both, neither imports it.
"""
