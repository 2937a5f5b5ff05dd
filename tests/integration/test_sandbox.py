"""fs tools are confined to the sandbox root (docs/tools.md#the-built-ins). Absolute paths,
`..`, NUL bytes and symlinks leading outside are refused, and nothing is ever written outside
the root (the outside directory is compared byte for byte before and after)."""

from __future__ import annotations

import os
import pathlib

import pytest

from support.rpc import expect_failure
from support.service import Agent


@pytest.fixture
def outside(scratch: pathlib.Path, uniq: str) -> pathlib.Path:
    """A directory next to (not inside) the sandbox, holding one file."""
    d = scratch / f"outside-{uniq}"
    d.mkdir()
    (d / "target.txt").write_text("outside original")
    return d


def _tree(root: pathlib.Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root) + "/"] = None
        for name in filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = pathlib.Path(path).read_bytes()
    return out


def _escape_paths(sandbox: pathlib.Path, outside: pathlib.Path, uniq: str) -> list[str]:
    rel_out = os.path.relpath(outside, sandbox)  # "../outside-<uniq>"
    return [
        str(outside / "target.txt"),
        str(outside / "new.txt"),
        "/etc/agenttx-should-not-exist",
        f"{rel_out}/target.txt",
        f"{rel_out}/new.txt",
        f"sub-{uniq}/../../{rel_out[3:]}/new.txt",
        f"sub-{uniq}/../inside.txt",  # stays inside, but `..` is refused outright
        "..",
        "../",
    ]


def test_absolute_paths_and_dot_dot_are_refused_and_nothing_is_written_outside(
        a, sandbox, outside, uniq):
    before, sandbox_before = _tree(outside), _tree(sandbox)
    agent = Agent(a)
    for path in _escape_paths(sandbox, outside, uniq):
        resp = agent.step("fs.write", {"path": path, "contents": "escaped!"})
        expect_failure(resp, "insufficient_privilege", "outside the sandbox")
        resp = agent.step("fs.read", {"path": path})
        expect_failure(resp, "insufficient_privilege", "outside the sandbox")
        agent = Agent(a)  # a fresh transaction: repeated failures would escalate
    assert _tree(outside) == before
    assert {k for k in _tree(sandbox) if uniq in k} == {k for k in sandbox_before if uniq in k}


def test_a_nul_byte_in_a_path_is_refused(a, sandbox, uniq):
    agent = Agent(a)
    for path in (f"nul-{uniq}\x00.txt", f"\x00nul-{uniq}", f"dir-{uniq}/\x00"):
        expect_failure(agent.step("fs.write", {"path": path, "contents": "x"}),
                       "invalid_parameter_value", '"path"', "NUL")
        expect_failure(agent.step("fs.read", {"path": path}), "invalid_parameter_value", '"path"')
        agent = Agent(a)
    assert [p for p in os.listdir(sandbox) if f"nul-{uniq}" in p or f"dir-{uniq}" in p] == []


def test_a_symlinked_file_pointing_outside_is_refused(a, sandbox, outside, uniq):
    before = _tree(outside)
    link = sandbox / f"link-{uniq}.txt"
    link.symlink_to(outside / "target.txt")
    dangling = sandbox / f"dangling-{uniq}.txt"
    dangling.symlink_to(outside / "created-through-link.txt")
    for name in (link.name, dangling.name):
        agent = Agent(a)
        expect_failure(agent.step("fs.write", {"path": name, "contents": "escaped!"}),
                       "insufficient_privilege", name)
        expect_failure(agent.step("fs.read", {"path": name}), "insufficient_privilege", name)
    assert _tree(outside) == before
    assert link.is_symlink() and os.readlink(link) == str(outside / "target.txt")


def test_a_symlinked_directory_pointing_outside_is_refused(a, sandbox, outside, uniq):
    before = _tree(outside)
    (sandbox / f"dirlink-{uniq}").symlink_to(outside, target_is_directory=True)
    (sandbox / f"nested-{uniq}").mkdir()
    (sandbox / f"nested-{uniq}" / "up").symlink_to(outside.parent, target_is_directory=True)
    for path in (f"dirlink-{uniq}/target.txt", f"dirlink-{uniq}/new.txt",
                 f"dirlink-{uniq}/deeper/new.txt", f"nested-{uniq}/up/{outside.name}/new.txt"):
        agent = Agent(a)
        expect_failure(agent.step("fs.write", {"path": path, "contents": "escaped!"}),
                       "insufficient_privilege", path)
        expect_failure(agent.step("fs.read", {"path": path}), "insufficient_privilege", path)
    assert _tree(outside) == before


