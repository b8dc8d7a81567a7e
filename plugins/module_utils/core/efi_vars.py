# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``efi_vars`` option: UEFI variables a machine's firmware store is to hold, checked and compared; pure.

Each entry is ``{name, guid, value, runtime_access}``: the variable's name, its vendor GUID, its data as base64
(IronCore's ``efiVars[].value``) and whether the OS may read it once it runs (UEFI's RUNTIME_ACCESS; the variable
is always non-volatile and readable by boot services). Normalized, the GUID is lower case and the value canonical
base64, so the record and a diff show what the store holds.

Secure Boot's own variables are refused: its keys (PK, KEK, db, dbx) are authenticated variables that
``secure_boot`` enrolls from the distribution's template, and SecureBoot, SetupMode, CustomMode and the like are
the firmware's state, which it computes or guards itself.
"""

from __future__ import annotations

import base64
import binascii
import re

from ansible_collections.machinery.compute.plugins.module_utils.core import varstore
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError

GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"  # EFI_GLOBAL_VARIABLE
SECURITY_DATABASE = "d719b2cb-3d3a-4596-a3bc-dad00e67656f"  # EFI_IMAGE_SECURITY_DATABASE_GUID
SECURE_BOOT_OWNED = {
    (GLOBAL, name) for name in ("PK", "KEK", "SecureBoot", "SetupMode", "AuditMode", "DeployedMode", "VendorKeys",
                                "SignatureSupport", "PKDefault", "KEKDefault", "dbDefault", "dbxDefault")} | {
    (SECURITY_DATABASE, name) for name in ("db", "dbx", "dbt", "dbr")} | {
    ("f0a30bc7-af08-4556-99c4-001009c93a44", "SecureBootEnable"),
    ("c076ec0c-7028-4399-a072-71ee5c448b9f", "CustomMode"),
    ("9073e4e0-60ec-4b6e-9903-4c223c260f3c", "VendorKeysNv")}
_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
NAME_LIMIT = 128  # characters; the firmware limits a variable as a whole, this keeps names sensible
# a variable's data: OVMF's 4 MiB builds take up to 33 KiB for a variable with its name and header
VALUE_LIMIT = 32 * 1024
ENTRY_KEYS = ("name", "guid", "value", "runtime_access")


def check(value, field="efi_vars"):
    """The entries of ``efi_vars`` normalized, each problem naming its field (``efi_vars[1].guid``)."""
    if not isinstance(value, list):
        raise ValidationError("must be a list of mappings with name, guid and value", field)
    result, seen = [], {}
    for index, item in enumerate(value):
        where = "%s[%d]" % (field, index)
        entry = check_entry(item, where)
        key = (entry["guid"], entry["name"])
        if key in seen:
            message = "variable %s of vendor %s is given twice (also as %s)" % (entry["name"], entry["guid"],
                                                                                seen[key])
            raise ValidationError(message, where + ".name")
        seen[key] = where
        result.append(entry)
    return result


def check_entry(item, where, paths=None):
    """One variable normalized; ``paths`` renames its keys in errors (a manifest's ``uuid`` for ``guid``)."""
    paths = dict({key: key for key in ENTRY_KEYS}, **(paths or {}))
    if not isinstance(item, dict):
        raise ValidationError("must be a mapping with name, %s and value" % paths["guid"], where)
    name, guid, text = item.get("name"), item.get("guid"), item.get("value")
    if not isinstance(name, str) or not name:
        raise ValidationError("must be a non-empty string", "%s.%s" % (where, paths["name"]))
    if len(name) > NAME_LIMIT or any(ord(char) < 0x20 or ord(char) > 0xFFFF or char == "\x7f" for char in name):
        raise ValidationError("%r: a variable name is up to %d printable characters of UCS-2" % (name, NAME_LIMIT),
                              "%s.%s" % (where, paths["name"]))
    if not isinstance(guid, str) or not _GUID.match(guid):
        raise ValidationError("%r is not a GUID (like %s)" % (guid, GLOBAL), "%s.%s" % (where, paths["guid"]))
    guid = guid.lower()
    if (guid, name) in SECURE_BOOT_OWNED:
        raise ValidationError("%s is Secure Boot's own variable: its keys are enrolled by secure_boot (the "
                              "distribution's keys) and its state is the firmware's; it is not written here"
                              % name, "%s.%s" % (where, paths["name"]))
    data = decode(text, "%s.%s" % (where, paths["value"]))
    runtime = item.get("runtime_access")
    if runtime is not None and not isinstance(runtime, bool):
        raise ValidationError("must be true or false", "%s.%s" % (where, paths["runtime_access"]))
    return {"name": name, "guid": guid, "value": base64.b64encode(data).decode("ascii"),
            "runtime_access": runtime is not False}


def decode(text, field):
    """The bytes of a base64 value: not empty (a variable without data is a deleted one) and not too large."""
    if not isinstance(text, str) or not text.strip():
        raise ValidationError("must be the variable's data in base64, not empty", field)
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValidationError("is not base64: %s" % exc, field) from None
    if not data:
        raise ValidationError("must be the variable's data in base64, not empty", field)
    if len(data) > VALUE_LIMIT:
        raise ValidationError("%d bytes: a variable holds up to %d here" % (len(data), VALUE_LIMIT), field)
    return data


def attributes(entry):
    value = varstore.NON_VOLATILE | varstore.BOOTSERVICE_ACCESS
    return value | varstore.RUNTIME_ACCESS if entry["runtime_access"] else value


def as_variables(entries):
    """The varstore.Variables of normalized entries."""
    return [varstore.Variable(entry["guid"], entry["name"], attributes(entry), base64.b64decode(entry["value"]))
            for entry in entries]


def found_entries(entries, found):
    """What the store holds of the variables ``entries`` name, as entries (value None: not there). ``found``:
    {(guid, name): varstore.Variable}, or None when the machine has no store yet."""
    shown = []
    for entry in entries:
        variable = (found or {}).get((entry["guid"], entry["name"]))
        if variable is None:
            shown.append({"name": entry["name"], "guid": entry["guid"], "value": None, "runtime_access": None})
        else:
            shown.append({"name": entry["name"], "guid": entry["guid"],
                          "value": base64.b64encode(variable.data).decode("ascii"),
                          "runtime_access": bool(variable.attributes & varstore.RUNTIME_ACCESS),
                          **({"attributes": variable.attributes} if variable.attributes & ~0x7 else {})})
    return shown


def differing(entries, found):
    """The entries whose variable the store lacks or holds otherwise (other data or attributes)."""
    wanted = as_variables(entries)
    return [entry for entry, variable in zip(entries, wanted) if (found or {}).get(variable.key) != variable]
