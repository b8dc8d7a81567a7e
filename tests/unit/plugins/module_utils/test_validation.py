import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError

from conftest import refused


@pytest.mark.parametrize("name", ["</name>", "../x", "a b", "x" * 64, "Upper", "-a", "a-", "", "a_b", "a.b"])
def test_bad_names(name):
    refused("name", check.dns_label, name)


@pytest.mark.parametrize("name", ["a", "web-1", "x" * 63, "0abc"])
def test_good_names(name):
    assert check.dns_label(name) == name


@pytest.mark.parametrize("name", ["t3.medium", "n2-standard-4", "small", "a.b.c", "x" * 63 + "." + "y" * 63,
                                  ".".join(["x" * 63] * 3) + "." + "y" * 61])
def test_class_names_are_dns_subdomains(name):
    assert check.class_name(name) == name


@pytest.mark.parametrize("name", ["Standard_B2s", "t3..medium", ".a", "a.", "a.-b", "a b", "",
                                  ".".join(["x" * 63] * 4) + ".y", None])
def test_bad_class_names(name):
    refused("machine_class", check.class_name, name)


@pytest.mark.parametrize("cpu", [0, -1, 257, "two", True, "1.5"])
def test_bad_cpu(cpu):
    refused("cpu", check.cpu_count, cpu)


@pytest.mark.parametrize("memory", ["16Gx", "0", 0, -1, "-1Gi", "1Ki"])
def test_bad_memory(memory):
    refused("memory", check.memory_bytes, memory)


def test_memory_is_whole_mib():
    # 1.5G is no whole number of KiB; libvirt would keep a different value and every run would see a change
    assert check.memory_bytes("1.5G") == 1431 * 2 ** 20
    assert check.memory_bytes("512Mi") == 512 * 2 ** 20


def test_labels():
    assert check.labels({"app": "web", "example.com/tier": "1", "empty": None}) == {
        "app": "web", "example.com/tier": "1", "empty": ""}
    refused("labels.app", check.labels, {"app": "{{ lookup('pipe', 'id') }}"})
    with pytest.raises(ValidationError):
        check.labels({"bad key": "x"})


def test_mac():
    assert check.mac_address("52:54:00:AA:bb:01") == "52:54:00:aa:bb:01"
    for bad in ("52:54:00:aa:bb", "01:00:5e:00:00:01", "zz:54:00:aa:bb:01"):
        with pytest.raises(ValidationError):
            check.mac_address(bad)


def test_checksum():
    digest = "a" * 64
    assert check.sha256_checksum("sha256:" + digest) == digest
    assert check.sha256_checksum(digest.upper()) == digest
    refused("image_checksum", check.sha256_checksum, "md5:abc")
