"""Analyses of stored runs: what the certificate, the gate and the pages compute from.

- `conformance`: which declared invariants each run obeyed (`evaluate` one run; `check` a store, keeping its violations);
- `stats`: intervals, tests and planning numbers for conformance rates: Wilson over runs, the gate's bounds on the mean
  over tasks (``wilson_tasks``, and ``betting_cs`` for a sequential study), pass^k, and how many tasks settle a target;
- `regression`: a candidate against its baseline, a paired sign-flip test with tasks as the units (``gate --baseline``);
- `consistency`: does an agent do the same thing, with the same arguments, each time it runs a task;
- `equivalence`: does agent B act like agent A on the same tasks and variants;
- `align`: where two step sequences part ways (the one alignment the diffs and consistency use);
- `simulate`: simulated clustered runs, to measure how often a bound covers the true rate (tests/analyse and bench/).

Each module states its method, its reasons and its limits beside the code; docs/statistics.md has them in one place.
The modules are imported by name: this package exports nothing of its own.
"""
