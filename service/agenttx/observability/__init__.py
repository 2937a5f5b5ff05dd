"""Metrics, traces and health: how an operator sees AgentTx (docs/operations.md#traces)."""
