"""Incremental engine: Z-sets of annotated rows, incremental operators with explicit state,
their naive twins (:mod:`sketches.ivm.reference`), and the plan/pipeline that runs them against
PostgreSQL (:mod:`sketches.ivm.plan`)."""
