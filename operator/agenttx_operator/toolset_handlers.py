"""kopf handlers for AgentTxToolset: thin wiring over the pure modules (`toolset_spec`,
`projection`, `mounts`, `toolset_status`, `lifecycle`), `kube`, `publishing` and
`upstream` (the only modules that talk to the API server, etcd and the upstream).

One reconcile, shared by the change handlers and the periodic re-check:

  validate the spec (the contract's parser; InvalidSpec names the field)
  -> the prefix is not another toolset's of the namespace (InvalidSpec names it)
  -> read the header Secrets' keys (SecretNotFound / SecretInvalid)
  -> the upstream answers tools/list with those headers and has every listed tool and
     compensation tool (UpstreamUnreachable / UnknownTool)
  -> copy the keys into the operator's Secret in the service namespace and mount it
     read-only into the service Deployment; wait until the pods that carry the files
     have completely rolled out (ProjectionPending)
  -> publish to <prefix>/toolsets/<ns>/<name> (EtcdUnavailable) -> Published
  -> drop the files the published generation no longer needs.

Anything but Published leaves what is published as it is (the last good generation keeps
serving; the status says which, `publishedGeneration`). InvalidSpec raises
`kopf.PermanentError` (a person must act); everything else `kopf.TemporaryError` with
a backoff delay. The status is written first (kopf's patch is applied even when the
handler raises); a Warning event is posted when the Ready reason changes, a Normal
`Published` event each time etcd is written.

Delete (finalizer): unpublish -> unmount -> delete the copy. Like AgentTxPolicy's, the
finalizer is never stuck: after `delete_etcd_attempts` failed attempts it warns and lets
go; the orphan sweep (`handlers.sweep_toolsets_once`) unpublishes a leftover key.

The periodic re-check (`agenttxtoolset_recheck`, a kopf daemon per toolset, every
`toolset_resync_s` while no change is being handled) runs the same reconcile: a rotated
Secret value is copied (the kubelet then updates the files in the running pods), an
upstream that lost a tool or went down shows in Ready, and a toolset refused because
its prefix was taken is accepted once the holder is gone. Reconciles of one toolset
never overlap (a lock per toolset in its kopf memo).

What the handlers must never do: put a header's value in a log line, an exception
message, the status, an event or etcd; block the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import logging
from dataclasses import dataclass
from typing import Any

import kopf

from agenttx.contracts.toolsets import Toolset, ToolsetError, header_value
from agenttx.errors import StoreError

from . import conditions, lifecycle, mounts, projection, publishing, toolset_spec, upstream
from . import toolset_status as ts
from .handlers import Runtime, _now
from .kube import KubeError

RESOURCE = (toolset_spec.GROUP, toolset_spec.VERSION, toolset_spec.PLURAL)
# How many AgentTx tool names a Published message lists before "…".
LISTED_TOOLS = 12

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What one reconcile found. `reason` None: nothing to report in Ready (a Kubernetes
    API hiccup before anything was decided), just retry after `delay`. `delay` None for
    a reason other than Published: permanent, a person must act."""

    reason: str | None
    message: str
    delay: float | None = None
    published: tuple[int, int] | None = None
    header_secret: str | None = None


def _lock(memo: kopf.Memo) -> asyncio.Lock:
    """The toolset's own lock (kopf gives each object its own copy of the memo)."""
    lock = memo.get("toolset_lock")
    if lock is None:
        lock = memo["toolset_lock"] = asyncio.Lock()
    return lock


def _upstream_delay(rt: Runtime, retry: int) -> float:
    return lifecycle.retry_delay(retry, rt.config.upstream_retry_base_s,
                                 rt.config.upstream_retry_max_s)


def _names(toolset: Toolset) -> str:
    names = [toolset.agenttx_name(t.name) for t in toolset.tools]
    shown = ", ".join(names[:LISTED_TOOLS])
    return shown + (f", … ({len(names)} in all)" if len(names) > LISTED_TOOLS else "")


# ---- the reconcile ---------------------------------------------------------------------

