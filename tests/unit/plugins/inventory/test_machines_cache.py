"""The inventory plugin's cache document and its unsafe marking (the parts that need no libvirt)."""

import json

import pytest
from hypothesis import given, strategies as st

from ansible_collections.machinery.compute.plugins.inventory import machines

READING = [{"name": "hv1", "uri": "qemu:///system", "error": None, "status": None,
            "machines": [{"name": "web-0", "labels": {"app": "{{ lookup('pipe', 'id') }}"}, "cpu": 2,
                          "ip_addresses": ["192.168.101.20"], "last_error": None, "managed": True}]}]


def test_a_cache_entry_of_this_format_gives_back_the_reading():
    entry = {"format": machines.CACHE_FORMAT, "pools": json.dumps(READING)}
    assert machines.InventoryModule.from_cache(entry) == {"pools": READING}


@pytest.mark.parametrize("entry", [
    {"pools": READING},                                            # what releases before this format stored
    {"format": "machinery.compute.machines/1", "pools": "[]"},     # another format
    {"format": machines.CACHE_FORMAT, "pools": "{not json"},       # a cut-off write
    {"format": machines.CACHE_FORMAT},                             # no reading at all
    [READING],
    None,
])
def test_any_other_cache_entry_is_a_miss(entry):
    assert machines.InventoryModule.from_cache(entry) is None


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                           lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


@given(JSON_VALUES)
def test_unsafe_json_keeps_every_value(value):
    assert machines.unsafe_json(value) == value


def test_unsafe_json_marks_strings_keys_and_nested_strings():
    wrapped = machines.unsafe_json(READING[0])
    label = wrapped["machines"][0]["labels"]["app"]
    key = next(iter(wrapped["machines"][0]["labels"]))
    for text in (label, key, wrapped["machines"][0]["ip_addresses"][0], wrapped["uri"]):
        # before ansible-core 2.19 an AnsibleUnsafeText; from 2.19 a str without the TrustedAsTemplate tag
        assert isinstance(text, str) and _never_templated(text)
    assert wrapped["machines"][0]["cpu"] == 2 and wrapped["machines"][0]["managed"] is True


def _never_templated(text):
    try:
        from ansible.template import is_trusted_as_template
    except ImportError:  # ansible-core < 2.19
        from ansible.utils.unsafe_proxy import AnsibleUnsafe
        return isinstance(text, AnsibleUnsafe)
    return not is_trusted_as_template(text)
