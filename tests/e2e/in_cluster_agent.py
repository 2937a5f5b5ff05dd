"""What an agent pod runs in the e2e test of `--auth kubernetes`: one call without
credentials, then a transaction with the pod's projected ServiceAccount token, and ONE
JSON line on stdout saying what the service answered.

Shipped into the pod in a ConfigMap (the AgentTx image has the client), so it runs
from inside the cluster: through the chart's NetworkPolicy, to the Service's cluster
address. It never prints the token.

Environment: AGENTTX_TARGET (host:port), AGENTTX_TOKEN_FILE (the projected token),
AGENTTX_AGENT_ID, AGENTTX_WAIT_S (how long the first authenticated call may wait for
the service to have the issuer keys; default 60).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import grpc

from agenttx.client import AgentTxError, Client

# Answers that mean "the keys are not there yet" rather than "this token is bad": the
# service refuses every token until the operator's document reaches it through etcd.
NOT_YET = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)


def token() -> str:
    # Re-read for every client: the kubelet replaces the file before it expires.
    return pathlib.Path(os.environ["AGENTTX_TOKEN_FILE"]).read_text().strip()


def main() -> int:
    target = os.environ["AGENTTX_TARGET"]
    agent_id = os.environ.get("AGENTTX_AGENT_ID", "e2e-projected-token")
    wait_s = float(os.environ.get("AGENTTX_WAIT_S", "60"))
    out: dict[str, object] = {}

    with Client(target, timeout=10) as anonymous:
        try:
            anonymous.begin(agent_id=agent_id).rollback()
            out["anonymous"] = ["OK", ""]
        except AgentTxError as exc:
            out["anonymous"] = [exc.code.name, exc.details]

    deadline = time.monotonic() + wait_s
    while True:
        try:
            with Client(target, token=token(), timeout=10) as client:
                tx = client.begin(agent_id=agent_id)
                view = client.get(tx.id)
                out["principal"] = view.principal
                out["agent_id"] = view.agent_id
                out["rolled_back"] = tx.rollback().rolled_back
            break
        except AgentTxError as exc:
            if exc.code not in NOT_YET or time.monotonic() > deadline:
                out["error"] = [exc.code.name, exc.details]
                break
            # runs in a pod with only agenttx-client installed: the tests' waiting helper
            # is not there, so this one loop keeps its own deadline (wait_s) and pause
            time.sleep(1)
    print(json.dumps(out, sort_keys=True))
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