async def reconcile(rt: Runtime, body: kopf.Body, *, retry: int) -> Outcome:
    """Validate, check the upstream, project the headers, publish (module docstring)."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    generation = int(meta.get("generation") or 0)
    spec = copy.deepcopy(dict(body.get("spec") or {}))
    note = ts.published_note(body.get("status"))
    key = rt.keys.toolset(namespace, name).decode()

    try:
        toolset = toolset_spec.parse(namespace, name, generation, spec,
                                     mount_root=rt.config.toolset_mount_root)
    except ToolsetError as exc:
        return Outcome(ts.REASON_INVALID_SPEC, f"{exc}{note}")

    try:
        others = await rt.kube.list_toolsets_in(namespace)
    except KubeError as exc:
        return Outcome(None, f"cannot list the toolsets of {namespace}: {exc}",
                       delay=_upstream_delay(rt, retry))
    holder = toolset_spec.prefix_owner(dict(body), others)
    if holder is not None:
        return Outcome(ts.REASON_INVALID_SPEC, (
            f"spec.prefix {toolset.prefix!r} is already used by AgentTxToolset "
            f"{namespace}/{holder} (the older toolset keeps it); choose another prefix{note}"))

    headers, copies, problem = await _read_headers(rt, namespace, spec)
    if problem is not None:
        reason, message = problem
        return Outcome(reason, f"{message}{note}", delay=_upstream_delay(rt, retry))

    try:
        offered = await upstream.list_tools(toolset.upstream, headers)
    except upstream.UpstreamUnreachable as exc:
        return Outcome(ts.REASON_UPSTREAM_UNREACHABLE, f"tools/list failed: {exc}; will "
                       f"retry{note}", delay=_upstream_delay(rt, retry))
    missing = toolset_spec.missing_tools(toolset, offered)
    if missing:
        return Outcome(ts.REASON_UNKNOWN_TOOL, (
            f"{toolset.upstream.url} has no tool {', '.join(missing)} (it lists "
            f"{', '.join(sorted(offered)[:50]) or 'none'}); will check again{note}"),
            delay=_upstream_delay(rt, retry))

    svc_ns = rt.target.service_namespace
    header_secret = f"{svc_ns}/{projection.secret_name(namespace, name)}" if copies else None
    if copies:
        try:
            ready, why = await _project(rt, body, namespace, name, copies)
        except (KubeError, mounts.ContainerNotFound) as exc:
            ready, why = False, f"cannot project the header files: {exc}"
        if not ready:
            return Outcome(ts.REASON_PROJECTION_PENDING, f"{why}{note}",
                           delay=rt.config.volume_poll_s, header_secret=header_secret)

    try:
        written = await publishing.publish_toolset(rt.store, rt.keys, toolset)
    except StoreError as exc:
        return Outcome(ts.REASON_ETCD_UNAVAILABLE, f"cannot publish to etcd (will retry): "
                       f"{exc}{note}", header_secret=header_secret,
                       delay=lifecycle.retry_delay(retry, rt.config.etcd_retry_base_s,
                                                   rt.config.etcd_retry_max_s))
    except publishing.StalePublish as exc:
        return Outcome(None, str(exc), delay=rt.config.volume_poll_s)

    try:
        await _prune(rt, body, namespace, name, copies)
    except (KubeError, mounts.ContainerNotFound) as exc:
        # Harmless leftovers (files nobody reads); the next reconcile tries again.
        log.warning("toolset %s/%s published; removing its unused header files failed: %s",
                    namespace, name, exc)

    message = f"generation {generation} published at {key}: {_names(toolset)}"
    if written:
        kopf.info(body, reason=ts.REASON_PUBLISHED, message=message)
        log.info("published toolset %s/%s generation %d at %s (%d tools)", namespace, name,
                 generation, key, len(toolset.tools),
                 extra={"toolset": f"{namespace}/{name}", "toolset_generation": generation,
                        "toolset_key": key})
    return Outcome(ts.REASON_PUBLISHED, message, published=(generation, len(toolset.tools)),
                   header_secret=header_secret or "")


async def _read_headers(
    rt: Runtime, namespace: str, spec: dict[str, Any]
) -> tuple[dict[str, str], dict[toolset_spec.SecretRef, str], tuple[str, str] | None]:
    """(header name -> value, Secret key -> base64 value as served, problem). The values
    stay in memory: the header values for tools/list, the base64 for the copy."""
    secrets: dict[str, dict[str, Any] | None] = {}
    copies: dict[toolset_spec.SecretRef, str] = {}
    values: dict[toolset_spec.SecretRef, str] = {}
    for ref in toolset_spec.secret_refs(spec):
        where = ref.describe(namespace)
        if ref.secret not in secrets:
            try:
                secrets[ref.secret] = await rt.kube.get_secret(namespace, ref.secret)
            except KubeError as exc:
                return {}, {}, (ts.REASON_SECRET_NOT_FOUND,
                                f"cannot read Secret {namespace}/{ref.secret}: HTTP "
                                f"{exc.status}: {exc.message}")
        secret = secrets[ref.secret]
        if secret is None:
            return {}, {}, (ts.REASON_SECRET_NOT_FOUND,
                            f"Secret {namespace}/{ref.secret} does not exist")
        encoded = (secret.get("data") or {}).get(ref.key)
        if not isinstance(encoded, str):
            return {}, {}, (ts.REASON_SECRET_NOT_FOUND,
                            f"Secret {namespace}/{ref.secret} has no key {ref.key!r}")
        try:
            values[ref] = header_value(base64.b64decode(encoded, validate=True), where)
        except (binascii.Error, ValueError) as exc:
            detail = exc if isinstance(exc, ToolsetError) else f"{where} is not base64"
            return {}, {}, (ts.REASON_SECRET_INVALID, str(detail))
        copies[ref] = encoded
    headers = {header: values[ref] for header, ref in toolset_spec.header_refs(spec).items()}
    return headers, copies, None


async def _project(rt: Runtime, body: kopf.Body, namespace: str, name: str,
                   copies: dict[toolset_spec.SecretRef, str]) -> tuple[bool, str]:
    """Copy the header values into the service namespace, mount them read-only into the
    service container (keeping the files the published generation reads), and say
    whether every pod has them."""
    target = rt.target
    svc_ns = target.service_namespace
    deployment = await rt.kube.get_deployment(svc_ns, target.deployment)
    if deployment is None:
        return False, f"the service Deployment {svc_ns}/{target.deployment} does not exist"
    current = projection.live_items(deployment, namespace, name)
    wanted = projection.items(copies)
    file_items = projection.merge_items(current, wanted)

    copy_name = projection.secret_name(namespace, name)
    live = await rt.kube.get_secret(svc_ns, copy_name)
    wanted_keys = {i["key"] for i in wanted}
    live_data = (live or {}).get("data") or {}
    keep = {i["key"]: live_data[i["key"]] for i in current
            if i["key"] not in wanted_keys and i["key"] in live_data}
    await _write_copy(rt, body, namespace, name, live,
                      projection.build_secret(namespace, name, copies, target, keep=keep))

    ops = mounts.volume_patch(
        deployment, target, projection.volume_name(namespace, name),
        projection.volume(namespace, name, file_items),
        projection.mount(namespace, name, rt.config.toolset_mount_root))
    if ops:
        deployment = await rt.kube.json_patch_deployment(svc_ns, target.deployment, ops)
        kopf.info(body, reason="HeaderFilesMounted", message=(
            f"{len(file_items)} header file(s) mounted read-only at "
            f"{toolset_spec.mount_path(namespace, name, rt.config.toolset_mount_root)} in "
            f"{svc_ns}/{target.deployment}"))
    return mounts.rollout_complete(deployment, "the toolset's header files")


async def _write_copy(rt: Runtime, body: kopf.Body, namespace: str, name: str,
                      live: dict[str, Any] | None, desired: dict[str, Any]) -> None:
    """Create or update the operator's copy of the header values (never logged)."""
    svc_ns = rt.target.service_namespace
    copy_name = desired["metadata"]["name"]
    if live is None:
        try:
            await rt.kube.create_secret(desired)
            kopf.info(body, reason="HeaderSecretCreated", message=f"Secret {svc_ns}/{copy_name}")
            return
        except KubeError as exc:
            if exc.status != 409:
                raise
            live = await rt.kube.get_secret(svc_ns, copy_name) or {}
    patch = projection.secret_patch(live, desired)
    if patch:
        await rt.kube.patch_secret(svc_ns, copy_name, patch)


