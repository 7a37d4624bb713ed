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
* no private key ever leaves the host whose shard made it (each certificate
  is trusted as itself), so there is no CA key to guard or ship;
* the shards ask every client for the run's client certificate (mutual TLS,
  :func:`client_identity`): the driver makes it with the run, its key reaches
  the run's tasks inside the :class:`~pystrads.ps.client.ShardGroup` beside
  the run token, and the shards get the certificate only.  A network peer
  outside the run cannot complete a handshake, so it cannot send a shard a
  single request.

Each certificate is an end entity (``CA:FALSE``, no ``keyCertSign``): trusted as
itself, it can sign nothing a client would accept, so one shard's key cannot
vouch for another shard's address.  It is valid for
``spark.pystrads.shard.tls.lifetimeSeconds`` (a week by default) from its
shard's start, and from a day before it (:data:`SKEW_MARGIN_SECONDS`: hosts
whose clocks disagree by up to a day still accept it).  The driver replaces
a group of shards whose certificates are past half their life before a new
fit uses it (:meth:`~pystrads.ps.launcher.ShardManager.renewal_due`), so a
fit always starts with at least half the lifetime ahead, whatever the age of
the application; a restarted shard makes a new certificate and the driver
refreshes the trust store.
Plaintext off the loopback needs ``spark.pystrads.shard.tls.plaintext=true``
and logs a warning.  Uses ``cryptography`` (a dependency for this module
only), the Python Cryptographic Authority's well-kept library, rather than
hand-written ASN.1.
"""

from __future__ import annotations

import datetime
import ipaddress
from typing import Iterable, Optional, Tuple

#: Seconds a run certificate is valid by default (``spark.pystrads.shard.tls.lifetimeSeconds``).
LIFETIME_SECONDS = 7 * 86400.0

#: A certificate is valid from this long before its shard made it: clocks of hosts that
#: disagree by up to this much still accept it.
SKEW_MARGIN_SECONDS = 86400.0


def self_signed(address: str, lifetime: float = LIFETIME_SECONDS) -> Tuple[bytes, bytes]:
    """``(certificate PEM, private key PEM)`` for a server dialled at ``address`` (an IP
    address or a host name, put in the subject alternative name that clients verify), valid
    for ``lifetime`` seconds from now."""
    return _end_entity(address, address, "server", lifetime)


def client_identity(lifetime: float = LIFETIME_SECONDS) -> Tuple[bytes, bytes]:
    """``(certificate PEM, private key PEM)`` that the run's clients (the driver, the
    coordinator, the workers) present to its shards: mutual TLS, so a peer outside the run
    cannot complete a handshake.  An end entity for client authentication, trusted by the
    shards as itself, valid ``lifetime`` seconds from now."""
    return _end_entity("pystrads run client", None, "client", lifetime)


def _end_entity(common_name: str, address: Optional[str], usage: str, lifetime: float) -> Tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pystrads run"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(name).issuer_name(name)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(seconds=SKEW_MARGIN_SECONDS))
               .not_valid_after(now + datetime.timedelta(seconds=float(lifetime))))
    if address is not None:
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(address))
        except ValueError:
            alt = x509.DNSName(address)
        builder = builder.add_extension(x509.SubjectAlternativeName([alt]), critical=False)
    eku = ExtendedKeyUsageOID.SERVER_AUTH if usage == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (builder
            # an end entity, trusted as itself by peers that hold this very certificate: a
            # certificate it signed is refused ("invalid CA certificate")
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
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
