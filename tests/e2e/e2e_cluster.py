"""Driving a kind cluster for the e2e tests: tools check, cluster, image, chart, policies,
port-forwards, credentials. Every command is echoed with its output on failure, so a red
run says which step broke.

The chart is installed with its defaults, so what the tests see is what a user gets:
`auth.mode=kubernetes` (every AgentTx call needs a ServiceAccount token with audience
`agenttx`, whose issuer keys the operator publishes into etcd), NetworkPolicies (the
gRPC port admits only namespaces labelled `agenttx.io/client=true`; a `kubectl
port-forward` is not filtered by them) and the bundled etcd over mutual TLS with
certificates the chart generates (and keeps on `helm upgrade`).

What it must never do: print or log a token (they are passed as call metadata only).
"""

from __future__ import annotations

import collections
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

import grpc
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ("kind", "docker", "kubectl", "helm")
CLUSTER = os.environ.get("AGENTTX_E2E_CLUSTER", "agenttx-e2e")
RELEASE = "agenttx"
SYSTEM_NS = os.environ.get("AGENTTX_E2E_NAMESPACE", "agenttx-e2e-system")
IMAGE_REPO, IMAGE_TAG = "agenttx", "e2e"
IMAGE = f"{IMAGE_REPO}:{IMAGE_TAG}"
# Chart defaults the tests rely on (charts/agenttx/values.yaml): auth.kubernetes.audience,
# networkPolicy.clientNamespaceLabel, etcdPrefix, and the resource names for RELEASE.
AUDIENCE = "agenttx"
CLIENT_LABEL = ("agenttx.io/client", "true")
ETCD_PREFIX = "/agenttx"
ETCD = f"{RELEASE}-etcd"
ETCD_SERVER_SECRET = f"{ETCD}-tls"
ETCD_MEMBER_TLS_DIR = "/etc/etcd/tls"  # agenttx.etcd.memberTlsDir
SERVICE_TARGET = f"{RELEASE}.{SYSTEM_NS}.svc:50051"
AGENT = "agent"  # the ServiceAccount of the `agent_token` fixture, in each test's namespace


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

    def toolset_ready(self, name: str, namespace: str, generation: int = 1,
                      timeout: float = 420) -> dict[str, Any]:
        """Wait until the toolset's Ready condition is True for `generation` (the first
        time includes pulling the upstream's image, installing its SDK and rolling the
        service pods out with the header files)."""
        def check() -> dict[str, Any] | None:
            body = self.get("agenttxtoolset", name, namespace)
            for cond in (body or {}).get("status", {}).get("conditions", []):
                if (cond["type"] == "Ready" and cond["status"] == "True"
                        and cond.get("observedGeneration") == generation):
                    return body
            return None
        return wait_for(check, timeout, f"AgentTxToolset {namespace}/{name} gen {generation} "
                        "Ready (kubectl describe attool for the reason)")

    def rollout(self) -> None:
        self.kubectl("rollout", "status", "-n", SYSTEM_NS, f"deployment/{RELEASE}",
                     "--timeout=300s", timeout=320)

    # ---- credentials (auth.mode kubernetes) ---------------------------------------------

    def service_account(self, name: str, namespace: str) -> None:
        """A ServiceAccount without the default API token (only AgentTx tokens are used)."""
        self.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": name}, "automountServiceAccountToken": False},
                   namespace)

    def token(self, service_account: str, namespace: str, audience: str = AUDIENCE,
              duration: str = "1h") -> str:
        """`kubectl create token`: a bound token the API server signs with the same key
        as projected ones. Never echoed (run() prints stdout only on failure)."""
        proc = self.kubectl("create", "token", service_account, "-n", namespace,
                            "--audience", audience, "--duration", duration)
        return proc.stdout.strip()

    def label_client_namespace(self, namespace: str) -> None:
        """What the service's NetworkPolicy admits on the gRPC port."""
        key, value = CLIENT_LABEL
        self.kubectl("label", "namespace", namespace, f"{key}={value}", "--overwrite")

    def raw(self, path: str) -> Any:
        """`kubectl get --raw <path>` as JSON (e.g. the issuer discovery)."""
        return json.loads(self.kubectl("get", "--raw", path).stdout)

    # ---- the bundled etcd (mutual TLS with the chart's generated certificates) -------------

    def etcdctl(self, *args: str) -> str:
        """etcdctl inside the first member, against its own client port. With etcd.tls it
        presents the member's certificate (signed by the release CA, with client auth and
        127.0.0.1 in its SANs): the only client certificate inside that pod."""
        sts = self.get("statefulset", ETCD, SYSTEM_NS)
        assert sts is not None, f"StatefulSet {ETCD} not found in {SYSTEM_NS}"
        etcd_args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
        tls = "--client-cert-auth=true" in etcd_args
        flags = [f"--endpoints={'https' if tls else 'http'}://127.0.0.1:2379"]
        if tls:
            flags += [f"--cacert={ETCD_MEMBER_TLS_DIR}/ca.crt",
                      f"--cert={ETCD_MEMBER_TLS_DIR}/tls.crt",
                      f"--key={ETCD_MEMBER_TLS_DIR}/tls.key"]
        return self.kubectl("exec", "-n", SYSTEM_NS, f"{ETCD}-0", "-c", "etcd", "--",
                            "etcdctl", *flags, *args).stdout

    def published_issuer_keys(self) -> dict[str, Any] | None:
        """The document the operator published for `--auth kubernetes`, or None."""
        value = self.etcdctl("get", f"{ETCD_PREFIX}/auth/jwks", "--print-value-only").strip()
        return json.loads(value) if value else None

    def issuer_keys(self) -> tuple[str, set[str]]:
        """The API server's service-account issuer and key ids (what must be published)."""
        discovery = self.raw("/.well-known/openid-configuration")
        keys = self.raw("/openid/v1/jwks")["keys"]
        return discovery["issuer"], {k.get("kid", "") for k in keys}

    def wait_for_issuer_keys(self, timeout: float = 300) -> dict[str, Any]:
        """Until the operator has published the API server's current issuer and keys."""
        issuer, kids = self.issuer_keys()

        def check() -> dict[str, Any] | None:
            doc = self.published_issuer_keys()
            if doc and doc.get("issuer") == issuer and {
                    k.get("kid", "") for k in doc["jwks"]["keys"]} == kids:
                return doc
            return None
        return wait_for(check, timeout, "the operator to publish the service-account issuer "
                        f"keys at {ETCD_PREFIX}/auth/jwks (kubectl logs -n {SYSTEM_NS} "
                        f"deploy/{RELEASE}-operator)")

    # ---- pods ------------------------------------------------------------------------------

    def pod_result(self, name: str, namespace: str, timeout: float = 300) -> tuple[str, str]:
        """Wait for a restartPolicy=Never pod to end; (phase, logs)."""
        def ended() -> str | None:
            pod = self.get("pod", name, namespace)
            phase = (pod or {}).get("status", {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None
        phase = wait_for(ended, timeout, f"pod {namespace}/{name} to finish "
                         f"(kubectl describe pod -n {namespace} {name})")
        return phase, self.kubectl("logs", "-n", namespace, name).stdout

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


AGENT_SCRIPT = pathlib.Path(__file__).with_name("in_cluster_agent.py")
TOKEN_DIR = "/var/run/secrets/agenttx"


def projected_token_agent(name: str, service_account: str, agent_id: str,
                          audience: str = AUDIENCE) -> list[dict[str, Any]]:
    """A ConfigMap with in_cluster_agent.py and a Pod that runs it with a projected
    ServiceAccount token for `audience` (the shape of examples/kubernetes/agent-pod.yaml),
    calling the Service's cluster address. Apply both in a labelled namespace."""
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
              "data": {"agent.py": AGENT_SCRIPT.read_text()}}
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "agent", "image": IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "/opt/agent/agent.py"],
                "env": [{"name": "AGENTTX_TARGET", "value": SERVICE_TARGET},
                        {"name": "AGENTTX_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},
                        {"name": "AGENTTX_AGENT_ID", "value": agent_id}],
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [
                    {"name": "agenttx-token", "mountPath": TOKEN_DIR, "readOnly": True},
                    {"name": "agent", "mountPath": "/opt/agent", "readOnly": True}],
            }],
            "volumes": [
                {"name": "agenttx-token", "projected": {"sources": [{"serviceAccountToken": {
                    "audience": audience, "expirationSeconds": 3600, "path": "token"}}]}},
                {"name": "agent", "configMap": {"name": name}}],
        },
    }
    return [config, pod]