def test_a_symlink_that_stays_inside_the_sandbox_is_followed(a, sandbox, uniq):
    (sandbox / f"real-{uniq}").mkdir()
    (sandbox / f"alias-{uniq}").symlink_to(sandbox / f"real-{uniq}", target_is_directory=True)
    agent = Agent(a)
    agent.ok("fs.write", {"path": f"alias-{uniq}/f.txt", "contents": "inside"})
    assert (sandbox / f"real-{uniq}" / "f.txt").read_text() == "inside"
    assert agent.ok("fs.read", {"path": f"real-{uniq}/f.txt"})["contents"] == "inside"


def test_writing_to_a_directory_fails_cleanly(a, sandbox, uniq):
    directory = sandbox / f"adir-{uniq}"
    directory.mkdir()
    (directory / "keep.txt").write_text("kept")
    agent = Agent(a)
    for path in (f"adir-{uniq}", f"adir-{uniq}/", f"adir-{uniq}/."):
        expect_failure(agent.step("fs.write", {"path": path, "contents": "x"}),
                       "invalid_parameter_value", "directory")
        agent = Agent(a)
    expect_failure(agent.step("fs.read", {"path": f"adir-{uniq}"}), "invalid_parameter_value",
                   "directory")
    assert directory.is_dir() and (directory / "keep.txt").read_text() == "kept"
    assert sorted(os.listdir(directory)) == ["keep.txt"]


def test_writing_under_a_file_as_if_it_were_a_directory_fails_cleanly(a, sandbox, uniq):
    (sandbox / f"plain-{uniq}").write_text("a file")
    agent = Agent(a)
    expect_failure(agent.step("fs.write", {"path": f"plain-{uniq}/child.txt", "contents": "x"}),
                   "invalid_parameter_value", f"plain-{uniq}/child.txt")
    assert (sandbox / f"plain-{uniq}").read_text() == "a file"


def test_the_sandbox_root_itself_and_empty_paths_are_refused(a):
    for path, category in (("", "invalid_parameter_value"), (".", "invalid_parameter_value"),
                           ("./", "invalid_parameter_value")):
        expect_failure(Agent(a).step("fs.write", {"path": path, "contents": "x"}), category)


def test_the_service_keeps_working_after_escape_attempts(a, b, sandbox, uniq):
    agent = Agent(b)
    expect_failure(agent.step("fs.write", {"path": "/tmp/x", "contents": "x"}),
                   "insufficient_privilege")
    agent.ok("fs.write", {"path": f"fine-{uniq}.txt", "contents": "fine"})
    assert agent.commit().steps_committed == 1
    assert (sandbox / f"fine-{uniq}.txt").read_text() == "fine"


def test_a_symlink_loop_fails_cleanly_without_revealing_the_root(a, sandbox, uniq):
    (sandbox / f"loop1-{uniq}").symlink_to(sandbox / f"loop2-{uniq}")
    (sandbox / f"loop2-{uniq}").symlink_to(sandbox / f"loop1-{uniq}")
    for tool, args in (("fs.write", {"path": f"loop1-{uniq}", "contents": "x"}),
                       ("fs.read", {"path": f"loop1-{uniq}"}),
                       ("fs.write", {"path": f"loop1-{uniq}/child", "contents": "x"})):
        hint = expect_failure(Agent(a).step(tool, args), "invalid_parameter_value",
                              f"loop1-{uniq}")
        assert str(sandbox) not in hint
    assert (sandbox / f"loop1-{uniq}").is_symlink() and (sandbox / f"loop2-{uniq}").is_symlink()


@pytest.mark.parametrize("path", [
    "d/" * 300 + "f",            # deeper than any sane tree: no RecursionError
    "d/" * 2100 + "f",           # longer than PATH_MAX
    "long/" + "n" * 256,         # one name over NAME_MAX
    "€" * 86 + "/f",             # 258 bytes in one name
])
def test_paths_too_deep_or_too_long_fail_cleanly_and_write_nothing(a, sandbox, uniq, path):
    before = sorted(os.listdir(sandbox))
    for tool, args in (("fs.write", {"path": f"{uniq}/{path}", "contents": "x"}),
                       ("fs.read", {"path": f"{uniq}/{path}"})):
        hint = expect_failure(Agent(a).step(tool, args), "invalid_parameter_value", '"path"')
        assert str(sandbox) not in hint
    assert sorted(os.listdir(sandbox)) == before


def test_a_deep_path_within_the_limits_can_be_written(a, sandbox, uniq):
    path = f"{uniq}/" + "d/" * 200 + "f.txt"
    agent = Agent(a)
    assert agent.ok("fs.write", {"path": path, "contents": "deep"})["bytes"] == 4
    assert (sandbox / path).read_text() == "deep"
    assert agent.rollback().rolled_back
    assert not (sandbox / path).exists()
