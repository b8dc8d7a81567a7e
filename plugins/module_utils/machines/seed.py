# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Boot configuration: the Ignition document and the NoCloud ``cidata`` ISO, built in memory (no binaries)."""

from __future__ import annotations

import io
import json

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError

try:
    import yaml
    HAS_YAML = True
except ImportError:
    yaml = None
    HAS_YAML = False


def ignition_document(ignition, ssh_keys=None, field="ignition", hostname=None):
    """Ignition as compact JSON bytes; a string must already be JSON. SSH keys go to the ``core`` user; a
    ``hostname`` becomes /etc/hostname (unless the config writes that file itself)."""
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
    if hostname:
        ignition = json.loads(json.dumps(ignition))
        files = ignition.setdefault("storage", {}).setdefault("files", [])
        if not any(isinstance(entry, dict) and entry.get("path") == "/etc/hostname" for entry in files):
            files.append({"path": "/etc/hostname", "mode": 420, "overwrite": True,
                          "contents": {"source": "data:,%s" % hostname}})
    return json.dumps(ignition, sort_keys=True, separators=(",", ":")).encode()


def _require_yaml():
    if not HAS_YAML:
        raise MachineryError("PyYAML is needed to write cloud-init data (pip install PyYAML)")


def user_data_text(user_data, ssh_keys=None, field="cloud_init.user_data"):
    """user-data as text. A mapping becomes #cloud-config; SSH keys are merged into a cloud-config."""
    if user_data is None:
        user_data = {}
    if isinstance(user_data, str):
        if not user_data.lstrip().startswith("#cloud-config"):
            if ssh_keys:
                raise ValidationError("ssh_authorized_keys can only be merged into #cloud-config user-data, not "
                                      "into a script; put the keys into the script yourself", field)
            return user_data  # a script, an #include or a MIME multipart: cloud-init's to interpret
        parsed = parsed_mapping(user_data, field, "#cloud-config user-data")
        if not ssh_keys:
            return user_data
        user_data = parsed
    if not isinstance(user_data, dict):
        raise ValidationError("must be a string or a mapping", field)
    _require_yaml()
    data = dict(user_data)
    if ssh_keys:
        keys = list(data.get("ssh_authorized_keys") or [])
        keys.extend(key for key in ssh_keys if key not in keys)
        data["ssh_authorized_keys"] = keys
    return "#cloud-config\n" + yaml.safe_dump(data, default_flow_style=False, sort_keys=True)


def parsed_mapping(text, field, what):
    """The YAML mapping ``text`` holds ({} when it is empty). A syntax error is reported by line and column and
    never quotes the text: user-data is secret."""
    _require_yaml()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = " at line %d, column %d" % (mark.line + 1, mark.column + 1) if mark is not None else ""
        raise ValidationError("is not valid YAML%s: %s" % (where, getattr(exc, "problem", None) or "syntax error"),
                              field) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValidationError("must be %s: a YAML mapping, got a %s" % (what, type(data).__name__), field)
    return data


def _yaml_text(value, field):
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise ValidationError("must be a string or a mapping", field)
    _require_yaml()
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True)


NETWORK_V2_SECTIONS = ("ethernets", "bonds", "bridges", "vlans", "wifis")


def check_network_config(config, field="cloud_init.network_config"):
    """cloud-init network configuration: version 1 (a ``config`` list) or version 2 (netplan sections), also
    when wrapped in a top-level ``network`` key as cloud-init accepts it."""
    if isinstance(config, str):
        config = parsed_mapping(config, field, "a network configuration")
    if not isinstance(config, dict):
        raise ValidationError("must be a string or a mapping", field)
    if set(config) == {"network"} and isinstance(config["network"], dict):
        config = config["network"]
    version = config.get("version")
    if isinstance(version, bool) or version not in (1, 2):
        raise ValidationError("must be 1 or 2 (cloud-init's network config versions), got %r" % (version,),
                              field + ".version")
    if version == 1 and not isinstance(config.get("config"), list):
        raise ValidationError("version 1 needs config: a list of interfaces, routes and name servers",
                              field + ".config")
    for section in NETWORK_V2_SECTIONS if version == 2 else ():
        if config.get(section) is not None and not isinstance(config[section], dict):
            raise ValidationError("must be a mapping of device names to their settings", "%s.%s" % (field, section))
    return config


def nocloud_files(name, cloud_init, ssh_keys=None, hostname=None):
    """{file name: bytes} of the NoCloud seed for machine ``name``; meta-data and network-config are checked as
    cloud-init will read them, so a seed the guest cannot use is refused before anything is written. The guest's
    ``local-hostname`` is ``hostname``, else the machine's name (meta_data given as a mapping may set it)."""
    cloud_init = cloud_init or {}
    meta = cloud_init.get("meta_data")
    if isinstance(meta, str):
        parsed_mapping(meta, "cloud_init.meta_data", "meta-data")
        if hostname:
            raise ValidationError("cannot be merged into meta_data given as text; set local-hostname there, or give "
                                  "meta_data as a mapping", "hostname")
        meta_text = meta
    else:
        if meta is not None and not isinstance(meta, dict):
            raise ValidationError("must be a string or a mapping", "cloud_init.meta_data")
        merged = {"instance-id": instance_id(name), "local-hostname": hostname or name}
        merged.update(meta or {})
        meta_text = _yaml_text(merged, "cloud_init.meta_data")
    files = {
        "meta-data": meta_text.encode(),
        "user-data": user_data_text(cloud_init.get("user_data"), ssh_keys).encode(),
    }
    if cloud_init.get("network_config") is not None:
        check_network_config(cloud_init["network_config"])
    network = _yaml_text(cloud_init.get("network_config"), "cloud_init.network_config")
    if network is not None:
        files["network-config"] = network.encode()
    return files


def instance_id(name, generation=0):
    """The instance id the collection gives machine ``name``: a rebuild (``generation`` 1, 2, ...) gets a new one,
    so cloud-init in the new root takes the seed as a new instance's."""
    return "iid-%s" % name if not generation else "iid-%s.r%d" % (name, generation)


def with_generation(files, name, generation):
    """The seed ``files`` ({file name: bytes}) with the instance id of ``generation``. Only an instance id the
    collection gave is replaced: one the user set in meta_data is the user's, and is kept as it is."""
    meta = files.get("meta-data")
    if meta is None:
        return dict(files)
    data = parsed_mapping(meta.decode(), "cloud_init.meta_data", "meta-data")
    current = str(data.get("instance-id") or "")
    if current != instance_id(name) and not current.startswith(instance_id(name) + ".r"):
        return dict(files)
    wanted = instance_id(name, generation)
    if current == wanted:
        return dict(files)
    data["instance-id"] = wanted
    return dict(files, **{"meta-data": _yaml_text(data, "cloud_init.meta_data").encode()})


def read_nocloud_iso(data):
    """{file name: bytes} of a NoCloud ISO that ``nocloud_iso`` wrote (a rebuild gives its seed again)."""
    try:
        import pycdlib
    except ImportError:
        raise MachineryError("pycdlib is needed to read the cloud-init seed (pip install pycdlib)") from None
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    files = {}
    try:
        for child in iso.list_children(rr_path="/"):
            if child.is_dot() or child.is_dotdot() or not child.is_file():
                continue
            name = child.rock_ridge.name().decode()
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, rr_path="/" + name)
            files[name] = out.getvalue()
    finally:
        iso.close()
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
