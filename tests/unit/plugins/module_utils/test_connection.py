"""What a refused remote connection is blamed on: libvirt's words for each transport mapped to a cause."""

import os

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import connection
from ansible_collections.machinery.compute.plugins.module_utils.core.connection import refusal_hint, with_tls_identity
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConnectionFailed, ValidationError


@pytest.mark.parametrize("libvirt_says,words", [
    ("Cannot recv data: Host key verification failed.: Connection reset by peer", "SSH key is not trusted"),
    ("libssh transport error: No user interaction callback provided: Can't verify the session host key",
     "known_hosts"),
    ("libssh transport error: failed to authenticate: Access denied for 'publickey'.", "refused the SSH key"),
    ("authentication failed: authentication with private key '/k' has failed: Username/PublicKey combination "
     "invalid", "refused the SSH key"),
    ("Cannot recv data: root@127.0.0.1: Permission denied (publickey).: Connection reset by peer",
     "refused the SSH key"),
    ("Unable to read TLS confirmation: Input/output error", "did not accept the client certificate"),
    ("Our own certificate /p/clientcert.pem failed validation against /p/cacert.pem: The certificate hasn't got "
     "a known issuer.", "not signed by the cacert.pem"),
    ("authentication failed: Failed to verify peer's certificate", "TLS certificate is not trusted"),
    ("unable to connect to server at '127.0.0.1:1': Connection refused", "nothing listens"),
    ("unable to connect to server at '10.0.0.9:16514': Connection timed out", "does not answer"),
])
def test_known_refusals_get_their_cause(libvirt_says, words):
    assert words in refusal_hint(libvirt_says)


def test_other_errors_get_no_guess():
    assert refusal_hint("Domain not found: no domain with matching name 'x'") is None
    assert refusal_hint(None) is None


def test_a_tls_identity_from_three_files_becomes_a_pkipath(tmp_path):
    env = {}
    for variable, name in (("MACHINERY_TLS_CACERT", "ca"), ("MACHINERY_TLS_CLIENTCERT", "cert"),
                           ("MACHINERY_TLS_CLIENTKEY", "key")):
        (tmp_path / name).write_text(name)
        env[variable] = str(tmp_path / name)
    uri = with_tls_identity("qemu+tls://hv1/system", env)
    pki = uri.split("?pkipath=", 1)[1]
    assert sorted(os.listdir(pki)) == ["cacert.pem", "clientcert.pem", "clientkey.pem"]
    assert open(os.path.join(pki, "clientkey.pem")).read() == "key" and os.stat(pki).st_mode & 0o077 == 0
    assert with_tls_identity("qemu+tls://hv2/system?no_verify=1", env) == "qemu+tls://hv2/system?no_verify=1&pkipath=" + pki
    # a URI that names its own directory, another transport, or no identity: unchanged
    for kept in ("qemu+tls://hv1/system?pkipath=/etc/pki/hv1", "qemu+ssh://root@hv1/system"):
        assert with_tls_identity(kept, env) == kept
    assert with_tls_identity("qemu+tls://hv1/system", {}) == "qemu+tls://hv1/system"
    with pytest.raises(ValidationError, match="MACHINERY_TLS_CLIENTKEY"):
        with_tls_identity("qemu+tls://hv1/system", dict(env, MACHINERY_TLS_CLIENTKEY=str(tmp_path / "gone")))


def test_a_pkipath_without_its_key_names_the_missing_file(tmp_path, monkeypatch):
    for name in ("cacert.pem", "clientcert.pem"):
        (tmp_path / name).write_text(name)
    uri = "qemu+tls://hv1/system?pkipath=%s" % tmp_path

    def refused(_uri):
        # what the host's refusal of a session without a client certificate reads like
        raise connection.libvirt.libvirtError("Unable to read TLS confirmation: Input/output error")
    monkeypatch.setattr(connection.libvirt, "open", refused)
    with pytest.raises(ConnectionFailed) as raised:
        connection.open_connection(uri)
    message = raised.value.message
    assert "%s is missing" % (tmp_path / "clientkey.pem") in message
    assert "signed by a CA" not in message
    assert connection.missing_tls_files("qemu+ssh://root@hv1/system") == []