class _CallDetails(
        collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                "wait_for_ready", "compression")),
        grpc.ClientCallDetails):
    """grpc's own interceptor example's call details (examples/python/interceptors)."""


class BearerToken(grpc.UnaryUnaryClientInterceptor):
    """Adds `authorization: Bearer <token>` to every unary call of a channel (as
    agenttx.client does), for tests that drive the raw stubs. A plaintext channel may carry
    it: the port-forward is a loopback connection to the pod."""

    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        new = _CallDetails(details.method, details.timeout,
                           tuple(details.metadata or ()) + self._metadata, details.credentials,
                           details.wait_for_ready, details.compression)
        return continuation(new, request)


@contextlib.contextmanager
def service_channel(cluster: Cluster, token: str | None) -> Iterator[grpc.Channel]:
    """A channel to the service through a port-forward; with `token`, every call carries
    it. Without one, calls go out with no credentials (to check the refusal)."""
    with cluster.port_forward() as port, grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield grpc.intercept_channel(ch, BearerToken(token)) if token else ch


def create_cluster() -> Cluster:
    existing = run("kind", "get", "clusters", check=False).stdout.split()
    created = False
    if CLUSTER not in existing:
        run("kind", "create", "cluster", "--name", CLUSTER, "--wait", "180s", timeout=600)
        created = True
    return Cluster(context=f"kind-{CLUSTER}", created=created)


