"""Helpers for the operator's kopf wiring tests: kmock as the API server, real etcd.

kmock's emulator keeps objects in memory and merges dict patches. It does not speak
RFC 6902 JSON patch (kopf uses it for finalizers, the operator for the Deployment),
keep `resourceVersion` (kopf's JSON patches test it), bump `metadata.generation` on
spec changes (status reports it), honour `generateName` (kopf's events use it), or set
`metadata.uid` (kopf keeps each object's memory and daemons by it) and
`creationTimestamp` (the toolset prefix check orders by it).
`ApiServer` adds exactly those behaviours of a real API server (kmock's docs invite
subclassing for such "special" treatment), plus, on request, the refusal of a claim
resize by a real API server's admission (`refuse_claim_resize`), and nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp.web
import jsonpatch
import jwt
import kmock
from cryptography.hazmat.primitives.asymmetric import rsa

from agenttx.contracts.layout import Keys
from agenttx.contracts.policy import PublishedPolicy, parse_published_policy
from agenttx.store.client import Store
from agenttx_operator import jwks, main, sandboxes
from agenttx_operator.config import OperatorConfig
from agenttx_operator.kube import Credentials

POLICIES = "agenttx.io/v1alpha1/agenttxpolicies"
TOOLSETS = "agenttx.io/v1alpha1/agenttxtoolsets"
SECRETS = "v1/secrets"
PVCS = "v1/persistentvolumeclaims"
DEPLOYMENTS = "apps/v1/deployments"
EVENTS = "v1/events"
SERVICE_NS = "agenttx-system"


# What a real API server answers when a claim cannot grow: the PersistentVolumeClaimResize
# admission plugin (plugin/pkg/admission/storage/persistentvolume/resize) for a static PV
# or a StorageClass without allowVolumeExpansion, and PVC validation
# (pkg/apis/core/validation) for a claim that is not bound yet.
RESIZE_FORBIDDEN = (403, "Forbidden", 'persistentvolumeclaims "{name}" is forbidden: only '
                    "dynamically provisioned pvc can be resized and the storageclass that "
                    "provisions the pvc must support resize")
RESIZE_INVALID = (422, "Invalid", 'PersistentVolumeClaim "{name}" is invalid: spec: Forbidden: '
                  "spec is immutable after creation except resources.requests and "
                  "volumeAttributesClassName for bound claims")


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator + RFC 6902 JSON patch, resourceVersion, generation bumps and
    generateName. `json_patches` records the patches sent to Deployments; set
    `refuse_claim_resize` (RESIZE_FORBIDDEN, RESIZE_INVALID) to refuse claim resizes."""

    json_patches: list[tuple[str, list[dict[str, Any]]]]
    revision: int
    refuse_claim_resize: tuple[int, str, str] | None

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.json_patches = []
        self.revision = 100
        self.refuse_claim_resize = None

    def next_revision(self) -> str:
        self.revision += 1
        return str(self.revision)

    @staticmethod
    def _key(request: kmock.Request) -> tuple[kmock.resource, str | None, str]:
        assert request.resource is not None and request.name is not None
        return request.resource, request.namespace, request.name

    def _bus(self, request: kmock.Request) -> kmock.Bus[Any]:
        assert request.resource is not None
        return self._buses[request.resource]

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        refusal = self._claim_resize_refusal(request)
        if refusal is not None:
            return await self._render_error(refusal)
        if request.action == kmock.action.UPDATE and isinstance(request.data, list):
            return await self._json_patch(request)
        if request.action == kmock.action.DELETE and request.name is not None:
            response = await self._delete_with_finalizers(request)
            if response is not None:
                return response
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = self.next_revision()
            meta.setdefault("generation", 1)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"))
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{self.revision}"
        if request.action == kmock.action.UPDATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = self.next_revision()
            key = self._key(request)
            if (request.subresource is None and isinstance(request.data.get("spec"), dict)
                    and key in self.objects and not self.objects[key].deleted):
                old = self.objects[key].raw
                merged = _merge(copy.deepcopy(old.get("spec", {})), request.data["spec"])
                if merged != old.get("spec", {}):
                    meta["generation"] = int(old.get("metadata", {}).get("generation", 1)) + 1
        return await super()._handle(request)

    def _claim_resize_refusal(self, request: kmock.Request) -> kmock.KubernetesError | None:
        """The error for a PATCH that changes a claim's requested storage, when refusing."""
        if (self.refuse_claim_resize is None or request.action != kmock.action.UPDATE
                or request.resource is None or request.resource.plural != "persistentvolumeclaims"
                or not isinstance(request.data, dict)):
            return None
        storage = (((request.data.get("spec") or {}).get("resources") or {})
                   .get("requests") or {}).get("storage")
        key = self._key(request)
        if storage is None or key not in self.objects or self.objects[key].deleted:
            return None
        have = self.objects[key].raw.get("spec", {}).get("resources", {}).get("requests", {})
        if have.get("storage") == storage:
            return None
        status, reason, message = self.refuse_claim_resize
        return kmock.KubernetesError(status=status, reason=reason,
                                     message=message.format(name=request.name), details={})

    async def _delete_with_finalizers(self, request: kmock.Request
                                      ) -> aiohttp.web.StreamResponse | None:
        """A DELETE of an object with finalizers only sets deletionTimestamp (with a new
        resourceVersion, like a real API server)."""
        key = self._key(request)
        if key not in self.objects or self.objects[key].deleted:
            return None
        meta = self.objects[key].raw.get("metadata", {})
        if not meta.get("finalizers") or meta.get("deletionTimestamp"):
            return None
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.objects[key].patch({"metadata": {"deletionTimestamp": now,
                                              "resourceVersion": self.next_revision()}})
        raw = self.objects[key].raw
        await self._bus(request).put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)

    async def _serve_list(self, request: kmock.Request) -> Any:
        payload: Any = await super()._serve_list(request)
        payload["metadata"]["resourceVersion"] = str(self.revision)
        return payload

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """Watch from `?resourceVersion=`: objects changed since then, then live events,
        each object version at most once (kmock's own watch replays every object, which
        kopf would see twice after its initial list)."""
        yield b""
        mark = await self._bus(request).mark()
        since = _rv(request.params.get("resourceVersion"))
        seen: dict[tuple[str | None, str], int] = {}
        async with self._lock:
            snapshot = [(k, o.raw) for k, o in self.objects.items()
                        if k[0] == request.resource and not o.deleted
                        and request.namespace in (None, k[1])]
        for (_, ns, name), raw in snapshot:
            seen[ns, name] = _rv(raw.get("metadata", {}).get("resourceVersion"))
            if seen[ns, name] > since:
                yield {"type": "ADDED", "object": raw}
        async for event in mark:
            meta = event.get("object", {}).get("metadata", {})
            ns, name = meta.get("namespace"), meta.get("name")
            if request.namespace not in (None, ns):
                continue
            rv = _rv(meta.get("resourceVersion"))
            if event.get("type") != "DELETED" and rv <= seen.get((ns, name), -1):
                continue
            seen[ns, name] = rv
            yield event

    async def _json_patch(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        key = self._key(request)
        if key not in self.objects or self.objects[key].deleted:
            return await self._render_error(kmock.KubernetesObjectNotFoundError())
        old = self.objects[key].raw
        try:
            new = jsonpatch.apply_patch(old, request.data)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            return await self._render_error(
                kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)))
        if new.get("spec") != old.get("spec"):
            new.setdefault("metadata", {})["generation"] = (
                int(old.get("metadata", {}).get("generation", 1)) + 1)
        new.setdefault("metadata", {})["resourceVersion"] = self.next_revision()
        if key[0].plural == "deployments":
            self.json_patches.append((f"{request.namespace}/{request.name}", request.data))
        self.objects[key].delete()
        self.objects[key].create(new)
        await self._bus(request).put({"type": "MODIFIED", "object": new})
        meta = new.get("metadata", {})
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects[key].delete()  # the last finalizer is gone: the object goes
            await self._bus(request).put({"type": "DELETED", "object": new})
        return aiohttp.web.json_response(new)


