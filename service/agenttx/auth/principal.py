"""Who is calling: the `Principal` every authentication mode produces (SPEC §9).

Why one small value type: ownership of transactions, policy scope, quotas and the
per-principal idempotency keys (SPEC §6) all key on the same identity, whichever mode
proved it. `name` is that identity; `namespace` decides which policies apply.

What this module must never do: carry a credential. A Principal is safe to log, to
store in etcd and to put in an error message; the token or certificate that proved it
is not, and is never copied here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Unauthenticated

ADMIN_ROLE = "admin"
# Decides approvals in its namespace and, from the service namespace, in every one
# (docs/approvals.md, "Who decides").
APPROVER_ROLE = "approver"

# The only three texts an UNAUTHENTICATED answer may carry (SPEC §9: no detail beyond
# "missing" / "invalid" / "expired").
MISSING = "missing credentials"
INVALID = "invalid credentials"
EXPIRED = "expired credentials"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    name: the stable identity (token file `principal`, `system:serviceaccount:<ns>:<sa>`,
    or a certificate's URI SAN / CN); "" only for ANONYMOUS.
    namespace: the Kubernetes-style namespace whose policies apply, or None (then only
    the service namespace's policies apply).
    roles: e.g. {"admin"}, {"approver"}; only token mode can grant roles today.
    """

    name: str
    namespace: str | None = None
    roles: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_admin(self) -> bool:
        return ADMIN_ROLE in self.roles

    @property
    def is_approver(self) -> bool:
        return APPROVER_ROLE in self.roles

    @property
    def is_anonymous(self) -> bool:
        return self.name == ""


# `--auth none`: every caller is this one principal (one deployment-wide identity, so
# idempotency keys and quotas are per deployment, as SPEC §6 says for that case).
ANONYMOUS = Principal(name="", namespace=None, roles=frozenset())


class AuthConfigError(ValueError):
    """Authentication or TLS cannot start as configured (a start-up error, not a request
    error). A ValueError, so `agenttx serve` reports it as invalid settings and exits 2."""


def missing() -> Unauthenticated:
    return Unauthenticated(MISSING)


def invalid() -> Unauthenticated:
    return Unauthenticated(INVALID)


def expired() -> Unauthenticated:
    return Unauthenticated(EXPIRED)
