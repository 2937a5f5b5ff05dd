"""Client-facing TLS whose certificate files are re-read when they change
(docs/security.md#tls-for-clients-and-for-etcd).

Why: certificates are short-lived (cert-manager renews them into a Secret volume) and a
renewal must not need a restart. grpc's `dynamic_ssl_server_credentials` asks a fetcher
before every new TLS handshake whether there is a new configuration; ours stats the
files (rate-limited) and re-reads them only when one changed. Existing connections
keep the certificate they were set up with; new connections get the new one.

What it must never do: hand grpc a configuration it cannot serve. A rotation is not
atomic across two files (cert-manager writes tls.crt and tls.key; a hand-made rotation
may write one, then the other), so a freshly read pair is used only when both parse
and the key matches the certificate; otherwise the previous configuration stays in
force until a consistent pair appears. Never logs key material.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ..config import Settings
from .principal import AuthConfigError

log = logging.getLogger(__name__)

DEFAULT_CHECK_INTERVAL_S = 1.0

_Signature = tuple[tuple[int, int, int, int, int] | None, ...]


class CertificateError(ValueError):
    """The files do not form a usable configuration (message names the file and why)."""


def _spki(public_key: Any) -> bytes:
    return bytes(public_key.public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo))


def load_certificate_configuration(cert_file: str, key_file: str,
                                   client_ca_file: str | None = None) -> Any:
    """Read and check the files; a grpc.ServerCertificateConfiguration. Raises
    CertificateError (or OSError) without quoting file contents."""
    with open(cert_file, "rb") as f:
        chain_pem = f.read()
    with open(key_file, "rb") as f:
        key_pem = f.read()
    ca_pem: bytes | None = None
    if client_ca_file:
        with open(client_ca_file, "rb") as f:
            ca_pem = f.read()
    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError:
        raise CertificateError(f"{cert_file}: not a PEM certificate chain") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise CertificateError(f"{key_file}: not an unencrypted PEM private key") from None
    if _spki(key.public_key()) != _spki(chain[0].public_key()):
        raise CertificateError(f"{key_file} is not the key of the first certificate in {cert_file}")
    if ca_pem is not None:
        try:
            x509.load_pem_x509_certificates(ca_pem)
        except ValueError:
            raise CertificateError(f"{client_ca_file}: not a PEM certificate bundle") from None
    return grpc.ssl_server_certificate_configuration([(key_pem, chain_pem)],
                                                     root_certificates=ca_pem)


def _stat(path: str) -> tuple[int, int, int, int, int] | None:
    try:
        st = os.stat(path)  # follows symlinks: a Secret volume's ..data swap is seen
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ReloadingCertificates:
    """The certificate files of one server, and the fetcher grpc calls per handshake.

    `generation` counts configurations loaded (1 after start-up).
    """

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None = None, *,
                 check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self.check_interval_s = check_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._signature = self._files_signature()
        try:
            self.initial = load_certificate_configuration(cert_file, key_file, client_ca_file)
        except OSError as exc:
            raise AuthConfigError(f"TLS: cannot read {exc.filename}: "
                                  f"{exc.strerror or type(exc).__name__}") from None
        except CertificateError as exc:
            raise AuthConfigError(f"TLS: {exc}") from None
        self._rejected: _Signature | None = None
        self._last_check = clock()
        self.generation = 1

    def _files_signature(self) -> _Signature:
        paths = [self.cert_file, self.key_file] + ([self.client_ca_file] if self.client_ca_file else [])
        return tuple(_stat(p) for p in paths)

    def fetch(self) -> Any:
        """grpc's certificate_configuration_fetcher: a new configuration, or None to keep
        the current one. Runs on a grpc thread before each handshake; never raises."""
        try:
            with self._lock:
                now = self._clock()
                if now - self._last_check < self.check_interval_s:
                    return None
                self._last_check = now
                signature = self._files_signature()
                if signature in (self._signature, self._rejected):
                    return None
                if None in signature:
                    return None  # mid-swap; look again at the next handshake
                try:
                    config = load_certificate_configuration(self.cert_file, self.key_file,
                                                            self.client_ca_file)
                except (OSError, CertificateError) as exc:
                    self._rejected = signature
                    log.warning("TLS files changed but are not a usable pair yet; keeping the "
                                "previous certificate", extra={"error": str(exc)})
                    return None
                self._signature = signature
                self._rejected = None
                self.generation += 1
                log.info("TLS certificate reloaded", extra={"cert_file": self.cert_file,
                                                            "generation": self.generation})
                return config
        except Exception:
            log.exception("TLS certificate reload failed; keeping the previous certificate")
            return None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.initial, self.fetch,
            require_client_authentication=self.client_ca_file is not None)


def server_credentials(cert_file: str, key_file: str, client_ca_file: str | None = None, *,
                       check_interval_s: float = DEFAULT_CHECK_INTERVAL_S) -> grpc.ServerCredentials:
    """TLS server credentials that pick up rotated files without a restart; with a
    client CA, clients must present a certificate it signed (mTLS). Raises
    AuthConfigError when the files are missing or inconsistent at start-up."""
    return ReloadingCertificates(cert_file, key_file, client_ca_file,
                                 check_interval_s=check_interval_s).credentials()


def server_credentials_from_settings(settings: Settings) -> grpc.ServerCredentials | None:
    """Credentials for `--tls-cert-file/--tls-key-file[/--tls-client-ca-file]`, or None
    for plaintext. A partial configuration is a start-up error."""
    cert, key, ca = settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
    if not (cert or key or ca):
        return None
    if not (cert and key):
        raise AuthConfigError("TLS needs both --tls-cert-file and --tls-key-file"
                              + (" (--tls-client-ca-file alone does not enable TLS)" if ca else ""))
    return server_credentials(cert, key, ca)
