"""examples/kubernetes/agent-pod.yaml's agent script, run against real service replicas.

The script is taken from the example's ConfigMap and run as the pod would run it, with
the pod's environment pointed at a loopback replica and at a token file. The replicas
here run without authentication (the chart's kubernetes auth needs the issuer keys a
cluster publishes), so this pins what the example does with the API: begin, one kv.put
step, commit, the token sent as `authorization: Bearer` metadata on every call, and the
committed value visible to the next transaction.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import yaml

from support.chart import ROOT
from support.service import Agent

EXAMPLE = ROOT / "examples" / "kubernetes" / "agent-pod.yaml"


def test_agent_example_commits_a_transaction(replicas, tmp_path: pathlib.Path) -> None:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    script = tmp_path / "agent.py"
    script.write_text(config["data"]["agent.py"])
    token = tmp_path / "agenttx-token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.example.signature\n")
    pod_env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert set(pod_env) == {"AGENTTX_TARGET", "AGENTTX_TOKEN_FILE"}
    environment = {"PATH": os.environ.get("PATH", ""),
                   "AGENTTX_TARGET": replicas[0].address, "AGENTTX_TOKEN_FILE": str(token)}
    done = subprocess.run([sys.executable, "-B", str(script)], env=environment,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["committed"] is True
    assert result["output"] == {"key": "invoice/42", "value": {"total": 99}}
    reader = Agent(replicas[1].stub)
    assert reader.ok("kv.get", {"key": "invoice/42"})["value"] == {"total": 99}
    reader.commit()
