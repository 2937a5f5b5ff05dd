"""Client TLS certificate reload: which file states become the served configuration.

Real certificate files; the fetcher grpc calls per handshake is called directly here
with an injected clock (tests/integration/test_auth_grpc.py proves it in a server).
"""

from __future__ import annotations

import pathlib

import pytest

from agenttx.auth import AuthConfigError, ReloadingCertificates, server_credentials_from_settings
from agenttx.config import Settings
from support.certs import CertificateAuthority, write_atomically


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority()


def test_unchanged_files_keep_the_configuration(tmp_path: pathlib.Path, ca: CertificateAuthority) -> None:
    cert, key = ca.server().write(tmp_path, "server")
    clock = Clock()
    certs = ReloadingCertificates(str(cert), str(key), check_interval_s=1.0, clock=clock)
    assert certs.generation == 1
    assert certs.fetch() is None  # within the interval: not even stat'ed
    clock.now += 5
    assert certs.fetch() is None  # unchanged


def test_rotated_pair_is_loaded_and_a_half_rotated_one_is_not(
        tmp_path: pathlib.Path, ca: CertificateAuthority) -> None:
    old, new = ca.server(), ca.server()
    cert, key = old.write(tmp_path, "server")
    clock = Clock()
    certs = ReloadingCertificates(str(cert), str(key), check_interval_s=1.0, clock=clock)

    write_atomically(cert, new.cert_pem)  # the certificate first: key and cert mismatch
    clock.now += 1
    assert certs.fetch() is None
    clock.now += 1
    assert certs.fetch() is None and certs.generation == 1  # rejected state not re-parsed
    write_atomically(key, new.key_pem)  # now consistent
    clock.now += 1
    assert certs.fetch() is not None and certs.generation == 2
    clock.now += 1
    assert certs.fetch() is None


def test_truncated_certificate_mid_write_is_not_served(tmp_path: pathlib.Path,
                                                       ca: CertificateAuthority) -> None:
    cert, key = ca.server().write(tmp_path, "server")
    clock = Clock()
    certs = ReloadingCertificates(str(cert), str(key), check_interval_s=0, clock=clock)
    cert.write_bytes(cert.read_bytes()[:100])
    assert certs.fetch() is None
    cert.unlink()
    assert certs.fetch() is None
    assert certs.generation == 1


def test_start_up_errors(tmp_path: pathlib.Path, ca: CertificateAuthority) -> None:
    a, b = ca.server(), ca.server()
    cert, _ = a.write(tmp_path, "a")
    _, other_key = b.write(tmp_path, "b")
    with pytest.raises(AuthConfigError) as err:
        ReloadingCertificates(str(cert), str(other_key))
    assert str(err.value) == f"TLS: {other_key} is not the key of the first certificate in {cert}"
    with pytest.raises(AuthConfigError) as err:
        ReloadingCertificates(str(tmp_path / "none.crt"), str(other_key))
    assert str(err.value) == f"TLS: cannot read {tmp_path / 'none.crt'}: No such file or directory"
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(AuthConfigError, match=r"garbage.pem: not a PEM certificate chain$"):
        ReloadingCertificates(str(garbage), str(other_key))
    with pytest.raises(AuthConfigError, match=r"garbage.pem: not an unencrypted PEM private key$"):
        ReloadingCertificates(str(cert), str(garbage))
    with pytest.raises(AuthConfigError, match=r"garbage.pem: not a PEM certificate bundle$"):
        ReloadingCertificates(str(cert), str(tmp_path / "a.key"), str(garbage))


def test_credentials_from_settings(tmp_path: pathlib.Path, ca: CertificateAuthority) -> None:
    cert, key = ca.server().write(tmp_path, "server")
    assert server_credentials_from_settings(Settings()) is None
    assert server_credentials_from_settings(
        Settings(tls_cert_file=str(cert), tls_key_file=str(key))) is not None
    with pytest.raises(AuthConfigError) as err:
        server_credentials_from_settings(Settings(tls_client_ca_file=str(cert)))
    assert str(err.value) == ("TLS needs both --tls-cert-file and --tls-key-file "
                              "(--tls-client-ca-file alone does not enable TLS)")
