"""Settings for `agenttx serve` (pydantic-settings; env prefix AGENTTX_, same names as flags).

Every field is documented because `agenttx serve --help` and docs/configuration.md
(scripts/gen_config_docs.py) are generated from these descriptions; the flags come from
this model through pydantic-settings' CLI (agenttx.commands). Nested settings use `__` in
the environment and `.` (or `-`) in flags: AGENTTX_DEFAULT_POLICY__MAX_LOCAL_DEPTH=2 is
`--default-policy.max-local-depth 2`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from . import failpoints
from .contracts.policy import (
    APPROVAL_TIMEOUT_DEFAULT_S,
    DEPTH_MAX,
    DEPTH_MIN,
    FACTOR_MAX,
    FACTOR_MIN,
    ApprovalSettings,
    approval_from_spec,
)

# What needs approval when no AgentTxPolicy says more: nothing (docs/approvals.md).
DEFAULT_APPROVAL: dict[str, Any] = {"required": [], "approvers": [],
                                    "timeoutSeconds": APPROVAL_TIMEOUT_DEFAULT_S,
                                    "notifyChannel": ""}


class DefaultPolicy(BaseModel):
    """Server-wide defaults (docs/architecture.md, "Policies"), overridden by AgentTxPolicy
    and requests; approvals are only ever added to by the layers above
    (docs/approvals.md)."""

    max_local_depth: int = Field(3, ge=DEPTH_MIN, le=DEPTH_MAX,
                                 description="retries of a failing step before escalating")
    max_global_resets: int = Field(1, ge=DEPTH_MIN, le=DEPTH_MAX,
                                   description="global resets before aborting")
    replay_budget_factor: float = Field(
        2.0, ge=FACTOR_MIN, le=FACTOR_MAX,
        description="undone steps allowed per highest step reached")

    approval: dict[str, Any] = Field(
        default_factory=lambda: dict(DEFAULT_APPROVAL),
        description='what needs a person\'s approval before it commits, as JSON: '
        '{"required": [{"channel": "payments"}, {"tool": "tickets.*"}], "approvers": [], '
        '"timeoutSeconds": 86400, "notifyChannel": ""} (default: nothing required)')

    @field_validator("replay_budget_factor")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    @field_validator("approval", mode="before")
    @classmethod
    def _approval(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = json.loads(v) if v.strip() else {}
        approval_from_spec(v)  # the one parser (contracts.policy): names the bad field
        return v

    def approval_settings(self) -> ApprovalSettings:
        return approval_from_spec(self.approval)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTTX_", env_nested_delimiter="__",
                                      extra="ignore", cli_kebab_case=True,
                                      cli_prog_name="agenttx serve", cli_avoid_json=True)

    listen: str = Field("127.0.0.1:50051", description="gRPC listen address host:port")
    etcd_endpoints: str = Field(
        "", description="comma-separated etcd endpoints (host:port); empty = start an "
        "embedded etcd under --data-dir and stop it on exit")
    etcd_prefix: str = Field("/agenttx", description="key prefix; deployments sharing one etcd "
                             "use different prefixes")
    etcd_timeout_s: float = Field(5.0, gt=0, description="deadline of one etcd request")
    etcd_ca_file: str | None = Field(None, description="CA bundle for TLS to etcd")
    etcd_cert_file: str | None = Field(None, description="client certificate for etcd mTLS")
    etcd_key_file: str | None = Field(None, description="client key for etcd mTLS")
    etcd_tls_server_name: str | None = Field(
        None, description="name to verify etcd's certificates against (default: the "
        "endpoint's host; the first one's when several IP endpoints are given)")
    etcd_max_txn_ops: int = Field(
        1024, ge=16, description="etcd --max-txn-ops of the cluster; bounds a transaction's "
        "write set (the embedded etcd is started with it)")
    etcd_max_request_bytes: int = Field(
        16 * 1024 * 1024, ge=1024 * 1024, description="etcd --max-request-bytes of the cluster; "
        "bounds what one step and one commit may carry (the embedded etcd is started with it)")
    data_dir: str = Field(".agenttx", description="state folder for the embedded etcd and "
                          "the default sandbox")
    fs_root: str | None = Field(None, description="sandbox root for fs tools (default "
                                "<data-dir>/sandbox); policies with a sandbox override it")
    tx_idle_timeout_s: int = Field(900, ge=1, description="abort transactions idle this long")
    default_policy: DefaultPolicy = Field(default_factory=DefaultPolicy)
    effect_channels: dict[str, Any] = Field(
        default_factory=dict, description='JSON object name -> {"kind": "webhook"|"email"|"log", ...}')
    replica_ttl_s: int = Field(10, ge=1, le=300, description="lease TTL of this replica's "
                               "liveness key; a crashed replica's half-done work is taken over "
                               "after it expires")
    leader_ttl_s: int = Field(10, ge=1, le=300, description="lease TTL of the dispatcher and "
                              "reaper leadership; failover happens within it")
    effect_claim_s: float = Field(30.0, gt=0, description="how long a committing replica owns "
                                  "delivery of its effects before the dispatcher may retry them")
    effect_poll_s: float = Field(1.0, gt=0, description="dispatcher scan interval")
    temp_sweep_s: float = Field(600.0, gt=0, description="how often the reaper leader sweeps "
                                "fs.write temp files whose step is gone")
    temp_min_age_s: float = Field(300.0, ge=10, description="a temp file younger than this is "
                                  "never swept (it may belong to a step in flight; keep it well "
                                  "above --etcd-timeout-s)")
    replica_id: str | None = Field(None, description="this replica's id (default: host-pid)")
    grace_period_s: float = Field(20.0, ge=0, description="SIGTERM: time to drain in-flight RPCs")
    workers: int = Field(1, ge=1, le=64, description="replica processes serving --listen "
                         "together (SO_REUSEPORT), each a full replica with its own id "
                         "(<replica-id>-w<i>), leases and caches; use one per core "
                         "(docs/operations.md)")
    log_format: str = Field("json", description="json or text")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR")
    failpoints: str = Field("", description="fault-injection tests only: crash or pause at "
                            "named points, e.g. fs.write.after_intent=crash "
                            "(agenttx/failpoints.py lists them); empty = none")
    event_loop: str = Field("uvloop", description="asyncio event loop: uvloop (default, "
                            "when installed) or asyncio")

    # ---- security (docs/security.md) -----------------------------------------------------
    tls_cert_file: str | None = Field(None, description="serve TLS with this certificate "
                                      "chain (PEM); re-read when it changes")
    tls_key_file: str | None = Field(None, description="private key (PEM) of --tls-cert-file")
    tls_client_ca_file: str | None = Field(None, description="require client certificates "
                                           "signed by this CA bundle (mTLS)")
    auth: str = Field("none", description="authentication: none, token, kubernetes or mtls")
    auth_tokens_file: str | None = Field(None, description="--auth token: YAML/JSON file of "
                                         "sha256 token hashes and principals; re-read when "
                                         "it changes")
    auth_k8s_issuer: str | None = Field(None, description="--auth kubernetes: required token "
                                        "issuer (default: the one the operator publishes "
                                        "with the keys)")
    auth_k8s_audience: str = Field("agenttx", description="--auth kubernetes: required "
                                   "token audience")
    allow_unauthenticated: bool = Field(False, description="allow --auth none on a "
                                        "non-loopback --listen address")
    auth_admins: str = Field("", description="comma-separated principals with the admin role "
                             "(may Get, List and Rollback any transaction), in any --auth mode; "
                             "token files can also grant it per token")
    service_namespace: str = Field("", description="namespace the service runs in: its "
                                   "policies apply to every principal")
    max_open_transactions: int = Field(1000, ge=1, description="open transactions per "
                                       "principal across the deployment")
    max_requests_per_s: float = Field(0.0, ge=0, description="requests per second per "
                                      "principal on this replica (0 = unlimited)")
    effect_key_retention_s: int = Field(86400, ge=1, description="how long a delivered "
                                        "idempotency key stays reserved")
    history_retention_s: int = Field(604800, ge=2, description="how long a transaction's "
                                     "history (GetTransactionHistory, agenttx tx show) is "
                                     "kept after it ends; an open transaction's is kept "
                                     "while it is open")

    # ---- toolsets (docs/toolsets.md) --------------------------------------------------------
    toolsets_file: str | None = Field(None, description="YAML/JSON file of toolsets (MCP "
                                      "servers whose tools join transactions), for use without "
                                      "Kubernetes; re-read when it changes")
    toolset_max_connections: int = Field(16, ge=1, le=1024, description="HTTP connections "
                                         "each toolset's upstream MCP server may get from this "
                                         "replica")
    toolsets_refresh_s: float = Field(300.0, gt=0, description="how often each toolset's "
                                      "upstream tools/list (descriptions, input schemas) is "
                                      "fetched again")

    # ---- observability (docs/operations.md) ----------------------------------------------
    metrics_listen: str = Field("", description="host:port for Prometheus /metrics "
                                "(empty = off)")

    @field_validator("failpoints")
    @classmethod
    def _failpoints_parse(cls, v: str) -> str:
        failpoints.parse(v)  # a typo fails at start-up, not silently at the point
        return v

    @field_validator("effect_channels", mode="before")
    @classmethod
    def _channels_json(cls, v: Any) -> Any:
        if isinstance(v, str):
            return json.loads(v) if v.strip() else {}
        return v

    def admins(self) -> frozenset[str]:
        return frozenset(a.strip() for a in self.auth_admins.split(",") if a.strip())

    def endpoints(self) -> list[str]:
        return [e.strip() for e in self.etcd_endpoints.split(",") if e.strip()]
