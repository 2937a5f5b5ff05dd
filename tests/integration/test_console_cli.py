"""`agenttx console` as a command (docs/console.md, "Running it"): what it refuses before
serving anything, each in one line on stderr with exit code 2, and that it serves what
it says on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest

from agenttx.embedded_etcd import free_port
from support.waiting import eventually, slack


def console(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agenttx", "console", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("args", "line"), [
    (["--listen", "0.0.0.0:8080"],
     "agenttx console: --listen 0.0.0.0:8080 is not a loopback address: give "
     "--tls-cert-file and --tls-key-file (or --allow-insecure-remote behind a "
     "TLS-terminating proxy)"),
    (["--listen", "10.1.2.3:8443", "--tls-cert-file", "/nonexistent/c.pem",
      "--tls-key-file", "/nonexistent/k.pem"],
     "agenttx console: --tls-cert-file /nonexistent/c.pem: no such file"),
    (["--tls-cert-file", __file__],
     "agenttx console: --tls-cert-file and --tls-key-file go together"),
    (["--listen", "8080"], "agenttx console: --listen must be HOST:PORT, not '8080'"),
    (["--token", "s3cret"],
     "agenttx console: --token / AGENTTX_TOKEN are not used: the console holds no "
     "credentials of its own; people sign in with their own tokens"),
])
def test_refusals_are_one_line_and_exit_2(args, line):
    run = console(*args)
    assert (run.returncode, run.stdout, run.stderr) == (2, "", line + "\n")


def test_without_the_console_extra_it_says_how_to_install_it():
    """Jinja2 comes only with the [console] extra: a missing one is simulated by an
    import that fails, as it does in an environment without it."""
    code = ("import sys; sys.modules['jinja2'] = None\n"
            "from agenttx.cli import main\n"
            "raise SystemExit(main(['console']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert (run.returncode, run.stderr) == (
        2, "agenttx console: the console needs its extra: pip install "
           "'agenttx-client[console]'\n")


def test_a_token_in_the_environment_is_never_used_and_loopback_serves(tmp_path):
    port = free_port()
    log = open(tmp_path / "console.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "agenttx", "console", "--target",
                             "127.0.0.1:1", "--listen", f"127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "AGENTTX_TOKEN": "not-for-the-console"},
                            start_new_session=True)
    try:
        def healthz() -> bytes:
            assert proc.poll() is None, (tmp_path / "console.log").read_text()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return r.read()
        assert eventually(healthz, slack(10), "the console answers", retry_on=(OSError,)) == b"ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/signin", timeout=10) as r:
            page = r.read().decode()
        # The service at 127.0.0.1:1 does not answer: the sign-in page says so.
        assert "The AgentTx service at 127.0.0.1:1 is not answering (UNAVAILABLE" in page
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
    assert "not-for-the-console" not in (tmp_path / "console.log").read_text()
