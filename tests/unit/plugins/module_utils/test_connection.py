"""What a refused remote connection is blamed on: libvirt's words for each transport mapped to a cause."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.connection import refusal_hint


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
