"""The operator's few Kubernetes API calls, over one aiohttp session.

Why not the `kubernetes` client's generated APIs: they are synchronous (every call would
block kopf's event loop or need a thread) and turn objects into models, while the
pure decision modules work on plain dicts and need exact control of the patch content
type (RFC 6902 JSON patch for the Deployment, merge patch for claims). We still use
the `kubernetes` package to *load* credentials (in-cluster service account or
kubeconfig, exec plugins included), exactly as kopf's own `login_via_client` does, and
hand kopf the same credentials through a login handler: one identity for both.

What it must never do: decide anything. It fetches and sends what the pure modules computed,
and reports "not found" as None where the caller treats absence as a state.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import ssl
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

from . import policy_spec, toolset_spec

JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "agenttx-operator"


@dataclasses.dataclass(frozen=True)
class Credentials:
    """How to reach and authenticate to the API server."""

    server: str
    token: str | None = None
    scheme: str | None = "Bearer"
    ca_path: str | None = None
    insecure: bool = False
    certificate_path: str | None = None
    private_key_path: str | None = None

    def connection_info(self) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=self.server,
            token=self.token,
            scheme=self.scheme if self.token else None,
            ca_path=self.ca_path,
            insecure=self.insecure,
            certificate_path=self.certificate_path,
            private_key_path=self.private_key_path,
        )

    def headers(self) -> dict[str, str]:
        if not self.token:
            return {}
        return {"Authorization": f"{self.scheme} {self.token}" if self.scheme else self.token}

    def ssl_context(self) -> ssl.SSLContext | bool:
        return _ssl_context(self)


@functools.lru_cache(maxsize=8)
def _ssl_context(creds: Credentials) -> ssl.SSLContext | bool:
    """One SSL context per set of credentials (loading CA files on every request is slow)."""
    if not creds.server.startswith("https:"):
        return False
    ctx = ssl.create_default_context(cafile=creds.ca_path)
    if creds.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if creds.certificate_path:
        ctx.load_cert_chain(creds.certificate_path, creds.private_key_path)
    return ctx


def load_credentials() -> Credentials:
    """In-cluster service account first, then kubeconfig ($KUBECONFIG, ~/.kube/config).

    Called again on every 401, so a rotated service-account token is picked up.
    """
    import kubernetes.client
    import kubernetes.config

    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    except kubernetes.config.ConfigException:
        try:
            # $KUBECONFIG read now (kubernetes reads it once, at import).
            kubernetes.config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg
            )
        except kubernetes.config.ConfigException as exc:
            raise kopf.LoginError(
                "cannot authenticate: neither in-cluster nor via kubeconfig"
            ) from exc
    # Same extraction as kopf's login_via_client (kubernetes >= 36 keeps the token
    # under "BearerToken", older versions under "authorization").
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    )
    return Credentials(
        server=cfg.host,
        token=token,
        scheme=scheme or "Bearer",
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


class KubeError(Exception):
    """The API server refused a request (any status other than the expected ones)."""

    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.message = message


class KubeClient:
    """Async JSON calls to the API server. Create and close it in the loop that uses it."""

    def __init__(
        self,
        credentials: Credentials | Callable[[], Credentials] = load_credentials,
        *,
        timeout: float = 30.0,
    ) -> None:
        if isinstance(credentials, Credentials):
            fixed = credentials
            self._loader: Callable[[], Credentials] = lambda: fixed
        else:
            self._loader = credentials
        self._credentials: Credentials | None = None
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def credentials(self, *, refresh: bool = False) -> Credentials:
        if self._credentials is None or refresh:
            self._credentials = self._loader()
        return self._credentials

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
        missing_ok: bool = False,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        for attempt in (0, 1):
            creds = self.credentials(refresh=attempt > 0)
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=self._timeout)
            headers = {"Accept": accept, **creds.headers()}
            data = None
            if body is not None:
                headers["Content-Type"] = content_type
                data = json.dumps(body)
            async with self._session.request(
                method, creds.server.rstrip("/") + path, data=data, headers=headers,
                params=params, ssl=creds.ssl_context(),
            ) as resp:
                if resp.status == 401 and attempt == 0:
                    continue  # token rotated: reload credentials once
                if resp.status == 404 and missing_ok:
                    return None
                text = await resp.text()
                if resp.status >= 400:
                    try:
                        message = json.loads(text).get("message", text)
                    except (ValueError, AttributeError):
                        message = text
                    raise KubeError(resp.status, method, path, str(message)[:500])
                try:
                    return json.loads(text) if text else {}
                except ValueError:
                    raise KubeError(resp.status, method, path,
                                    f"the response is not JSON: {text[:200]!r}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- claims -------------------------------------------------------------------

    @staticmethod
    def _pvc_path(namespace: str, name: str | None = None) -> str:
        base = f"/api/v1/namespaces/{quote(namespace)}/persistentvolumeclaims"
        return base if name is None else f"{base}/{quote(name)}"

    async def get_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._request("GET", self._pvc_path(namespace, name), missing_ok=True)

    async def create_pvc(self, pvc: dict[str, Any]) -> dict[str, Any]:
        meta = pvc["metadata"]
        result = await self._request(
            "POST", self._pvc_path(meta["namespace"]), body=pvc,
            params={"fieldManager": FIELD_MANAGER},
        )
        assert result is not None
        return result

    async def patch_pvc(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        result = await self._request(
            "PATCH", self._pvc_path(namespace, name), body=patch, content_type=MERGE_PATCH,
            params={"fieldManager": FIELD_MANAGER},
        )
        assert result is not None
        return result

    async def delete_pvc(self, namespace: str, name: str) -> bool:
        """Delete a claim; False when it was already gone."""
        result = await self._request("DELETE", self._pvc_path(namespace, name), missing_ok=True)
        return result is not None

    # ---- the service Deployment ---------------------------------------------------

    @staticmethod
    def _deployment_path(namespace: str, name: str) -> str:
        return f"/apis/apps/v1/namespaces/{quote(namespace)}/deployments/{quote(name)}"

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._request("GET", self._deployment_path(namespace, name), missing_ok=True)

    async def json_patch_deployment(
        self, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        result = await self._request(
            "PATCH", self._deployment_path(namespace, name), body=ops, content_type=JSON_PATCH,
            params={"fieldManager": FIELD_MANAGER},
        )
        assert result is not None
        return result

    # ---- service-account issuer discovery (non-resource URLs) --------------------

    async def get_json(self, path: str, *, accept: str = JSON) -> Any:
        """GET a non-resource URL of the API server and parse its JSON body (any JSON
        value: the caller validates it). Needs RBAC `get` on that nonResourceURL."""
        return await self._request("GET", path, accept=accept)

    # ---- policies -----------------------------------------------------------------

    async def list_policies(self, namespaces: Iterable[str] | None) -> set[tuple[str, str]]:
        """(namespace, name) of every AgentTxPolicy, cluster-wide or in `namespaces`."""
        base = f"/apis/{policy_spec.GROUP}/{policy_spec.VERSION}"
        paths = (
            [f"{base}/{policy_spec.PLURAL}"]
            if namespaces is None
            else [f"{base}/namespaces/{quote(ns)}/{policy_spec.PLURAL}" for ns in namespaces]
        )
        found: set[tuple[str, str]] = set()
        for path in paths:
            # No missing_ok: the orphan sweep deletes what is not listed, so anything but
            # a successful list must stop it.
            result = await self._request("GET", path) or {}
            for item in result.get("items") or []:
                meta = item.get("metadata", {})
                found.add((meta.get("namespace", ""), meta.get("name", "")))
        return found

    async def policy_resource_served(self) -> bool:
        """Whether the API server serves agenttx.io/v1alpha1 agenttxpolicies (the CRD is
        installed). Discovery needs no RBAC beyond system:discovery."""
        return await self.resource_served(policy_spec.GROUP, policy_spec.VERSION,
                                          policy_spec.PLURAL)

    async def resource_served(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `group/version` (its CRD is
        installed), by discovery."""
        result = await self._request("GET", f"/apis/{group}/{version}", missing_ok=True)
        resources = (result or {}).get("resources") or []
        return any(r.get("name") == plural for r in resources)

    # ---- toolsets -----------------------------------------------------------------

    @staticmethod
    def _toolsets_path(namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{toolset_spec.GROUP}/{toolset_spec.VERSION}"
        if namespace is None:
            return f"{base}/{toolset_spec.PLURAL}"
        path = f"{base}/namespaces/{quote(namespace)}/{toolset_spec.PLURAL}"
        return path if name is None else f"{path}/{quote(name)}"

    async def list_toolsets_in(self, namespace: str) -> list[dict[str, Any]]:
        """Every AgentTxToolset of one namespace (for the prefix check)."""
        result = await self._request("GET", self._toolsets_path(namespace)) or {}
        return list(result.get("items") or [])

    async def list_toolsets(self, namespaces: Iterable[str] | None) -> set[tuple[str, str]]:
        """(namespace, name) of every AgentTxToolset, cluster-wide or in `namespaces`.
        Raises on any failure: the orphan sweep deletes what is not listed."""
        paths = ([self._toolsets_path()] if namespaces is None
                 else [self._toolsets_path(ns) for ns in namespaces])
        found: set[tuple[str, str]] = set()
        for path in paths:
            result = await self._request("GET", path) or {}
            for item in result.get("items") or []:
                meta = item.get("metadata", {})
                found.add((meta.get("namespace", ""), meta.get("name", "")))
        return found

    async def patch_toolset_status(self, namespace: str, name: str, status: dict[str, Any]
                                   ) -> None:
        """Merge-patch a toolset's status subresource (for the periodic re-check, which
        runs outside kopf's handlers and their patch)."""
        await self._request(
            "PATCH", self._toolsets_path(namespace, name) + "/status", body={"status": status},
            content_type=MERGE_PATCH, params={"fieldManager": FIELD_MANAGER},
        )

    # ---- Secrets (a toolset's header values) -----------------------------------------
    # Bodies of these requests and responses hold secret values: they are never logged,
    # and errors carry the API server's message only (which never echoes Secret data).

    @staticmethod
    def _secret_path(namespace: str, name: str | None = None) -> str:
        base = f"/api/v1/namespaces/{quote(namespace)}/secrets"
        return base if name is None else f"{base}/{quote(name)}"

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._request("GET", self._secret_path(namespace, name), missing_ok=True)

    async def create_secret(self, secret: dict[str, Any]) -> dict[str, Any]:
        result = await self._request(
            "POST", self._secret_path(secret["metadata"]["namespace"]), body=secret,
            params={"fieldManager": FIELD_MANAGER},
        )
        assert result is not None
        return result

    async def patch_secret(self, namespace: str, name: str, patch: dict[str, Any]
                           ) -> dict[str, Any]:
        result = await self._request(
            "PATCH", self._secret_path(namespace, name), body=patch, content_type=MERGE_PATCH,
            params={"fieldManager": FIELD_MANAGER},
        )
        assert result is not None
        return result

    async def delete_secret(self, namespace: str, name: str) -> bool:
        """Delete a Secret; False when it was already gone."""
        result = await self._request("DELETE", self._secret_path(namespace, name),
                                     missing_ok=True)
        return result is not None
