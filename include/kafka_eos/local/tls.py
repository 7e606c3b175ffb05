"""TLS material for the secured local broker, made on this machine (nothing downloaded): a CA of
its own, and a server certificate it signs for 127.0.0.1 and localhost.

PEM files, which both Kafka (``ssl.keystore.type=PEM``) and librdkafka (``ssl.ca.location``) read:
``ca.pem`` (the CA's certificate: what clients trust), ``broker.pem`` (the server's private key
and its certificate chain; readable by its owner only).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from kafka_eos.paths import write_private

#: The broker certificate's subject; a client certificate with it (the broker talking to its own
#: controller over mutual TLS) is the principal ``User:CN=<this>``.
BROKER_CN = "kafka-eos-local-broker"
#: Long enough for any local use; a new CA and certificate are made when the files are removed.
VALID_DAYS = 825


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    keystore: Path

    @property
    def principal(self) -> str:
        return f"User:CN={BROKER_CN}"


def ensure_tls_files(folder: Path) -> TlsFiles:
    """The CA and broker certificate under ``folder``, made on first use."""
    files = TlsFiles(folder / "ca.pem", folder / "broker.pem")
    if files.ca.exists() and files.keystore.exists():
        return files
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kafka-eos local CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                            crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, BROKER_CN)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            # The broker is a server to clients and a client to its own controller listener.
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    write_private(files.keystore, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())
                   + cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    files.ca.write_bytes(ca_cert.public_bytes(pem))
    return files

