"""`--auth token`: the token-hash file — parsing, lookup, rotation without restart
(docs/security.md#token).

Real files in a temp dir; rotation is a write-then-rename over the file (as Kubernetes
does with Secret volumes) and a symlink swap; time is an injected clock, never a sleep.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib

import pytest

from agenttx.auth import AuthConfigError, Principal, TokenFile, hash_token
from support.certs import write_atomically


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def doc(*entries: dict) -> str:
    return json.dumps({"tokens": list(entries)})


def entry(token: str, principal: str, namespace: str | None = None, roles=()) -> dict:
    e: dict = {"sha256": hash_token(token), "principal": principal, "roles": list(roles)}
    if namespace is not None:
        e["namespace"] = namespace
    return e


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_json_file_maps_each_token_to_its_principal(tmp_path: pathlib.Path, clock: Clock) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(doc(entry("tok-billing", "billing-agent", "team-a", ["agent"]),
                        entry("tok-ops", "ops", None, ["admin"])))
    tokens = TokenFile(path, clock=clock)
    assert len(tokens) == 2
    assert tokens.lookup("tok-billing") == Principal("billing-agent", "team-a", frozenset({"agent"}))
    ops = tokens.lookup("tok-ops")
    assert ops == Principal("ops", None, frozenset({"admin"})) and ops.is_admin
    assert tokens.lookup("tok-unknown") is None
    assert tokens.lookup("") is None


def test_yaml_file_is_accepted(tmp_path: pathlib.Path, clock: Clock) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"""
tokens:
  - sha256: {hash_token("yaml-token").upper()}
    principal: billing-agent
    namespace: team-a
    roles: [agent]
""")
    tokens = TokenFile(path, clock=clock)
    assert tokens.lookup("yaml-token") == Principal("billing-agent", "team-a", frozenset({"agent"}))


def test_only_the_hash_is_on_disk(tmp_path: pathlib.Path, clock: Clock) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(doc(entry("s3cret-value", "p")))
    assert "s3cret-value" not in path.read_text()
    assert TokenFile(path, clock=clock).lookup("s3cret-value") == Principal("p")


def test_missing_file_at_start_up_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(AuthConfigError) as err:
        TokenFile(tmp_path / "nope.yaml")
    assert str(err.value) == (f"--auth-tokens-file {tmp_path / 'nope.yaml'}: cannot read it "
                              "(No such file or directory)")


@pytest.mark.parametrize("content, fragment", [
    ("tokens: [", "not valid YAML/JSON at line 1"),
    ('{"tokens": [{"sha256": "abc", "principal": "p"}]}', "tokens.0.sha256: String should match"),
    ('{"tokens": [{"principal": "p"}]}', "tokens.0.sha256: Field required"),
    ('{"tokenz": []}', "tokens: Field required"),
    ('{"tokens": [{"sha256": "' + "a" * 64 + '", "principal": "p", "namespce": "x"}]}',
     "tokens.0.namespce: Extra inputs are not permitted"),
    ('{"tokens": [{"sha256": "' + "a" * 64 + '", "principal": ""}]}', "tokens.0.principal"),
    ('{"tokens": [{"sha256": "' + "a" * 64 + '", "principal": "p"}, {"sha256": "' + "A" * 64
     + '", "principal": "q"}]}', "tokens.1.sha256: the same token hash is listed twice"),
    ("[]", "(top level)"),
])
def test_invalid_file_at_start_up_says_where_without_quoting_it(
        tmp_path: pathlib.Path, content: str, fragment: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(content)
    with pytest.raises(AuthConfigError) as err:
        TokenFile(path)
    assert fragment in str(err.value)
    assert "a" * 64 not in str(err.value) and "A" * 64 not in str(err.value)


def test_rotation_by_rename_takes_effect_without_restart(tmp_path: pathlib.Path,
                                                         clock: Clock) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(doc(entry("old-token", "billing-agent", "team-a")))
    tokens = TokenFile(path, check_interval_s=1.0, clock=clock)
    assert tokens.lookup("old-token") is not None

    write_atomically(path, doc(entry("new-token", "billing-agent", "team-a")))
    # Rate-limited: within the interval the file is not even stat'ed.
    clock.advance(0.5)
    assert tokens.refresh() is False
    assert tokens.lookup("old-token") is not None and tokens.lookup("new-token") is None

    clock.advance(0.5)
    assert tokens.refresh_due()
    assert tokens.refresh() is True
    assert tokens.lookup("new-token") == Principal("billing-agent", "team-a")
    assert tokens.lookup("old-token") is None
    clock.advance(5)
    assert tokens.refresh() is False  # unchanged file: nothing re-read


def test_secret_volume_symlink_swap_is_seen(tmp_path: pathlib.Path, clock: Clock) -> None:
    """Kubernetes: <dir>/tokens.yaml -> ..data/tokens.yaml, ..data -> ..<timestamp>/;
    an update writes a new timestamped dir and atomically renames a new ..data link."""
    first, second = tmp_path / "..2024_01", tmp_path / "..2024_02"
    first.mkdir()
    second.mkdir()
    (first / "tokens.yaml").write_text(doc(entry("v1-token", "agent")))
    (second / "tokens.yaml").write_text(doc(entry("v2-token", "agent")))
    os.symlink(first.name, tmp_path / "..data")
    os.symlink("..data/tokens.yaml", tmp_path / "tokens.yaml")
    tokens = TokenFile(tmp_path / "tokens.yaml", clock=clock)
    assert tokens.lookup("v1-token") == Principal("agent")

    os.symlink(second.name, tmp_path / "..data_tmp")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    clock.advance(1)
    assert tokens.refresh() is True
    assert tokens.lookup("v2-token") == Principal("agent")
    assert tokens.lookup("v1-token") is None


def test_broken_rotation_keeps_the_last_good_set_and_logs_no_secret(
        tmp_path: pathlib.Path, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(doc(entry("good-token", "agent")))
    tokens = TokenFile(path, clock=clock)
    bad_hash = hash_token("would-be-token")
    write_atomically(path, '{"tokens": [{"sha256": "' + bad_hash + '", "principal": ""}]}')
    clock.advance(1)
    with caplog.at_level(logging.ERROR, logger="agenttx.auth.tokens"):
        assert tokens.refresh() is False
    assert tokens.lookup("good-token") == Principal("agent")
    assert tokens.lookup("would-be-token") is None
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "token file rejected; keeping the last good tokens"
    assert "tokens.0.principal" in record.error  # type: ignore[attr-defined]
    assert record.tokens == 1  # type: ignore[attr-defined]
    logged = json.dumps({k: str(v) for k, v in vars(record).items()})
    assert bad_hash not in logged and hash_token("good-token") not in logged

    # The same broken file is not re-parsed (nor re-logged) at every check ...
    caplog.clear()
    clock.advance(1)
    assert tokens.refresh() is False
    assert not caplog.records
    # ... and a fixed file is picked up.
    write_atomically(path, doc(entry("would-be-token", "agent-2")))
    clock.advance(1)
    assert tokens.refresh() is True
    assert tokens.lookup("would-be-token") == Principal("agent-2")
    assert tokens.lookup("good-token") is None


def test_file_vanishing_keeps_the_current_set(tmp_path: pathlib.Path, clock: Clock) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(doc(entry("t", "agent")))
    tokens = TokenFile(path, clock=clock)
    path.unlink()
    clock.advance(1)
    assert tokens.refresh() is False
    assert tokens.lookup("t") == Principal("agent")
