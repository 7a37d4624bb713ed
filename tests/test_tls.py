"""The shards' own certificates: end entities that can vouch for nothing else, valid for a set
lifetime, and renewed -- a new group of shards -- before a fit could outlive them."""

import datetime
import json
import os
import subprocess
import sys

import pytest

from pystrads.errors import ShardUnavailableError
from pystrads.ps.client import ShardClient
from pystrads.ps.server import ShardServer
from pystrads.ps.tls import SKEW_MARGIN_SECONDS, self_signed, trust_bundle

TOKEN = "tls-test"


def _serve(cert_pem, key_pem):
    from pyarrow import flight

    return ShardServer("grpc+tls://127.0.0.1:0", TOKEN, 1e9, "s",
                       tls_certificates=[flight.CertKeyPair(cert_pem, key_pem)])


def _forge(signer_cert_pem, signer_key_pem, address):
    """A certificate for ``address`` signed by another shard's key (issuer: that shard)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    signer = x509.load_pem_x509_certificate(signer_cert_pem)
    signer_key = serialization.load_pem_private_key(signer_key_pem, None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)]))
            .issuer_name(signer.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
            .sign(signer_key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def test_a_certificate_signed_by_one_shards_key_is_refused_by_the_runs_clients():
    """Shard A's key signs a certificate for shard B's address: a server presenting it fails the
    handshake of a client that trusts the whole run (A's and B's certificates); B's own passes."""
    cert_a, key_a = self_signed("127.0.0.2")
    cert_b, key_b = self_signed("127.0.0.1")
    trust = trust_bundle([cert_a.decode(), cert_b.decode()])
    genuine, forged = _serve(cert_b, key_b), _serve(*_forge(cert_a, key_a, "127.0.0.1"))
    try:
        assert ShardClient(f"grpc+tls://127.0.0.1:{genuine.port}", TOKEN, tls_root_certs=trust).action(
            "ping")["shard"] == "s"
        with pytest.raises(ShardUnavailableError, match="TLS handshake|handshake|unavailable"):
            ShardClient(f"grpc+tls://127.0.0.1:{forged.port}", TOKEN, tls_root_certs=trust,
                        rpc_timeout=5).action("ping")
    finally:
        genuine.shutdown()
        forged.shutdown()


def test_a_shards_certificate_lives_its_lifetime_from_a_day_back():
    from cryptography import x509

    now = datetime.datetime.now(datetime.timezone.utc)
    cert = x509.load_pem_x509_certificate(self_signed("10.1.2.3", 20.0)[0])
    assert abs((cert.not_valid_after_utc - now).total_seconds() - 20.0) < 5
    assert abs((now - cert.not_valid_before_utc).total_seconds() - SKEW_MARGIN_SECONDS) < 5
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert not constraints.ca and not usage.key_cert_sign


DRIVER = r"""
import json, sys, time
import numpy as np
from pystrads.engine import Engine
from pystrads.programs import examples as ex
from pystrads.errors import PystradsError
from pystrads.ps import launcher, tls
from pystrads.ps.client import ShardClient
from pystrads.session import spark_session

address, lifetime = sys.argv[1], float(sys.argv[2])
spark = spark_session("local[2]", "pystrads-tls-lifetime", {
    "spark.ui.enabled": "false", "spark.pystrads.shard.bindHost": address,
    "spark.pystrads.shard.tls.lifetimeSeconds": str(lifetime)})
rng = np.random.default_rng(0)
keys, vals = rng.integers(0, 50, 500), rng.random(500)
rdd = spark.sparkContext.parallelize(list(zip(keys.tolist(), vals.tolist())), 2)

def fit():
    with Engine(ex.RotationSum(50, iterations=2), rdd, seed=1).fit() as res:
        sums = res.read_table("sums")[:, 0].tolist()
    manager = next(iter(launcher._MANAGERS.values()))
    group = manager.group
    refused = []  # a client that trusts the shard and holds the token but not the run's client certificate
    for identity in (None, tls.client_identity()):
        try:
            ShardClient(group.shards[0].uri, group.token, tls_root_certs=group.tls_root_certs,
                        client_cert=identity).action("ping")
            refused.append(False)
        except PystradsError:
            refused.append(True)
    return {"sums": sums, "run": manager.run_id, "uris": [s.uri for s in group.shards],
            "refused": refused, "with_certificate": group.client(0).action("ping")["shard"] == group.shards[0].shard_id}

first = fit()
time.sleep(lifetime + 3)  # past the first shards' certificates' whole life
second = fit()
print("RESULT " + json.dumps({"first": first, "second": second,
                              "expected": (2 * np.bincount(keys, vals, 50)).tolist()}), flush=True)
spark.stop()
"""


@pytest.mark.slow
def test_an_application_fits_again_after_its_first_shards_certificates_expired():
    """Shards off the loopback (their own network namespace's address, so per-run TLS) with
    12 s certificates: a fit, 15 s of nothing, a fit again -- on new shards with new
    certificates (the run's client certificate too), with the same sums; a client without the
    run's client certificate is refused its handshake each time."""
    import netns

    why = netns.available()
    if why:
        pytest.skip(why)
    import numpy as np

    with netns.NetnsHosts(["solo"]) as hosts:
        env = dict(os.environ, SPARK_LOCAL_IP=hosts.address["solo"], PYSPARK_PYTHON=sys.executable,
                   NO_PROXY="*", no_proxy="*")
        out = hosts.run("solo", [sys.executable, "-c", DRIVER, hosts.address["solo"], "12"], env=env, timeout=300,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, out.stderr[-5000:]
    got = json.loads(line[len("RESULT "):])
    first, second = got["first"], got["second"]
    assert all(u.startswith(f"grpc+tls://{hosts.address['solo']}:") for u in first["uris"] + second["uris"]), got
    assert first["run"] != second["run"]  # new shards: new certificates
    # mutual TLS: without the run's client certificate (or with another) no handshake completes
    assert first["refused"] == [True, True] and second["refused"] == [True, True], got
    assert first["with_certificate"] and second["with_certificate"], got
    np.testing.assert_allclose(first["sums"], got["expected"], atol=1e-9)
    np.testing.assert_allclose(second["sums"], got["expected"], atol=1e-9)


def test_shards_that_listen_on_every_interface_serve_tls_even_in_local_mode():
    """``shard.bindHost=0.0.0.0`` in local mode advertises the loopback but listens on every
    interface: off the loopback, so TLS (unless plaintext is allowed or a certificate given)."""
    from pystrads.ps.launcher import auto_tls, shard_addresses

    bind, advertise = shard_addresses(True, "0.0.0.0")
    assert (bind, advertise) == ("0.0.0.0", "127.0.0.1")
    assert auto_tls("", False, bind, advertise)
    assert not auto_tls("", True, bind, advertise) and not auto_tls("/etc/cert.pem", False, bind, advertise)
    assert not auto_tls("", False, *shard_addresses(True, ""))  # local mode's loopback: plain gRPC
    assert auto_tls("", False, "10.0.0.7", "10.0.0.7")