SOCKET = "/lab/pool1/run/libvirt-sock"
SSH_URI = "qemu+ssh://root@10.0.0.5:2222/system?socket=%s&keyfile=/k/id" % SOCKET


def ssh_argv(host="10.0.0.5", port="2222", socket_path=SOCKET, program="ssh"):
    """The command line libvirt gives the ssh client of a qemu+ssh open."""
    return [program, "-p", port, "-l", "root", "-i", "/k/id", "-T", "-e", "none", "--", host, "sh", "-c",
            "'nc' -U %s" % socket_path]


def test_the_ssh_client_of_an_open_is_told_from_the_processs_other_children():
    """Only the client of that host, port and socket is ended when its open is given up: another pool's behind the
    same sshd, another host's, and any other child stay."""
    children = {11: ssh_argv(), 12: ssh_argv(socket_path="/lab/pool2/run/libvirt-sock"), 13: ssh_argv(port="22"),
                14: ssh_argv(host="10.0.0.6"), 15: ["qemu-img", "info", "10.0.0.5"], 16: [],
                17: ssh_argv(program="/usr/bin/ssh")}
    assert connection.ssh_children(SSH_URI, children) == [11, 17]
    assert connection.ssh_children("qemu+ssh://10.0.0.5/system", children) == [11, 12, 13, 17]
    assert connection.ssh_children("qemu+ssh://10.0.0.5:22/system", children) == [13]  # not 2222
    assert connection.ssh_children(SSH_URI + "&command=/opt/ssh9", {21: ssh_argv(program="/opt/ssh9"),
                                                                    22: ssh_argv()}) == [21]
    assert connection.spawns_client(SSH_URI) and not connection.spawns_client("qemu+libssh2://h/system")


def test_a_child_deaf_to_sigterm_is_killed():
    """end_children returns once its children are gone: SIGTERM first, SIGKILL for one that ignores it."""
    import subprocess
    deaf = subprocess.Popen(["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"], stdout=subprocess.PIPE)
    polite = subprocess.Popen(["sleep", "60"])
    try:
        assert deaf.stdout.readline() == b"ready\n"  # its trap is set
        assert set(connection._children()) >= {deaf.pid, polite.pid}
        connection.end_children([deaf.pid, polite.pid], grace=0.2)
        assert connection._gone(deaf.pid) and connection._gone(polite.pid)
    finally:
        for proc in (deaf, polite):
            proc.kill()
            proc.wait()
    assert deaf.returncode == -9 and polite.returncode == -15


def test_a_pool_that_failed_to_open_is_not_opened_again_in_the_run(monkeypatch):
    """A module's run (remember_failed_opens) fails a URI at once once it failed; plugins try again each time."""
    tries = []

    def never_answers(uri, field, name):
        tries.append(uri)
        raise ConnectionFailed("cannot connect to %s: the host did not answer within 30s" % uri, field)
    monkeypatch.setattr(connection, "_open", never_answers)
    frozen, other = "qemu+tls://10.0.0.9/system", "qemu+tls://10.0.0.8/system"
    try:
        connection.remember_failed_opens()
        for field in ("pools", "unique_across", "unique_across"):
            with pytest.raises(ConnectionFailed) as failed:
                connection.open_connection(frozen, field)
            assert failed.value.field == field and "did not answer within 30s" in failed.value.message
        assert "not tried again" in failed.value.message and tries == [frozen]
        with pytest.raises(ConnectionFailed):
            connection.open_connection(other)
        assert tries == [frozen, other]
    finally:
        connection.remember_failed_opens(False)
    with pytest.raises(ConnectionFailed):
        connection.open_connection(frozen)
    with pytest.raises(ConnectionFailed):
        connection.open_connection(frozen)
    assert tries == [frozen, other, frozen, frozen]