async def _prune(rt: Runtime, body: kopf.Body, namespace: str, name: str,
                 copies: dict[toolset_spec.SecretRef, str]) -> None:
    """After publishing: keep only the files the published generation reads (none: the
    volume and the copy go). The template changes first, then the copy, so no pod is
    ever asked to mount a key that is gone (and the volume is optional anyway)."""
    target = rt.target
    svc_ns = target.service_namespace
    vname = projection.volume_name(namespace, name)
    deployment = await rt.kube.get_deployment(svc_ns, target.deployment)
    if deployment is not None:
        if copies:
            ops = mounts.volume_patch(
                deployment, target, vname,
                projection.volume(namespace, name, projection.items(copies)),
                projection.mount(namespace, name, rt.config.toolset_mount_root))
        else:
            ops = mounts.volume_patch(deployment, target, vname, None, None)
        if ops:
            await rt.kube.json_patch_deployment(svc_ns, target.deployment, ops)
            if not copies:
                kopf.info(body, reason="HeaderFilesUnmounted",
                          message=f"unmounted from {svc_ns}/{target.deployment}")
    copy_name = projection.secret_name(namespace, name)
    if copies:
        live = await rt.kube.get_secret(svc_ns, copy_name)
        if live is not None:
            await _write_copy(rt, body, namespace, name, live,
                              projection.build_secret(namespace, name, copies, target))
    elif await rt.kube.delete_secret(svc_ns, copy_name):
        kopf.info(body, reason="HeaderSecretDeleted", message=f"Secret {svc_ns}/{copy_name}")