def public_jwk(kid: str) -> dict[str, Any]:
    """An RSA public key as the API server serves it in /openid/v1/jwks."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return {**jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True),
            "kid": kid, "use": "sig", "alg": "RS256"}


class Issuer:
    """The API server's service-account issuer discovery, as kmock reactions on the two
    non-resource URLs (kmock serves any path given as `kmock['get /path'] << payload`).

    Like a real API server: discovery names an external issuer host in `jwks_uri`, the
    key set is served as application/jwk-set+json and a request that accepts only
    application/json gets 406. Change `keys` to rotate, set `failure` to an HTTP status
    to make discovery fail, `keyset` to serve something else than `{"keys": keys}`.
    """

    ISSUER = "https://kubernetes.default.svc.cluster.local"

    def __init__(self, api: ApiServer, keys: list[dict[str, Any]]) -> None:
        self.api = api
        self.keys = keys
        self.keyset: Any = None
        self.failure: int | None = None
        api[f"get {jwks.DISCOVERY_PATH}"] << self._discovery
        api[f"get {jwks.JWKS_PATH}"] << self._jwks

    def _discovery(self) -> Any:
        if self.failure is not None:
            raise kmock.KubernetesError(status=self.failure, reason="ServiceUnavailable",
                                        message="etcdserver: request timed out", details={})
        return {
            "issuer": self.ISSUER,
            "jwks_uri": "https://172.18.0.2:6443/openid/v1/jwks",
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
        }

    def _jwks(self, request: kmock.Request) -> Any:
        accept = request.headers.get("Accept") or request.headers.get("accept") or ""
        if "application/jwk-set+json" not in accept:
            raise kmock.KubernetesError(
                status=406, reason="NotAcceptable", details={},
                message="406: Not Acceptable\n\nAvailable representations: "
                        "application/jwk-set+json")
        body = {"keys": self.keys} if self.keyset is None else self.keyset
        return kmock.Response(payload=json.dumps(body).encode(),
                              headers={"Content-Type": "application/jwk-set+json"})

    def requests(self, path: str) -> int:
        """How many requests the operator has made to `path` so far."""
        return sum(1 for r in list(self.api) if r.url.path == path)


def _rv(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for k, v in patch.items():
        if v is None:
            base.pop(k, None)
        elif isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


def service_deployment(replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "agenttx", "namespace": SERVICE_NS, "generation": 1,
                     "resourceVersion": "1"},
        "spec": {
            "replicas": replicas,
            "template": {"spec": {
                "containers": [{"name": "agenttx", "image": "agenttx:test",
                                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
                "volumes": [{"name": "tmp", "emptyDir": {}}],
            }},
        },
        "status": {"observedGeneration": 1, "updatedReplicas": replicas, "replicas": replicas,
                   "availableReplicas": replicas},
    }


def policy(name: str, spec: dict[str, Any], namespace: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "agenttx.io/v1alpha1",
        "kind": "AgentTxPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@contextlib.asynccontextmanager
async def running_operator(config: OperatorConfig, api: ApiServer, *, token: str | None = None
                           ) -> AsyncIterator[None]:
    """The real `main.operate` in its own thread and event loop (as in production, never
    the test's loop), pointed at kmock (with `token` as its bearer token); stopped and
    joined on exit."""
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []
    url = str(api.url).rstrip("/")

    def target() -> None:
        try:
            asyncio.run(main.operate(config, credentials=Credentials(server=url, token=token),
                                     stop_flag=stop, ready_flag=ready))
        except BaseException as exc:  # surfaced in the test
            failure.append(exc)

    thread = threading.Thread(target=target, name="kopf-under-test", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not ready.is_set():
            assert not failure, failure
            assert thread.is_alive(), "operator thread died"
            assert time.monotonic() < deadline, "operator did not become ready"
            await asyncio.sleep(0.05)
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 20)
        assert not thread.is_alive(), "operator did not stop"
    assert not failure, failure


async def eventually(check: Callable[[], Any], timeout: float = 15.0,
                     what: str = "condition") -> Any:
    """Poll `check` (sync or async) until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if asyncio.iscoroutine(last):
                last = await last
        except (KeyError, ValueError, IndexError, TypeError):
            last = None
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ---- talking to the emulated API server as a user would --------------------------

BASE = "/apis/agenttx.io/v1alpha1/namespaces/team-a/agenttxpolicies"


async def create(api: ApiServer, body: dict[str, Any]) -> None:
    ns = body["metadata"]["namespace"]
    url = f"/apis/agenttx.io/v1alpha1/namespaces/{ns}/agenttxpolicies"
    async with api.post(url, json=body) as resp:
        assert resp.status < 300, await resp.text()


async def patch_spec(api: ApiServer, name: str, spec: dict[str, Any]) -> None:
    async with api.patch(f"{BASE}/{name}", json={"spec": spec},
                         headers={"Content-Type": "application/merge-patch+json"}) as resp:
        assert resp.status < 300, await resp.text()


async def delete(api: ApiServer, name: str) -> None:
    async with api.delete(f"{BASE}/{name}") as resp:
        assert resp.status < 300, await resp.text()


def obj(api: ApiServer, resource: str, ns: str, name: str) -> dict[str, Any] | None:
    key = (api.resource(resource), ns, name)
    if key not in api.objects or api.objects[key].deleted:
        return None
    return api.objects[key].raw


def got(api: ApiServer, resource: str, ns: str, name: str) -> dict[str, Any]:
    found = obj(api, resource, ns, name)
    assert found is not None, f"{resource} {ns}/{name} does not exist"
    return found


def ready(api: ApiServer, name: str, ns: str = "team-a") -> dict[str, Any] | None:
    body = obj(api, POLICIES, ns, name)
    for cond in (body or {}).get("status", {}).get("conditions", []):
        if cond["type"] == "Ready":
            return cond
    return None


def reason_is(api: ApiServer, name: str, reason: str, generation: int | None = None
              ) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        cond = ready(api, name)
        if cond and cond["reason"] == reason and (
                generation is None or cond["observedGeneration"] == generation):
            return cond
        return None
    return check


def event_reasons(api: ApiServer, name: str) -> list[str]:
    return [raw["reason"] for (res, _, _), o in api.objects.items()
            if res == api.resource(EVENTS) and not o.deleted
            for raw in [o.raw] if raw.get("involvedObject", {}).get("name") == name]


async def published(store: Store, prefix: str, name: str, ns: str = "team-a"
                    ) -> PublishedPolicy | None:
    kv = await store.get(Keys(prefix).policy(ns, name))
    return parse_published_policy(kv.value) if kv else None


async def current(store: Store, prefix: str, name: str, ns: str = "team-a") -> PublishedPolicy:
    p = await published(store, prefix, name, ns)
    assert p is not None, f"{ns}/{name} is not published"
    return p


def mounted(api: ApiServer, ns: str, name: str) -> bool:
    """Whether the service Deployment's pod template mounts the policy's sandbox claim."""
    dep = got(api, DEPLOYMENTS, SERVICE_NS, "agenttx")
    volumes = dep["spec"]["template"]["spec"].get("volumes") or []
    claim = sandboxes.claim_name(ns, name)
    return any((v.get("persistentVolumeClaim") or {}).get("claimName") == claim for v in volumes)


def roll_out(api: ApiServer) -> None:
    """What the Deployment controller reports once the current template is fully rolled
    out: generation observed, every pod updated and available, no old pod left."""
    dep = api.objects[DEPLOYMENTS, SERVICE_NS, "agenttx"]
    gen = dep.raw["metadata"]["generation"]
    replicas = dep.raw["spec"]["replicas"]
    dep.patch({"status": {"observedGeneration": gen, "replicas": replicas,
                          "updatedReplicas": replicas, "availableReplicas": replicas}})


async def bind_claim_and_roll_out(api: ApiServer, ns: str, name: str) -> None:
    """What the PV controller and the Deployment controller would do.

    Waits until the operator has mounted the claim first: it creates the claim, then
    patches the Deployment, and that patch bumps the generation. A rollout reported in
    between would be of the old generation, and nothing would ever roll out the new one
    (this was the race that made the delete tests flaky)."""
    await eventually(lambda: mounted(api, ns, name), what=f"sandbox of {ns}/{name} mounted")
    claim = sandboxes.claim_name(ns, name)
    api.objects[PVCS, SERVICE_NS, claim].patch({"status": {"phase": "Bound"}})
    roll_out(api)


# ---- toolsets ------------------------------------------------------------------------

def toolset(name: str, spec: dict[str, Any], namespace: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "agenttx.io/v1alpha1", "kind": "AgentTxToolset",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def toolsets_url(namespace: str = "team-a") -> str:
    return f"/apis/agenttx.io/v1alpha1/namespaces/{namespace}/agenttxtoolsets"


async def create_toolset(api: ApiServer, body: dict[str, Any]) -> None:
    async with api.post(toolsets_url(body["metadata"]["namespace"]), json=body) as resp:
        assert resp.status < 300, await resp.text()


async def patch_toolset(api: ApiServer, name: str, spec: dict[str, Any],
                        namespace: str = "team-a") -> None:
    async with api.patch(f"{toolsets_url(namespace)}/{name}", json={"spec": spec},
                         headers={"Content-Type": "application/merge-patch+json"}) as resp:
        assert resp.status < 300, await resp.text()


async def delete_toolset(api: ApiServer, name: str, namespace: str = "team-a") -> None:
    async with api.delete(f"{toolsets_url(namespace)}/{name}") as resp:
        assert resp.status < 300, await resp.text()


def secret(name: str, data: dict[str, str], namespace: str = "team-a") -> dict[str, Any]:
    """A Secret as the API server stores it (values base64)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


async def put_secret(api: ApiServer, body: dict[str, Any]) -> None:
    """Create the Secret, or replace its data (a rotation)."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    if obj(api, SECRETS, ns, name) is None:
        async with api.post(f"/api/v1/namespaces/{ns}/secrets", json=body) as resp:
            assert resp.status < 300, await resp.text()
        return
    async with api.patch(f"/api/v1/namespaces/{ns}/secrets/{name}", json={"data": body["data"]},
                         headers={"Content-Type": "application/merge-patch+json"}) as resp:
        assert resp.status < 300, await resp.text()


def toolset_ready(api: ApiServer, name: str, ns: str = "team-a") -> dict[str, Any] | None:
    body = obj(api, TOOLSETS, ns, name)
    for cond in (body or {}).get("status", {}).get("conditions", []):
        if cond["type"] == "Ready":
            return cond
    return None


def toolset_reason_is(api: ApiServer, name: str, reason: str, generation: int | None = None,
                      ns: str = "team-a") -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        cond = toolset_ready(api, name, ns)
        if cond and cond["reason"] == reason and (
                generation is None or cond["observedGeneration"] == generation):
            return cond
        return None
    return check


def events_of(api: ApiServer, name: str, kind: str = "AgentTxToolset") -> list[dict[str, Any]]:
    """Every event posted about the object `name` of `kind`."""
    return [o.raw for (res, _, _), o in list(api.objects.items())
            if res == api.resource(EVENTS) and not o.deleted
            and o.raw.get("involvedObject", {}).get("name") == name
            and o.raw.get("involvedObject", {}).get("kind") == kind]