def _drop_plaintext_etcd(cluster: Cluster) -> None:
    """A reused cluster may hold a release whose bundled etcd was bootstrapped before the
    chart turned etcd TLS on: its members keep `http://` peer URLs in their membership and
    would not form a cluster over TLS (docs/kubernetes.md, "Upgrading a release installed
    with plaintext etcd"). The e2e etcd is disposable: remove it and its volumes, so the
    install below bootstraps a TLS cluster from empty volumes."""
    if cluster.get("statefulset", ETCD, SYSTEM_NS) is None:
        return
    if cluster.get("secret", ETCD_SERVER_SECRET, SYSTEM_NS) is not None:
        return  # already TLS: helm looks the certificates up and keeps them
    cluster.kubectl("delete", "statefulset", ETCD, "-n", SYSTEM_NS, "--wait=true",
                    timeout=300)
    cluster.kubectl("delete", "pvc", "-n", SYSTEM_NS, "--wait=true", "-l",
                    f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=etcd",
                    timeout=300)


def install(cluster: Cluster) -> None:
    run("docker", "build", "-t", IMAGE, ".", timeout=1800)
    run("kind", "load", "docker-image", IMAGE, "--name", CLUSTER, timeout=600)
    _drop_plaintext_etcd(cluster)
    # The chart's defaults: auth.mode kubernetes, NetworkPolicies, etcd over mTLS with
    # generated certificates (looked up and kept when the release already exists).
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
    # No call can be authenticated before the operator has published the issuer keys.
    cluster.wait_for_issuer_keys()


def teardown(cluster: Cluster) -> None:
    if cluster.created and not os.environ.get("AGENTTX_E2E_KEEP"):
        run("kind", "delete", "cluster", "--name", CLUSTER, check=False, timeout=300)