# ---- status ----------------------------------------------------------------------------

def _status_changes(status: Any, generation: int, outcome: Outcome) -> dict[str, Any] | None:
    """The status fields this outcome changes (None: nothing to write)."""
    assert outcome.reason is not None
    old = dict(status or {})
    new = ts.build_status(old, generation=generation, reason=outcome.reason,
                          message=outcome.message, now=_now(), published=outcome.published,
                          header_secret=outcome.header_secret)
    return conditions.status_patch(old, new)


def _warn_on_change(body: kopf.Body, status: Any, outcome: Outcome) -> None:
    """A Warning event when the Ready reason changes to a failure (not on every retry)."""
    if outcome.reason is None or outcome.reason == ts.REASON_PUBLISHED:
        return
    old = conditions.find_condition(status, conditions.CONDITION_READY) or {}
    if old.get("reason") != outcome.reason:
        kopf.warn(body, reason=outcome.reason, message=outcome.message)


def _raise_for(outcome: Outcome) -> None:
    if outcome.reason == ts.REASON_PUBLISHED:
        return
    if outcome.delay is None:
        raise kopf.PermanentError(f"{outcome.reason}: {outcome.message}")
    raise kopf.TemporaryError(f"{outcome.reason or 'retry'}: {outcome.message}",
                              delay=outcome.delay)


# ---- create / update / resume ----------------------------------------------------------

@kopf.on.create(*RESOURCE)
async def agenttxtoolset_create(**kwargs: Any) -> None:
    await _reconcile_handler(**kwargs)


@kopf.on.update(*RESOURCE, field="spec")
async def agenttxtoolset_update(**kwargs: Any) -> None:
    await _reconcile_handler(**kwargs)


@kopf.on.resume(*RESOURCE)
async def agenttxtoolset_resume(**kwargs: Any) -> None:
    await _reconcile_handler(**kwargs)


async def _reconcile_handler(*, body: kopf.Body, meta: kopf.Meta, status: kopf.Status,
                             patch: kopf.Patch, memo: kopf.Memo, retry: int,
                             **_: Any) -> None:
    rt: Runtime = memo.runtime
    async with _lock(memo):
        outcome = await reconcile(rt, body, retry=retry)
    if outcome.reason is not None:
        changes = _status_changes(status, int(meta.get("generation") or 0), outcome)
        for field, value in (changes or {}).items():
            patch.status[field] = value
        _warn_on_change(body, status, outcome)
    _raise_for(outcome)


# ---- the periodic re-check -------------------------------------------------------------

