"""Background work of a replica: the idle reaper and the policy watch (not the engine:
they own loops, leases and watches; the engine only answers calls)."""
