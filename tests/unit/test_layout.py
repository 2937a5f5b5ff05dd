"""Key parsing lives in `agenttx.contracts.layout` only: each parse function inverts its
builder, refuses a key from elsewhere, and nothing outside the store reaches the raw etcd
client. Pure: no etcd."""

from __future__ import annotations

import pathlib
import re

import pytest

from agenttx.contracts.layout import Keys, tx_id_from_header_key

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("prefix", ["/agenttx", "agenttx", "/a/b/"])
def test_every_parse_function_inverts_its_builder(prefix: str) -> None:
    keys = Keys(prefix)
    principal = "system:serviceaccount:ns:a b"
    assert keys.slot_of(principal, keys.open_slot(principal, 41)) == 41
    assert keys.slot_of("", keys.open_slot("", 0)) == 0
    assert keys.step_of_context("tx-1", keys.context("tx-1", 12)) == 12
    assert keys.step_of_effect("tx-1", keys.effect("tx-1", 7, 3)) == 7
    assert keys.policy_of(keys.policy("team-a", "strict")) == ("team-a", "strict")
    assert keys.toolset_of(keys.toolset("team-b", "crm")) == ("team-b", "crm")
    assert tx_id_from_header_key(keys, keys.tx_header("tx-9")) == "tx-9"


def test_a_key_from_elsewhere_is_refused_not_misread() -> None:
    keys, other = Keys("/agenttx"), Keys("/other")
    with pytest.raises(ValueError, match="is not under"):
        keys.step_of_context("tx-1", keys.context("tx-2", 1))
    with pytest.raises(ValueError, match="is not under"):
        keys.slot_of("alice", keys.open_slot("bob", 1))
    assert keys.policy_of(other.policy("ns", "p")) is None
    assert keys.policy_of(keys.toolset("ns", "p")) is None
    # A key written under the policies prefix by hand still names its namespace, so the
    # operator's orphan sweep scopes it to the namespaces it watches.
    assert keys.policy_of(keys.policies_prefix() + b"ns") == ("ns", "")


def _sources() -> list[pathlib.Path]:
    roots = ["service/agenttx", "operator/agenttx_operator", "bench/agenttx_bench",
             "client/agenttx"]
    return [p for root in roots for p in (REPO / root).rglob("*.py")]


def test_only_the_store_gateway_touches_the_raw_etcd_client() -> None:
    """`Store._etcd` is the aetcd client; import-linter keeps `aetcd` imports in the store,
    this keeps the attribute there (watches, leases and reads go through Store's methods)."""
    gateway = REPO / "service/agenttx/store/client.py"
    offenders = [str(p.relative_to(REPO)) for p in _sources()
                 if p != gateway and re.search(r"\._etcd\b", p.read_text())]
    assert offenders == []
