"""The console's sessions and transport over real HTTP (httpx2), against the session's
real replicas without authentication (docs/console.md, "Security model"): the sign-in
form is CSRF-protected like every other; a session ends after its idle timeout; under TLS
the console serves HTTPS and its cookie is Secure."""

from __future__ import annotations

import pathlib
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx2
import pytest

from agenttx.embedded_etcd import free_port
from support.certs import CertificateAuthority
from support.waiting import eventually, slack

IDLE_S = 1.0


def start(target: str, workdir: pathlib.Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    log = workdir / f"console-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agenttx", "console", "--target", target,
                                 "--listen", f"127.0.0.1:{port}", *extra],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=15)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def healthy(http: httpx2.Client, proc: subprocess.Popen[bytes]) -> None:
    def up() -> bool:
        assert proc.poll() is None, f"the console exited with {proc.returncode}"
        return http.get("/healthz").text == "ok"
    eventually(up, slack(10), "the console answers", retry_on=(httpx2.HTTPError,))


@pytest.fixture
def console(replicas, tmp_path) -> Iterator[httpx2.Client]:
    proc, port = start(replicas[0].target, tmp_path, "--session-idle-timeout-s", str(IDLE_S))
    with httpx2.Client(base_url=f"http://127.0.0.1:{port}", follow_redirects=False) as http:
        healthy(http, proc)
        yield http
    stop(proc)


def sign_in(http: httpx2.Client) -> None:
    form = http.get("/signin")
    answer = http.post("/signin", data={"csrf": csrf_of(form.text), "token": ""})
    assert (answer.status_code, answer.headers["location"]) == (303, "/transactions")


def test_the_sign_in_form_needs_its_csrf_token(console):
    console.get("/signin")  # a signed-out session and its token
    for form in ({"token": ""}, {"token": "", "csrf": "guessed"}):
        answer = console.post("/signin", data=form)
        assert answer.status_code == 403
        assert "Nothing was changed." in answer.text
    assert console.get("/transactions").headers["location"] == "/signin"
    sign_in(console)
    assert console.get("/transactions").status_code == 200


def test_a_session_ends_after_its_idle_timeout(console):
    sign_in(console)
    assert console.get("/transactions").status_code == 200
    # Idleness is the condition itself: no request may be made while waiting for it.
    time.sleep(IDLE_S * 1.5)
    answer = console.get("/transactions")
    assert (answer.status_code, answer.headers["location"]) == (303, "/signin")


def test_under_tls_it_serves_https_and_the_cookie_is_secure(replicas, tmp_path):
    ca = CertificateAuthority()
    cert, key = ca.server().write(tmp_path, "console")
    proc, port = start(replicas[0].target, tmp_path, "--tls-cert-file", str(cert),
                       "--tls-key-file", str(key))
    try:
        with httpx2.Client(base_url=f"https://localhost:{port}", follow_redirects=False,
                           verify=ssl.create_default_context(cafile=ca.write(tmp_path))) as http:
            healthy(http, proc)
            form = http.get("/signin")
            cookie = form.headers["set-cookie"]
            assert re.match(r"agenttx_console=[A-Za-z0-9_-]{43}; HttpOnly; Path=/; "
                            r"SameSite=strict; Secure$", cookie), cookie
            answer = http.post("/signin", data={"csrf": csrf_of(form.text), "token": ""})
            assert answer.status_code == 303 and "Secure" in answer.headers["set-cookie"]
    finally:
        stop(proc)
