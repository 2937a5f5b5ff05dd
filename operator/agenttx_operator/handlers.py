"""kopf handlers for AgentTxPolicy: thin wiring over the pure modules (`policy_spec`,
`sandboxes`, `mounts`, `conditions`, `lifecycle`), `kube` and `publishing`; and what
the operator runs once (login, startup, cleanup, the orphan sweep of policies and
toolsets). AgentTxToolset's handlers are in `toolset_handlers`.

Each handler fetches what it needs, asks the pure modules what to do, does it, then writes
the status (through kopf's `patch`, applied even when the handler raises) before it
raises: `kopf.PermanentError` for an invalid spec, `kopf.TemporaryError(delay=...)`
for anything that will pass (etcd down, a volume still binding, an API conflict).

Ordering, so a transaction never sees a sandbox path that is not there:
  create/update/resume: claim -> mount -> wait until Bound and rolled out -> publish;
                        a policy that drops its sandbox is published first, then
                        unmounted (and its claim deleted unless it is marked Retain).
  delete (finalizer):   unpublish -> unmount -> delete the claim unless Retain.

Operator-wide background tasks (started at startup, cancelled at cleanup; kopf would
cancel them as "hung" at exit anyway, so they only ever stop by cancellation):
  orphan sweep:         every `sweep_interval_s`, see below (toolsets' keys too).
  issuer keys:          every `jwks_refresh_s` (`jwks_publish`), read the API server's
                        service-account issuer discovery and keys with the operator's
                        own credentials and publish them for the service (SPEC §9).
                        A failure (API server, etcd, a document that does not
                        validate) keeps what is published, logs a warning and retries
                        with backoff: keys are never deleted because of a hiccup.

The finalizer is never stuck: a delete that keeps failing (etcd down, API errors) is
retried with backoff `delete_etcd_attempts` times, then a Warning event is posted and
the finalizer released. A key left behind that way is removed by the orphan sweep
(`publishing.sweep_orphans`, every `sweep_interval_s`) once etcd is reachable again:
availability of `kubectl delete` is traded for a bounded window in which the service
may still apply a deleted policy.

What the handlers must never do: block the event loop, or talk to etcd or the API
server other than through `publishing` and `kube`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf

from agenttx.contracts.layout import Keys
from agenttx.errors import StoreError
from agenttx.store.client import Store
from agenttx.tasks import BackgroundTasks

from . import conditions, jwks, lifecycle, mounts, policy_spec, publishing, sandboxes
from .config import OperatorConfig
from .kube import KubeClient, KubeError

RESOURCE = (policy_spec.GROUP, policy_spec.VERSION, policy_spec.PLURAL)
FINALIZER = "agenttx.io/finalizer"
ANNOTATION_PREFIX = "agenttx.io"

log = logging.getLogger(__name__)


def operator_keys(config: OperatorConfig) -> Keys:
    """The etcd keys, in the service's own layout for the same `--etcd-prefix`."""
    return Keys(config.etcd_prefix)


@dataclass
class Runtime:
    """What the handlers share; created by `main.operate` in the operator's loop and
    handed to kopf as `memo.runtime`."""

    config: OperatorConfig
    target: sandboxes.Target
    store: Store
    kube: KubeClient
    keys: Keys = field(init=False, repr=False)
    background: BackgroundTasks = field(
        default_factory=lambda: BackgroundTasks("operator"), repr=False)

    def __post_init__(self) -> None:
        self.keys = operator_keys(self.config)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _claim_ref(rt: Runtime, namespace: str, name: str) -> str:
    return f"{rt.target.service_namespace}/{sandboxes.claim_name(namespace, name)}"


def _old_reason(status: Any) -> str | None:
    cond = conditions.find_condition(status, conditions.CONDITION_READY)
    return None if cond is None else cond.get("reason")


def _write_status(
    patch: kopf.Patch,
    status: Any,
    *,
    generation: int,
    reason: str,
    message: str,
    claim: str | None,
    claim_sync: conditions.ClaimSync | None | conditions.Keep = conditions.KEEP,
) -> None:
    """Put the status change into kopf's patch (only the fields that differ)."""
    new = conditions.build_status(
        dict(status or {}), generation=generation, reason=reason, message=message,
        sandbox_claim=claim, now=_now(), claim_sync=claim_sync,
    )
    for key, value in (conditions.status_patch(dict(status or {}), new) or {}).items():
        patch.status[key] = value