@kopf.daemon(*RESOURCE, cancellation_timeout=10.0)
async def agenttxtoolset_recheck(stopped: Any, body: kopf.Body, memo: kopf.Memo,
                                 **_: Any) -> None:
    """Every `toolset_resync_s`, the reconcile again (module docstring). It skips a
    toolset whose latest generation a change handler has not finished with yet (the
    change handler owns it then), and writes the status itself (a daemon's patch would
    only be applied when it ends)."""
    rt: Runtime = memo.runtime
    while not stopped:
        # A plain sleep, ended by kopf's cancellation when the toolset or the operator
        # goes (kopf's own `await stopped.wait(n)` leaves a helper task behind that can
        # fail the operator's shutdown). Everything below is safe to cancel: the next
        # reconcile re-reads what it needs, etcd included.
        await asyncio.sleep(rt.config.toolset_resync_s)
        try:
            await recheck_once(rt, body, memo)
        except Exception as exc:  # logged, tried again at the next interval
            log.warning("re-check of toolset %s/%s failed: %s", body.get("metadata", {}).get(
                "namespace"), body.get("metadata", {}).get("name"), exc,
                exc_info=not isinstance(exc, KubeError | StoreError))


async def recheck_once(rt: Runtime, body: kopf.Body, memo: kopf.Memo) -> Outcome | None:
    """One re-check; None when it was skipped (being deleted, or a change pending)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    generation = int(meta.get("generation") or 0)
    if meta.get("deletionTimestamp") or status.get("observedGeneration") != generation:
        return None
    async with _lock(memo):
        outcome = await reconcile(rt, body, retry=0)
    if outcome.reason is not None:
        changes = _status_changes(status, generation, outcome)
        if changes:
            await rt.kube.patch_toolset_status(str(meta.get("namespace")),
                                               str(meta.get("name")), changes)
        _warn_on_change(body, status, outcome)
    return outcome


# ---- delete ----------------------------------------------------------------------------

@kopf.on.delete(*RESOURCE)
async def agenttxtoolset_delete(*, body: kopf.Body, meta: kopf.Meta, status: kopf.Status,
                                patch: kopf.Patch, memo: kopf.Memo, retry: int,
                                logger: kopf.Logger, **_: Any) -> None:
    rt: Runtime = memo.runtime
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    last_attempt = retry + 1 >= rt.config.delete_etcd_attempts
    delay = lifecycle.retry_delay(retry, rt.config.etcd_retry_base_s, rt.config.etcd_retry_max_s)
    key = rt.keys.toolset(namespace, name).decode()
    generation = int(meta.get("generation") or 0)

    async with _lock(memo):
        try:
            if await publishing.unpublish_toolset(rt.store, rt.keys, namespace, name):
                kopf.info(body, reason="Unpublished", message=f"removed {key}")
        except (StoreError, publishing.StalePublish) as exc:
            message = f"cannot unpublish {key}: {exc}"
            if not last_attempt:
                outcome = Outcome(ts.REASON_ETCD_UNAVAILABLE, message + " (will retry)")
                for field, value in (_status_changes(status, generation, outcome) or {}).items():
                    patch.status[field] = value
                _warn_on_change(body, status, outcome)
                raise kopf.TemporaryError(message, delay=delay) from exc
            kopf.warn(body, reason=ts.REASON_ETCD_UNAVAILABLE, message=(
                f"{message}; gave up after {retry + 1} attempts and released the finalizer; "
                "the orphan sweep removes the key once etcd is reachable"))
            logger.warning("released %s/%s with %s still published", namespace, name, key)

        try:
            await _prune(rt, body, namespace, name, {})
        except (KubeError, mounts.ContainerNotFound) as exc:
            copy_ref = f"{rt.target.service_namespace}/{projection.secret_name(namespace, name)}"
            if not last_attempt:
                raise kopf.TemporaryError(f"cannot remove the header files: {exc}",
                                          delay=delay) from exc
            kopf.warn(body, reason="HeaderCleanupFailed", message=(
                f"{exc}; gave up after {retry + 1} attempts and released the finalizer; "
                f"remove the volume {projection.volume_name(namespace, name)} from the service "
                f"Deployment and the Secret {copy_ref} by hand"))


# ---- startup ---------------------------------------------------------------------------

@kopf.on.startup(retries=3, backoff=2.0)
async def agenttxtoolset_startup(memo: kopf.Memo, **_: Any) -> None:
    """Refuse to run without the AgentTxToolset CRD, like without the policy CRD: the
    pod restarts visibly until `crds/` is applied."""
    rt: Runtime = memo.runtime
    if not await rt.kube.resource_served(*RESOURCE):
        raise kopf.PermanentError(
            f"the API server does not serve {toolset_spec.PLURAL}.{toolset_spec.GROUP}/"
            f"{toolset_spec.VERSION}: install the CRD (crds/) first")
