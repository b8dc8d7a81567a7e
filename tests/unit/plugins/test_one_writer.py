"""Where libvirt is written from (the one-writer issue): every change goes through ``writer.write``
(plugins/module_utils/coordination/writer.py), which checks the run's holds against the store first. This walks the AST of
every file in plugins/ and fails on a call of one of libvirt's write methods anywhere else than the coordination package
(the writer, and the lock volumes that are the fence the writer checks), and on a ``write`` naming a method that
is not one of libvirt's writes.

A name that is also a method of something else (``create``, ``delete``, ``reset``, ``build``) counts too: the
collection's own methods do not use those names (the registry's is ``remove``, a pool context's ``forget_reads``).
"""

import ast
import pathlib
import threading

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import Coordination
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import HoldLost

ROOT = pathlib.Path(__file__).resolve().parents[3]
PLUGINS = ROOT / "plugins"
EXEMPT = ("module_utils/coordination/",)
WRITES = writer.WRITES


def calls(relative, text):
    """(line, what) of every libvirt write made directly, and of every writer.write with an unknown or computed
    method, in one file's source."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr in WRITES and not relative.startswith(EXEMPT):
            found.append((node.lineno, "%s(...) outside the writer" % ast.unparse(node.func)))
        elif node.func.attr == "write" and ast.unparse(node.func.value) == "writer":
            method = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(method, ast.Constant) and method.value in WRITES):
                found.append((node.lineno, "writer.write of %s" % (ast.unparse(method) if method else "nothing")))
            unchecked = [k for k in node.keywords if k.arg == "checked"]
            if unchecked and relative not in ("module_utils/core/storage.py",) and not relative.startswith(EXEMPT):
                found.append((node.lineno, "an unchecked write outside the lock store"))
    return found


def test_every_libvirt_write_goes_through_the_writer():
    found = {}
    total = 0
    for path in sorted(PLUGINS.rglob("*.py")):
        relative = path.relative_to(PLUGINS).as_posix()
        text = path.read_text(encoding="utf-8")
        total += text.count("writer.write(")
        for line, what in calls(relative, text):
            found.setdefault(relative, []).append("%d: %s" % (line, what))
    print("libvirt written through writer.write from %d calls" % total)
    assert found == {}
    assert total > 90  # the walk sees the calls it is about


@pytest.mark.parametrize("source, count", [
    ("dom.destroy()\nvol.delete(0)\nconn.lookupByName('x')\n", 2),
    ("writer.write(dom, 'destroy')\nwriter.write(dom, 'lookupByName', 'x')\nwriter.write(dom, method)\n", 2),
    ("writer.write(vol, 'delete', 0, checked=False)\n", 1),
])
def test_the_walk_finds_a_write(source, count):
    assert len(calls("module_utils/machines/example.py", source)) == count


def test_the_writer_checks_the_holds_before_it_writes_and_writes_nothing_after_one_passed_on():
    class Run:
        def __init__(self, lost):
            self.lost, self.checked = lost, []

        def check_holds(self, before):
            self.checked.append(before)
            if self.lost:
                raise RuntimeError("hold lost before %s" % before)

    class Domain:
        def __init__(self):
            self.calls = []

        def destroy(self):
            self.calls.append("destroy")
            return 0

    dom = Domain()
    before = writer.bind(Run(lost=False))
    try:
        assert writer.write(dom, "destroy") == 0
        assert writer.bound().checked == ["destroy"]
        writer.bind(Run(lost=True))
        with pytest.raises(RuntimeError, match="before stop the machine"):
            writer.write(dom, "destroy", before="stop the machine")
        assert dom.calls == ["destroy"]  # the second was never made
        with pytest.raises(writer.UnknownWrite):
            writer.write(dom, "XMLDesc")
    finally:
        writer.unbind(before)


class Hold:
    """A hold of the run (holds.MachineHold's part the check uses): taken by ``thread``, lost or not."""

    def __init__(self, thread, lost=False):
        self.thread, self.lost, self.checked = thread, lost, 0

    def check(self, before):
        self.checked += 1
        if self.lost:
            raise HoldLost("lost before %s" % before)


class Claim:
    def __init__(self, held):
        self.held = held

    def still_held(self):
        return self.held


def test_a_thread_checks_its_own_holds_and_claims_and_one_that_took_none_checks_all():
    run = Coordination()
    here, other = threading.get_ident(), threading.get_ident() + 1
    mine, theirs = Hold(here), Hold(other, lost=True)
    run.held = {(1, "u", "a"): [mine, 1], (1, "u", "b"): [theirs, 1]}
    run.check_holds("define")  # its own hold is held: the other thread's lost one is that thread's to find
    assert (mine.checked, theirs.checked) == (1, 0)
    run.held = {(1, "u", "b"): [theirs, 1]}
    with pytest.raises(HoldLost, match="before define"):
        run.check_holds("define")  # a thread that took nothing checks every hold of the run
    run.held = {}
    run.admissions.claim_locks[("u", "c")] = (Claim(held=False), here)
    with pytest.raises(HoldLost, match="claim on machine c for its create was taken over"):
        run.check_holds("createXML")
    run.admissions.claim_locks[("u", "c")] = (Claim(held=True), here)
    run.check_holds("createXML")


# named as libvirt-python's classes are: the writer tells a machine's write by its target's class
class virDomain:  # noqa: N801  # pylint: disable=invalid-name
    def __init__(self, name):
        self._name, self.calls = name, []

    def name(self):
        return self._name

    def destroy(self):
        self.calls.append("destroy")
        return 0


class virDomainSnapshot:  # noqa: N801  # pylint: disable=invalid-name
    def __init__(self, dom):
        self.dom, self.calls = dom, []

    def getDomain(self):  # noqa: N802
        return self.dom

    def delete(self, _flags):
        self.calls.append("delete")


class virConnect:  # noqa: N801  # pylint: disable=invalid-name
    def __init__(self):
        self.calls = []

    def defineXML(self, xml):  # noqa: N802
        self.calls.append(xml)


class virStoragePool:  # noqa: N801  # pylint: disable=invalid-name
    def __init__(self):
        self.calls = []

    def createXML(self, xml, _flags):  # noqa: N802
        self.calls.append(xml)


def test_a_write_to_a_machine_the_run_does_not_hold_is_refused_as_a_bug_and_made_nowhere():
    run = Coordination()
    here = threading.get_ident()
    run.held = {(1, "qemu:///a", "web"): [Hold(here), 1], (0, "qemu:///a", "set.web"): [Hold(here), 1]}
    run.admissions.claim_locks[("qemu:///a", "new")] = (Claim(held=True), here)
    run.admissions.unlocked_claims.add(("qemu:///b", "plain"))
    held, other, conn, pool = virDomain("web"), virDomain("db"), virConnect(), virStoragePool()
    before = writer.bind(run)
    try:
        assert writer.write(held, "destroy") == 0  # held
        writer.write(virDomainSnapshot(held), "delete", 0)
        writer.write(conn, "defineXML", "<domain type='qemu'><name>new</name><uuid>x</uuid></domain>")  # claimed
        writer.write(conn, "defineXML", "<domain><name>plain</name></domain>")  # claimed on a pool with no registry
        writer.write(pool, "createXML", "<volume><name>db-root.qcow2</name></volume>", 0)  # a volume: no machine
        for target, method, args in ((other, "destroy", ()), (virDomainSnapshot(other), "delete", (0,)),
                                     (conn, "defineXML", ("<domain><name>db</name></domain>",))):
            with pytest.raises(writer.UnheldWrite, match="bug: %s of machine db by a run that holds no hold" % method):
                writer.write(target, method, *args)
        # a set's hold is not its members'
        with pytest.raises(writer.UnheldWrite):
            writer.write(virDomain("set.web"), "destroy")
    finally:
        writer.unbind(before)
    assert other.calls == [] and held.calls == ["destroy"] and len(conn.calls) == 2
    assert writer.machine_of(other, "destroy", ()) == "db"
    assert writer.machine_of(pool, "createXML", ("<volume><name>x</name></volume>", 0)) is None


def test_a_stop_hook_names_a_method_or_a_method_and_what_its_first_argument_holds():
    xml = "<volume><name>web-data.luks</name></volume>"
    assert writer.stops_before("createXMLFrom", "createXMLFrom", (xml, None, 0))
    assert writer.stops_before("createXMLFrom:web-data.luks", "createXMLFrom", (xml, None, 0))
    assert not writer.stops_before("createXMLFrom:set-web.3.json", "createXMLFrom", (xml, None, 0))
    assert not writer.stops_before("createXML:web-data.luks", "createXMLFrom", (xml, None, 0))
    assert not writer.stops_before(None, "createXMLFrom", (xml,))
    assert not writer.stops_before("destroy:web", "destroy", ())
