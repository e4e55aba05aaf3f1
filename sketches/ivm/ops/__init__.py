"""The incremental annotated operators, one module each (DESIGN §7)."""
