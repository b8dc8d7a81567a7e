"""The controller's image cache: a URL downloaded once, verified against its sha256 (given, or recorded at the
first download of a URL given without one)."""

import hashlib
import io
import os

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines import images

DISK = b"\0" * 510 + b"\x55\xaa" + b"\0" * 512  # a raw disk with an MBR boot signature


class Opener:
    """Serves ``body`` for every URL and counts the downloads."""

    def __init__(self, body):
        self.body = body
        self.calls = 0

    def __call__(self, url, timeout):
        self.calls += 1
        return io.BytesIO(self.body)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_a_download_is_verified_and_kept_once():
    opener = Opener(DISK)
    checksum = hashlib.sha256(DISK).hexdigest()
    path = images.download("http://127.0.0.1/disk.raw", checksum, opener)
    with open(path, "rb") as handle:
        assert handle.read() == DISK
    assert images.download("http://127.0.0.1/disk.raw", checksum, opener) == path and opener.calls == 1
    assert os.listdir(os.path.dirname(path)) == [checksum]  # no temporary file left


def test_a_mismatch_leaves_nothing():
    with pytest.raises(ValidationError) as caught:
        images.download("http://127.0.0.1/disk.raw", "0" * 64, Opener(DISK))
    assert caught.value.field == "image_checksum"
    assert os.listdir(os.path.join(images.cache_dir(), "images")) == []


def test_no_opener_is_refused():
    with pytest.raises(MachineryError):
        images.download("http://127.0.0.1/disk.raw", "0" * 64, None)


def test_a_url_without_checksum_is_recorded_at_its_first_download():
    opener = Opener(DISK)
    checksum, first = images.checksum_of_url("http://127.0.0.1/os.iso", opener)
    assert (checksum, first) == (hashlib.sha256(DISK).hexdigest(), True)
    assert images.checksum_of_url("http://127.0.0.1/os.iso", opener) == (checksum, False) and opener.calls == 1
    assert os.path.isfile(os.path.join(images.cache_dir(), "images", checksum))
