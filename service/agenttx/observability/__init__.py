"""Metrics, traces and health: how an operator sees AgentTx (SPEC §10)."""
