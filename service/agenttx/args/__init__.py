"""Step arguments: serde-style JSON parsing and `${steps…}` references (pure, no I/O)."""
