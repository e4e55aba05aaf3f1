"""Where heavy sketch work runs: PostgreSQL (default) or Spark (issue 5).

* ``base``: the :class:`~sketches.backends.base.ExecutionBackend` protocol (capture, state
  building, full maintenance, ΔR⋈S' rows), the state row shape, the exceptions;
* ``postgres``: everything as pushed-down SQL on the caller's connection;
* ``plan``: a query split into pushed-down PostgreSQL reads + what another engine computes;
* ``spark``: the Spark backend and its long-lived session (the only module importing pyspark);
* ``routing``: :class:`~sketches.backends.routing.RoutedBackend` — per-job choice by
  :mod:`sketches.cost`, fallback to PostgreSQL, recent decisions for IMP EXPLAIN / STATS.

Wiring (one call each)::

    backend = routing.make_heavy_backend(mode, spark_table)  # --heavy-backend, [spark] TOML
    result = backend.capture(conn, sql, analysis, targets, params)   # = capture(...)
    choice = backend.explain(conn, sql, analysis, targets, params)   # IMP EXPLAIN
    backend.build_state(conn, analysis, targets, params, buffer).load_into(aggregate_op)

Nothing here imports pyspark at import time.
"""
