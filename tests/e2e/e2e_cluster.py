"""Driving a kind cluster for the e2e tests: tools check, cluster, image, chart, policies,
port-forwards. Every command is echoed with its output on failure, so a red run says
which step broke.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ("kind", "docker", "kubectl", "helm")
CLUSTER = os.environ.get("AGENTTX_E2E_CLUSTER", "agenttx-e2e")
RELEASE = "agenttx"
SYSTEM_NS = os.environ.get("AGENTTX_E2E_NAMESPACE", "agenttx-e2e-system")
IMAGE_REPO, IMAGE_TAG = "agenttx", "e2e"


def opted_in(config: Any) -> bool:
    flag = False
    with contextlib.suppress(ValueError):
        flag = bool(config.getoption("--e2e", default=False))
    return flag or os.environ.get("AGENTTX_E2E", "") not in ("", "0", "false")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def run(*args: str, check: bool = True, timeout: float = 600, input: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          input=input, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(args)}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def docker_reachable() -> bool:
    return run("docker", "info", check=False, timeout=30).returncode == 0


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Cluster:
    """A kind cluster with AgentTx installed by its Helm chart."""

    context: str
    created: bool = False

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run("kubectl", "--context", self.context, *args, check=check, input=input,
                   timeout=timeout)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        proc = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise AssertionError(proc.stderr)
        return json.loads(proc.stdout)

    def apply(self, doc: dict[str, Any], namespace: str) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))

    def delete(self, kind: str, name: str, namespace: str, wait: bool = True) -> None:
        self.kubectl("delete", kind, name, "-n", namespace, "--ignore-not-found",
                     f"--wait={'true' if wait else 'false'}", timeout=300)

    def policy_ready(self, name: str, namespace: str, generation: int = 1,
                     timeout: float = 300) -> dict[str, Any]:
        """Wait until the policy's Ready condition is True for `generation`."""
        def check() -> dict[str, Any] | None:
            body = self.get("agenttxpolicy", name, namespace)
            for cond in (body or {}).get("status", {}).get("conditions", []):
                if (cond["type"] == "Ready" and cond["status"] == "True"
                        and cond.get("observedGeneration") == generation):
                    return body
            return None
        return wait_for(check, timeout, f"AgentTxPolicy {namespace}/{name} gen {generation} "
                        "Ready (kubectl describe agenttxpolicy for the reason)")

    def rollout(self) -> None:
        self.kubectl("rollout", "status", "-n", SYSTEM_NS, f"deployment/{RELEASE}",
                     "--timeout=300s", timeout=320)

    @contextlib.contextmanager
    def port_forward(self) -> Iterator[int]:
        """`kubectl port-forward svc/agenttx :50051`; yields the local port."""
        proc = subprocess.Popen(
            ["kubectl", "--context", self.context, "port-forward", "-n", SYSTEM_NS,
             f"svc/{RELEASE}", ":50051"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.search(r"127\.0\.0\.1:(\d+)", line)
            assert match, f"port-forward did not start: {line!r}"
            yield int(match.group(1))
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def create_cluster() -> Cluster:
    existing = run("kind", "get", "clusters", check=False).stdout.split()
    created = False
    if CLUSTER not in existing:
        run("kind", "create", "cluster", "--name", CLUSTER, "--wait", "180s", timeout=600)
        created = True
    return Cluster(context=f"kind-{CLUSTER}", created=created)


def install(cluster: Cluster) -> None:
    image = f"{IMAGE_REPO}:{IMAGE_TAG}"
    run("docker", "build", "-t", image, ".", timeout=1800)
    run("kind", "load", "docker-image", image, "--name", CLUSTER, timeout=600)
    run("helm", "upgrade", "--install", RELEASE, "charts/agenttx",
        "--kube-context", cluster.context, "--namespace", SYSTEM_NS, "--create-namespace",
        "--set", f"image.repository={IMAGE_REPO}", "--set", f"image.tag={IMAGE_TAG}",
        "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "10m", timeout=700)
    # A new image under the same tag: make the pods pick it up.
    for deployment in (RELEASE, f"{RELEASE}-operator"):
        cluster.kubectl("rollout", "restart", "-n", SYSTEM_NS, f"deployment/{deployment}")
        cluster.kubectl("rollout", "status", "-n", SYSTEM_NS, f"deployment/{deployment}",
                        "--timeout=300s", timeout=320)


def teardown(cluster: Cluster) -> None:
    if cluster.created and not os.environ.get("AGENTTX_E2E_KEEP"):
        run("kind", "delete", "cluster", "--name", CLUSTER, check=False, timeout=300)
