"""Per-run TLS for shards that listen off the loopback.

When shards bind to a network address and the operator configured no
certificate (``spark.pystrads.shard.tls.*``), every shard makes its own key
pair and a self-signed certificate for the address its clients dial
(:func:`self_signed`), serves ``grpc+tls`` with it and reports the
certificate -- never the key -- to the driver.  The driver's trust store for
the run is the set of those certificates (:func:`trust_bundle`); it reaches
the workers inside the run's :class:`~pystrads.ps.client.ShardGroup`.  So:

* the run token and the program payloads never cross the network in clear;
* a client that does not hold the run's trust store cannot complete the TLS
  handshake (there is no certificate authority outside the run to trust);
* no private key ever leaves the host whose shard made it (each shard is its
  own one-certificate authority), so there is no CA key to guard or ship.

The certificates live for the run (a day of validity, far beyond any lease):
a restarted shard makes a new one and the driver refreshes the trust store.
Plaintext off the loopback needs ``spark.pystrads.shard.tls.plaintext=true``
and logs a warning.  Uses ``cryptography`` (a dependency for this module
only), the Python Cryptographic Authority's well-kept library, rather than
hand-written ASN.1.
"""

from __future__ import annotations

import datetime
import ipaddress
from typing import Iterable, Optional, Tuple

#: Days a run certificate is valid (a shard lives for one application).
VALID_DAYS = 7


def self_signed(address: str) -> Tuple[bytes, bytes]:
    """``(certificate PEM, private key PEM)`` for a server dialled at ``address`` (an IP
    address or a host name, put in the subject alternative name that clients verify)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pystrads run"),
                      x509.NameAttribute(NameOID.COMMON_NAME, address[:64])])
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(address))
    except ValueError:
        alt = x509.DNSName(address)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            # its own authority: trusted only by clients that hold this very certificate
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=False,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def trust_bundle(certificates: Iterable[Optional[str]], configured: Optional[bytes] = None) -> Optional[bytes]:
    """The PEM roots clients trust: the operator's CA (``configured``) and every shard's own
    certificate, or None when there is nothing to trust (plain gRPC)."""
    parts = [configured] if configured else []
    parts += [c.encode() for c in certificates if c]
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts) or None
