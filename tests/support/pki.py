"""Test PKI: a private CA (trustme) and a server certificate written as PEM files."""

from __future__ import annotations

from pathlib import Path

import trustme


def write_server_pki(folder: Path, *names: str) -> tuple[Path, Path, Path]:
    """A CA and a certificate for ``names``; returns (certificate chain, key, CA certificate)."""
    ca = trustme.CA()
    cert = ca.issue_cert(*names)
    cert_file, key_file, ca_file = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    return cert_file, key_file, ca_file
