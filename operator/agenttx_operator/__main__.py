"""`python -m agenttx_operator [flags]`, the same as `agenttx operator [flags]`."""

from agenttx_operator.main import run

raise SystemExit(run())
