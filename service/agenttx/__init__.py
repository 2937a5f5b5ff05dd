"""AgentTx: transactions for AI agents' tool calls."""

__version__ = "0.1.0"
