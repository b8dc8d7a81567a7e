"""Every field of the upstream schemas (tests/unit/plugins/module_utils/data/upstream_fields.yml, written from the
upstream Go types) is applied, warned with a reason or refused with a reason by its dialect's table: none is
unknown (issue 39). ``python3 -m pytest ... -s`` prints the per-kind counts."""

import os

import pytest
import yaml

from ansible_collections.machinery.compute.plugins.module_utils.manifests import conformance, ironcore, openshift

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "upstream_fields.yml")
DIALECTS = {"openshift": openshift, "ironcore": ironcore}


def upstream_fields():
    with open(DATA) as handle:
        data = yaml.safe_load(handle)
    for dialect, kinds in data["kinds"].items():
        for kind, spec in kinds.items():
            paths = list(spec.get("object_meta") or []) + list(spec.get("fields") or [])
            for prefix, fields in (spec.get("prefixed") or {}).items():
                paths += ["%s.%s" % (prefix, field) for field in fields]
            yield dialect, kind, paths


CASES = list(upstream_fields())


def verdict_of(fields_table, path):
    """The verdict of an upstream field: its own, that of a free-form map's ``*``, or a classified container's
    (a warned or refused container covers its fields)."""
    found = fields_table.get(path)
    if found is None and "." in path:
        found = fields_table.get(path.rsplit(".", 1)[0] + ".*") if not path.endswith(".*") else None
    if found is None:
        parts = path.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            head = ".".join(parts[:cut])
            container = fields_table.get(head)
            if container is None and head.endswith("[]"):  # a list's verdict covers its items
                container = fields_table.get(head[:-2])
            if container is not None and container != conformance.APPLIED:
                return container
    return found


def counts(dialect, kind, paths):
    table = DIALECTS[dialect].FIELDS[kind]
    tally = {"applied": 0, "warned": 0, "refused": 0, "unknown": []}
    for path in paths:
        found = verdict_of(table, path)
        if found is None:
            tally["unknown"].append(path)
        elif found == conformance.APPLIED:
            tally["applied"] += 1
        else:
            assert found[1], (path, "%s without a reason" % found[0])
            tally[found[0]] += 1
    return tally


@pytest.mark.parametrize("dialect, kind, paths", CASES, ids=["%s-%s" % case[:2] for case in CASES])
def test_every_upstream_field_is_applied_warned_or_refused_with_a_reason(dialect, kind, paths):
    tally = counts(dialect, kind, paths)
    print("%s %s: applied %d, warned %d, refused %d, unknown %d" % (
        dialect, kind, tally["applied"], tally["warned"], tally["refused"], len(tally["unknown"])))
    assert tally["unknown"] == []