def _warn_once(body: Any, status: Any, reason: str, message: str) -> None:
    """A Warning event when the Ready reason changes (not on every retry)."""
    if _old_reason(status) != reason:
        kopf.warn(body, reason=reason, message=message)


# ---- activities --------------------------------------------------------------------

@kopf.on.login()
def agenttx_login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf and the operator's own API calls use one set of credentials."""
    rt: Runtime = memo.runtime
    return rt.kube.credentials(refresh=True).connection_info()


# A startup that keeps failing (API server unreachable, CRD missing) ends the process
# after a few tries, so the pod restarts visibly instead of idling.
@kopf.on.startup(retries=3, backoff=2.0)
async def agenttx_startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    rt: Runtime = memo.runtime
    # Our own annotation prefix and finalizer name instead of kopf.zalando.org.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.reporting_component = "agenttx-operator"
    # One replica with a Recreate strategy, so no peering (and no RBAC for it); no
    # runtime scanning of CRDs/namespaces either (no cluster-wide list rights for it).
    settings.peering.standalone = True
    settings.scanning.disabled = True
    if not await rt.kube.policy_resource_served():
        raise kopf.PermanentError(
            f"the API server does not serve {policy_spec.PLURAL}.{policy_spec.GROUP}/"
            f"{policy_spec.VERSION}: install the CRD (crds/) first"
        )
    rt.background.start(_sweep_forever(rt), name="agenttx-orphan-sweep")
    if rt.config.jwks_publish:
        rt.background.start(_jwks_forever(rt), name="agenttx-jwks-refresh")
    else:
        log.info("not publishing the service-account issuer keys (jwks_publish is off)")
    logger.info(
        "serving AgentTxPolicies and AgentTxToolsets in %s; sandboxes and header files go to %s/%s",
        ", ".join(rt.config.namespaces) or "all namespaces",
        rt.target.service_namespace, rt.target.deployment,
    )


