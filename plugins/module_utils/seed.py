# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Boot configuration: the Ignition document and the NoCloud ``cidata`` ISO, built in memory (no binaries)."""

from __future__ import annotations

import io
import json

from ansible_collections.machinery.compute.plugins.module_utils.errors import MachineryError, ValidationError

try:
    import yaml
    HAS_YAML = True
except ImportError:
    yaml = None
    HAS_YAML = False


def ignition_document(ignition, ssh_keys=None, field="ignition"):
    """Ignition as compact JSON bytes; a string must already be JSON. SSH keys go to the ``core`` user."""
    if isinstance(ignition, str):
        try:
            ignition = json.loads(ignition)
        except ValueError as exc:
            raise ValidationError("is not valid JSON: %s" % exc, field) from None
    if not isinstance(ignition, dict):
        raise ValidationError("must be an Ignition config: a JSON object or a mapping", field)
    if ssh_keys:
        ignition = json.loads(json.dumps(ignition))
        users = ignition.setdefault("passwd", {}).setdefault("users", [])
        core = next((user for user in users if user.get("name") == "core"), None)
        if core is None:
            core = {"name": "core"}
            users.append(core)
        keys = core.setdefault("sshAuthorizedKeys", [])
        keys.extend(key for key in ssh_keys if key not in keys)
    return json.dumps(ignition, sort_keys=True, separators=(",", ":")).encode()


def _require_yaml():
    if not HAS_YAML:
        raise MachineryError("PyYAML is needed to write cloud-init data (pip install PyYAML)")


def user_data_text(user_data, ssh_keys=None, field="cloud_init.user_data"):
    """user-data as text. A mapping becomes #cloud-config; SSH keys are merged into a cloud-config."""
    if user_data is None:
        user_data = {}
    if isinstance(user_data, str):
        if not ssh_keys:
            return user_data
        if not user_data.lstrip().startswith("#cloud-config"):
            raise ValidationError("ssh_authorized_keys can only be merged into #cloud-config user-data, not into "
                                  "a script; put the keys into the script yourself", field)
        _require_yaml()
        try:
            user_data = yaml.safe_load(user_data) or {}
        except yaml.YAMLError as exc:
            raise ValidationError("is not valid YAML: %s" % exc, field) from None
    if not isinstance(user_data, dict):
        raise ValidationError("must be a string or a mapping", field)
    _require_yaml()
    data = dict(user_data)
    if ssh_keys:
        keys = list(data.get("ssh_authorized_keys") or [])
        keys.extend(key for key in ssh_keys if key not in keys)
        data["ssh_authorized_keys"] = keys
    return "#cloud-config\n" + yaml.safe_dump(data, default_flow_style=False, sort_keys=True)


def _yaml_text(value, field):
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise ValidationError("must be a string or a mapping", field)
    _require_yaml()
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True)


def nocloud_files(name, cloud_init, ssh_keys=None):
    """{file name: bytes} of the NoCloud seed for machine ``name``."""
    cloud_init = cloud_init or {}
    meta = cloud_init.get("meta_data")
    if isinstance(meta, str):
        meta_text = meta
    else:
        if meta is not None and not isinstance(meta, dict):
            raise ValidationError("must be a string or a mapping", "cloud_init.meta_data")
        merged = {"instance-id": "iid-%s" % name, "local-hostname": name}
        merged.update(meta or {})
        meta_text = _yaml_text(merged, "cloud_init.meta_data")
    files = {
        "meta-data": meta_text.encode(),
        "user-data": user_data_text(cloud_init.get("user_data"), ssh_keys).encode(),
    }
    network = _yaml_text(cloud_init.get("network_config"), "cloud_init.network_config")
    if network is not None:
        files["network-config"] = network.encode()
    return files


def nocloud_iso(files):
    """An ISO 9660 image with Joliet and Rock Ridge names, volume label ``cidata``."""
    try:
        # imported here: it is the heaviest import of the collection and only a cloud-init seed needs it
        import pycdlib
    except ImportError:
        raise MachineryError("pycdlib is needed to write the cloud-init seed (pip install pycdlib)") from None
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for index, (name, data) in enumerate(sorted(files.items())):
        iso.add_fp(io.BytesIO(data), len(data), "/F%d.;1" % index, rr_name=name, joliet_path="/" + name)
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()
