# Sphinx configuration of the collection's documentation site, built by `make docs` (docs/docsite/build.sh).
# It builds offline: no intersphinx inventories are fetched, and references that would need them are not made.

project = "machinery.compute"
copyright = "contributors to machinery.compute"  # pylint: disable=redefined-builtin
title = "machinery.compute"
html_short_title = "machinery.compute"

extensions = ["sphinx_antsibull_ext", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# The guides' headings become anchors, so a page can link to a section of another one.
myst_heading_anchors = 3

pygments_style = "ansible"
highlight_language = "YAML+Jinja"

html_theme = "sphinx_ansible_theme"
html_show_sphinx = False
html_use_smartypants = True
html_use_modindex = False
html_use_index = False
html_copy_source = False
html_theme_options = {"display_version": False}

default_role = "any"
nitpicky = True

# The plugin pages refer to a few pages of Ansible's own documentation. Online sites resolve them with intersphinx;
# this site stays offline and links them to their published addresses instead.
ANSIBLE_DOCS = "https://docs.ansible.com/ansible/latest/"
ANSIBLE_LABELS = {
    "common_return_values": "reference_appendices/common_return_values.html",
    "ansible_configuration_settings": "reference_appendices/config.html",
}


def _ansible_reference(_app, _env, node, contnode):
    """A link to Ansible's documentation for a reference to one of its labels or configuration variables."""
    from docutils import nodes  # pylint: disable=import-outside-toplevel

    target = node.get("reftarget", "")
    if node.get("reftype") in ("ref", "any") and target in ANSIBLE_LABELS:
        uri = ANSIBLE_DOCS + ANSIBLE_LABELS[target]
    elif node.get("reftype") in ("envvar", "any") and target.startswith("ANSIBLE_"):
        uri = ANSIBLE_DOCS + "reference_appendices/config.html#envvar-" + target
    else:
        return None
    reference = nodes.reference("", "", internal=False, refuri=uri)
    reference.append(contnode)
    return reference


def setup(app):
    app.connect("missing-reference", _ansible_reference)