@kopf.on.cleanup()
async def agenttx_cleanup(memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime = memo.runtime
    await rt.background.stop()


async def sweep_once(rt: Runtime) -> list[bytes]:
    """Unpublish the keys of policies that no longer exist (see module docstring)."""
    namespaces = rt.config.namespaces or None
    published = await publishing.read_published(rt.store, rt.keys)
    existing = await rt.kube.list_policies(namespaces)
    return await publishing.sweep_orphans(rt.store, rt.keys, published, existing, namespaces)


async def sweep_toolsets_once(rt: Runtime) -> list[bytes]:
    """Unpublish the keys of toolsets that no longer exist (same order as `sweep_once`:
    etcd is read before the toolsets are listed)."""
    namespaces = rt.config.namespaces or None
    published = await publishing.read_published_toolsets(rt.store, rt.keys)
    existing = await rt.kube.list_toolsets(namespaces)
    return await publishing.sweep_orphaned_toolsets(rt.store, rt.keys, published, existing,
                                                    namespaces)


async def _sweep_forever(rt: Runtime) -> None:
    while True:
        for sweep in (sweep_once, sweep_toolsets_once):
            try:
                await sweep(rt)
            except (StoreError, KubeError, OSError) as exc:
                log.warning("orphan sweep skipped: %s", exc)
        await asyncio.sleep(rt.config.sweep_interval_s)


async def refresh_jwks(rt: Runtime) -> bool:
    """Read the issuer discovery and the keys from the API server, publish them if they
    changed. Returns True when it wrote.

    Raises on any failure (the API server, etcd, a document that does not validate);
    nothing is written then, so what was published stays.
    """
    discovery = jwks.parse_discovery(await rt.kube.get_json(jwks.DISCOVERY_PATH))
    # The API server's own route, not jwks_uri's host: that names the issuer as seen
    # from outside, which may be unreachable from this pod (see jwks.JWKS_PATH).
    keyset = await rt.kube.get_json(jwks.JWKS_PATH, accept=jwks.JWKS_ACCEPT)
    document = jwks.build_document(discovery, keyset)
    written = await publishing.publish_jwks(rt.store, rt.keys, jwks.encode(document))
    if written:
        where = rt.keys.auth_jwks().decode()
        elsewhere = (
            "" if discovery.jwks_uri_path == jwks.JWKS_PATH else
            f" (discovery advertises {discovery.jwks_uri}; the keys were read from the "
            f"API server's {jwks.JWKS_PATH})"
        )
        log.info("published the service-account issuer keys at %s: %s%s", where,
                 jwks.describe(document), elsewhere,
                 extra={"jwks_key": where, "jwks_issuer": discovery.issuer,
                        "jwks_kids": [k.get("kid") for k in document["jwks"]["keys"]]})
    return written


# What a refresh can run into that passes by retrying (a bug is logged with traceback).
_JWKS_FAILURES = (KubeError, jwks.JwksError, StoreError, aiohttp.ClientError, TimeoutError,
                  OSError)


async def _jwks_forever(rt: Runtime) -> None:
    failures = 0
    while True:
        try:
            await refresh_jwks(rt)
            failures, delay = 0, rt.config.jwks_refresh_s
        except Exception as exc:
            delay = min(rt.config.jwks_refresh_s, lifecycle.retry_delay(
                failures, rt.config.etcd_retry_base_s, rt.config.etcd_retry_max_s))
            failures += 1
            where = rt.keys.auth_jwks().decode()
            log.warning(
                "cannot refresh the service-account issuer keys (attempt %d; what is "
                "published at %s stays; next try in %.1fs): %s", failures, where, delay, exc,
                exc_info=not isinstance(exc, _JWKS_FAILURES),
                extra={"jwks_key": where, "jwks_failures": failures,
                       "jwks_retry_in_s": delay, "jwks_error": str(exc),
                       "jwks_error_type": type(exc).__name__})
        await asyncio.sleep(delay)


# ---- create / update / resume ------------------------------------------------------

@kopf.on.create(*RESOURCE)
async def agenttxpolicy_create(**kwargs: Any) -> None:
    await _reconcile(**kwargs)


@kopf.on.update(*RESOURCE, field="spec")
async def agenttxpolicy_update(**kwargs: Any) -> None:
    await _reconcile(**kwargs)


@kopf.on.resume(*RESOURCE)
async def agenttxpolicy_resume(**kwargs: Any) -> None:
    await _reconcile(**kwargs)


async def _reconcile(
    *,
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    namespace: str,
    name: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    retry: int,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    rt: Runtime = memo.runtime
    spec_d = dict(spec)
    generation = int(meta.get("generation") or 0)

    errors = policy_spec.validate_spec(spec_d)
    if errors:
        message = "; ".join(errors)
        _write_status(patch, status, generation=generation, reason=conditions.REASON_INVALID_SPEC,
                      message=message, claim=status.get("sandboxClaim") or None)
        _warn_once(body, status, conditions.REASON_INVALID_SPEC, message)
        # Whatever was published for an earlier, valid generation stays: a typo must not
        # silently switch agents back to the server defaults.
        raise kopf.PermanentError(f"invalid spec: {message}")

    policy = policy_spec.normalise(
        namespace, name, generation, spec_d, mount_root=rt.target.mount_root
    )
    claim: str | None = None
    # No sandbox: the claim condition goes. Unknown (the claim could not be read): kept.
    sync: conditions.ClaimSync | None | conditions.Keep = None
    if "sandbox" in spec_d:
        claim = _claim_ref(rt, namespace, name)
        sync = conditions.KEEP
        try:
            ready, why, sync = await _ensure_sandbox(rt, body, namespace, name, spec_d["sandbox"])
        except (KubeError, mounts.ContainerNotFound) as exc:
            ready, why = False, str(exc)
        if isinstance(sync, conditions.ClaimSync):
            _warn_claim_sync(body, status, sync)
        if not ready:
            _write_status(patch, status, generation=generation,
                          reason=conditions.REASON_VOLUME_PENDING, message=why, claim=claim,
                          claim_sync=sync)
            raise kopf.TemporaryError(why, delay=rt.config.volume_poll_s)

    key = rt.keys.policy(namespace, name).decode()
    try:
        written = await publishing.publish(rt.store, rt.keys, policy)
    except StoreError as exc:
        message = f"cannot publish to etcd (will retry): {exc}"
        _write_status(patch, status, generation=generation,
                      reason=conditions.REASON_ETCD_UNAVAILABLE, message=message, claim=claim,
                      claim_sync=sync)
        _warn_once(body, status, conditions.REASON_ETCD_UNAVAILABLE, message)
        raise kopf.TemporaryError(
            message,
            delay=lifecycle.retry_delay(retry, rt.config.etcd_retry_base_s,
                                        rt.config.etcd_retry_max_s),
        ) from exc

    if "sandbox" not in spec_d:
        # Published without a sandbox first, so nothing resolves to a path being removed.
        try:
            await _remove_sandbox(rt, body, namespace, name, delete_claim=None)
        except (KubeError, mounts.ContainerNotFound) as exc:
            raise kopf.TemporaryError(f"cannot remove the old sandbox: {exc}",
                                      delay=rt.config.volume_poll_s) from exc

    _write_status(patch, status, generation=generation, reason=conditions.REASON_PUBLISHED,
                  message=f"generation {generation} published at {key}", claim=claim,
                  claim_sync=sync)
    if written:
        kopf.info(body, reason=conditions.REASON_PUBLISHED,
                  message=f"generation {generation} published at {key}")
    logger.debug("policy %s/%s reconciled (written=%s)", namespace, name, written)


def _warn_claim_sync(body: kopf.Body, status: Any, sync: conditions.ClaimSync) -> None:
    """A Warning event when the cluster refuses a resize, once per distinct refusal (not
    on every reconcile while the condition stays the same)."""
    if sync.reason != conditions.REASON_RESIZE_REFUSED:
        return
    old = conditions.find_condition(status, conditions.CONDITION_CLAIM_SYNCED) or {}
    if (old.get("reason"), old.get("message")) != (sync.reason, sync.message):
        kopf.warn(body, reason="SandboxResizeRefused", message=sync.message)


async def _ensure_sandbox(
    rt: Runtime, body: kopf.Body, namespace: str, name: str, sandbox: dict[str, Any]
) -> tuple[bool, str, conditions.ClaimSync]:
    """Claim exists and matches, Deployment mounts it; then whether it is usable, and
    whether the claim is what the spec asks for.

    A resize the cluster refuses (403/422: a static PV, a class without expansion) is
    reported in the returned ClaimSync, not raised: the sandbox still works at its
    current size, so it must not keep the rest of the spec from being published.
    """
    svc_ns = rt.target.service_namespace
    desired = sandboxes.build_pvc(namespace, name, sandbox, rt.target)
    pvc_name = desired["metadata"]["name"]
    pvc = await rt.kube.get_pvc(svc_ns, pvc_name)
    problems: tuple[str, ...] = ()
    refused: tuple[int, str] | None = None
    if pvc is None:
        try:
            pvc = await rt.kube.create_pvc(desired)
        except KubeError as exc:
            if exc.status != 409:
                raise
            pvc = await rt.kube.get_pvc(svc_ns, pvc_name)
        kopf.info(body, reason="SandboxClaimCreated", message=f"claim {svc_ns}/{pvc_name}")
    else:
        plan = sandboxes.plan_claim(pvc, desired)
        problems = plan.problems
        if plan.patch:
            pvc = await rt.kube.patch_pvc(svc_ns, pvc_name, plan.patch)
        if plan.resize:
            try:
                pvc = await rt.kube.patch_pvc(svc_ns, pvc_name, plan.resize)
            except KubeError as exc:
                if exc.status not in sandboxes.RESIZE_REFUSED_STATUSES:
                    raise
                refused = (exc.status, exc.message)
        for problem in plan.problems:
            kopf.warn(body, reason="SandboxClaimDrift", message=problem)
    sync = sandboxes.claim_sync(pvc, desired, problems=problems, refused=refused)

    deployment = await rt.kube.get_deployment(svc_ns, rt.target.deployment)
    if deployment is None:
        return (False, f"the service Deployment {svc_ns}/{rt.target.deployment} does not exist",
                sync)
    ops = mounts.deployment_patch(deployment, namespace, name, rt.target, mounted=True)
    if ops:
        deployment = await rt.kube.json_patch_deployment(svc_ns, rt.target.deployment, ops)
        kopf.info(body, reason="SandboxMounted", message=(
            f"mounted at {sandboxes.sandbox_path(namespace, name, rt.target.mount_root)} in "
            f"{svc_ns}/{rt.target.deployment}"))
    ready, why = mounts.volume_ready(pvc, deployment)
    return ready, why, sync


async def _remove_sandbox(
    rt: Runtime, body: kopf.Body, namespace: str, name: str, *, delete_claim: bool | None
) -> None:
    """Unmount, then delete the claim (`delete_claim` None: unless it is marked Retain)."""
    svc_ns = rt.target.service_namespace
    deployment = await rt.kube.get_deployment(svc_ns, rt.target.deployment)
    if deployment is not None:
        ops = mounts.deployment_patch(deployment, namespace, name, rt.target, mounted=False)
        if ops:
            await rt.kube.json_patch_deployment(svc_ns, rt.target.deployment, ops)
            kopf.info(body, reason="SandboxUnmounted",
                      message=f"unmounted from {svc_ns}/{rt.target.deployment}")
    pvc_name = sandboxes.claim_name(namespace, name)
    pvc = await rt.kube.get_pvc(svc_ns, pvc_name)
    if pvc is None:
        return
    if delete_claim is None:
        delete_claim = not sandboxes.claim_retained(pvc)
    if delete_claim:
        await rt.kube.delete_pvc(svc_ns, pvc_name)
        kopf.info(body, reason="SandboxClaimDeleted", message=f"claim {svc_ns}/{pvc_name}")
    else:
        kopf.info(body, reason="SandboxClaimRetained",
                  message=f"claim {svc_ns}/{pvc_name} kept (reclaimPolicy: Retain)")


# ---- delete ------------------------------------------------------------------------

@kopf.on.delete(*RESOURCE)
async def agenttxpolicy_delete(**kwargs: Any) -> None:
    await _finalize(**kwargs)


async def _finalize(
    *,
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    namespace: str,
    name: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    retry: int,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    rt: Runtime = memo.runtime
    actions = lifecycle.delete_actions(dict(spec))
    last_attempt = retry + 1 >= rt.config.delete_etcd_attempts
    delay = lifecycle.retry_delay(retry, rt.config.etcd_retry_base_s, rt.config.etcd_retry_max_s)
    generation = int(meta.get("generation") or 0)
    claim = status.get("sandboxClaim") or None
    key = rt.keys.policy(namespace, name).decode()

    if actions.unpublish:
        try:
            await publishing.unpublish(rt.store, rt.keys, namespace, name)
        except StoreError as exc:
            message = f"cannot unpublish {key}: {exc}"
            if not last_attempt:
                _write_status(patch, status, generation=generation,
                              reason=conditions.REASON_ETCD_UNAVAILABLE,
                              message=message + " (will retry)", claim=claim)
                _warn_once(body, status, conditions.REASON_ETCD_UNAVAILABLE, message)
                raise kopf.TemporaryError(message, delay=delay) from exc
            kopf.warn(body, reason=conditions.REASON_ETCD_UNAVAILABLE, message=(
                f"{message}; gave up after {retry + 1} attempts and released the finalizer; "
                "the orphan sweep removes the key once etcd is reachable"))
            logger.warning("released %s/%s with %s still published", namespace, name, key)

    if actions.unmount:
        try:
            await _remove_sandbox(rt, body, namespace, name, delete_claim=actions.delete_claim)
        except (KubeError, mounts.ContainerNotFound) as exc:
            if not last_attempt:
                raise kopf.TemporaryError(f"cannot remove the sandbox: {exc}",
                                          delay=delay) from exc
            kopf.warn(body, reason="SandboxCleanupFailed", message=(
                f"{exc}; gave up after {retry + 1} attempts and released the finalizer; "
                "remove the mount and claim by hand"))
