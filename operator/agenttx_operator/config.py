"""`agenttx operator` settings: flags or env (`AGENTTX_OPERATOR_<FIELD>`), flags win.

Why pydantic-settings: the service's settings work the same way, so the Helm chart
configures both processes with plain env vars, and every field is documented once
(docs/configuration.md is generated from these descriptions).
Lists (`etcd_endpoints`, `namespaces`) are comma-separated in env and flags alike.
"""

from __future__ import annotations

import pathlib
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

SERVICE_ACCOUNT_NAMESPACE = pathlib.Path(
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
)


def _split(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple):
        out: list[str] = []
        for item in value:
            out += [p.strip() for p in str(item).split(",") if p.strip()]
        return out
    return value


class OperatorConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="AGENTTX_OPERATOR_",
        cli_kebab_case=True,
        cli_prog_name="agenttx operator",
        cli_implicit_flags=True,
        extra="ignore",
    )

    etcd_endpoints: Annotated[list[str], NoDecode] = Field(
        description="etcd client endpoints, comma-separated host:port (required)."
    )
    etcd_prefix: str = Field(
        "/agenttx",
        description="Key prefix shared with the service, in the service's layout "
        "(agenttx.contracts.layout.Keys: `agenttx` and `/agenttx/` both mean /agenttx); "
        "policies go to /<prefix>/policies/, the issuer keys to /<prefix>/auth/jwks.",
    )
    etcd_ca_file: str | None = Field(None, description="CA bundle to verify etcd (TLS).")
    etcd_cert_file: str | None = Field(None, description="Client certificate for etcd mTLS.")
    etcd_key_file: str | None = Field(None, description="Client key for etcd mTLS.")
    etcd_timeout_s: float = Field(5.0, gt=0, description="Timeout of one etcd request.")

    service_namespace: str | None = Field(
        None,
        description="Namespace of the service Deployment and sandbox claims "
        "(default: the operator pod's own namespace).",
    )
    service_deployment: str = Field("agenttx", description="The service Deployment's name.")
    service_container: str = Field(
        "agenttx", description="The container in it that mounts the sandboxes."
    )
    sandbox_mount_root: str = Field(
        "/sandboxes", description="Sandboxes mount at <root>/<policy ns>/<policy name>."
    )
    toolset_mount_root: str = Field(
        "/etc/agenttx/toolsets",
        description="Toolsets' header values are projected read-only into the service "
        "container at <root>/<toolset ns>/<toolset name>/<secret>/<key>.",
    )
    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Namespaces whose policies are served, comma-separated (empty: all).",
    )

    liveness_host: str = Field("0.0.0.0", description="Address of the liveness endpoint.")
    liveness_port: int = Field(8080, ge=1, le=65535, description="Port of GET /healthz.")

    etcd_retry_base_s: float = Field(
        2.0, gt=0,
        description="First retry delay while etcd is unavailable, and after a failed "
        "issuer-key refresh (doubles).",
    )
    etcd_retry_max_s: float = Field(60.0, gt=0, description="Longest retry delay.")
    delete_etcd_attempts: int = Field(
        8,
        ge=1,
        description="On delete with etcd down, attempts before the finalizer is released "
        "anyway (the orphan sweep unpublishes the key once etcd is back).",
    )
    volume_poll_s: float = Field(
        5.0, gt=0, description="How often a VolumePending policy is re-checked."
    )
    upstream_retry_base_s: float = Field(
        2.0, gt=0,
        description="First retry delay of a toolset whose upstream does not answer "
        "tools/list, lacks a tool, or whose header Secret is missing (doubles).",
    )
    upstream_retry_max_s: float = Field(
        60.0, gt=0, description="Longest retry delay of such a toolset."
    )
    toolset_resync_s: float = Field(
        60.0, gt=0,
        description="How often every toolset is checked again without a change to it: its "
        "header Secrets re-copied (a rotated value reaches the service pods), its upstream "
        "asked for tools/list, its prefix checked (Ready reports what changed).",
    )
    sweep_interval_s: float = Field(
        300.0, gt=0, description="How often orphaned published policies are swept."
    )
    jwks_publish: bool = Field(
        True,
        description="Publish the cluster's service-account issuer and keys (from the API "
        "server's /.well-known/openid-configuration and /openid/v1/jwks) to "
        "<prefix>/auth/jwks, for the service's `--auth kubernetes` (docs/security.md).",
    )
    jwks_refresh_s: float = Field(
        300.0, gt=0,
        description="How often the issuer keys are re-read, so a key rotation reaches the "
        "service (a failed read is retried sooner, with backoff).",
    )
    log_format: Literal["json", "plain", "full"] = Field(
        "plain", description="Log line format (json for log collectors)."
    )
    verbose: bool = Field(False, description="Debug logging.")

    @field_validator("etcd_endpoints", "namespaces", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return _split(value)

    @field_validator("etcd_endpoints")
    @classmethod
    def _endpoints_required(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one etcd endpoint is required")
        return value

    def resolved_service_namespace(self) -> str:
        """`service_namespace`, else the namespace of the pod's service account."""
        if self.service_namespace:
            return self.service_namespace
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        except OSError:
            raise ValueError(
                "service_namespace is not set and the operator is not running in a pod; "
                "pass --service-namespace or AGENTTX_OPERATOR_SERVICE_NAMESPACE"
            ) from None
