"""Where libvirt is written from (the one-writer issue): every call of one of libvirt's write methods in plugins/,
outside the coordination package, found by walking the AST.

The goal is none: every write made by one writer in plugins/module_utils/coordination/ that checks the run's
holds before it. Until the calls are moved there, ``one_writer_baseline.json`` lists how many each file makes
today, and this test fails when a file makes more or a new file makes any: the count only goes down. A name
that is also a method of something else (``create``, ``delete``, ``reset``) is counted too; a call that is not
libvirt's stays in the baseline until its file is rid of the name.
"""

import ast
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]
PLUGINS = ROOT / "plugins"
WRITER = "module_utils/coordination/"
BASELINE = pathlib.Path(__file__).with_name("one_writer_baseline.json")

# libvirt-python's methods that change a domain, a device, a snapshot, a block job, a migration, a storage volume
# or pool, a network, an nwfilter or a secret
WRITES = frozenset("""
create createWithFlags createXML createXMLFrom createXMLWithFiles defineXML defineXMLFlags undefine undefineFlags
destroy destroyFlags shutdown shutdownFlags reboot reset suspend resume managedSave managedSaveRemove save saveFlags
restore restoreFlags coreDump coreDumpWithFormat attachDevice attachDeviceFlags detachDevice detachDeviceFlags
updateDeviceFlags setMetadata setAutostart setMemory setMemoryFlags setMaxMemory setMemoryStatsPeriod setVcpus
setVcpusFlags setGuestVcpus pinVcpu pinVcpuFlags pinEmulator setIOThreadParams setSchedulerParameters
setSchedulerParametersFlags setBlkioParameters setBlockIoTune setInterfaceParameters setNumaParameters setPerfEvents
setUserPassword setTime injectNMI sendKey abortJob blockCommit blockCopy blockJobAbort blockPull blockRebase
blockResize snapshotCreateXML revertToSnapshot checkpointCreateXML backupBegin migrate migrate2 migrate3
migrateToURI migrateToURI2 migrateToURI3 migrateSetMaxSpeed migrateSetMaxDowntime migrateStartPostCopy
migrateSetCompressionCache networkDefineXML networkCreateXML nwfilterDefineXML nwfilterBindingCreateXML
secretDefineXML storagePoolDefineXML storagePoolCreateXML build wipe wipePattern resize upload setValue delete
""".split())


def writes_by_file():
    """{file under plugins/: number of write calls} outside the writer's package."""
    found = {}
    for path in sorted(PLUGINS.rglob("*.py")):
        relative = path.relative_to(PLUGINS).as_posix()
        if relative.startswith(WRITER):
            continue
        calls = sum(1 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in WRITES)
        if calls:
            found[relative] = calls
    return found


def test_no_file_writes_libvirt_more_than_it_did():
    found = writes_by_file()
    baseline = json.loads(BASELINE.read_text(encoding="utf-8"))
    grown = {name: (count, baseline.get(name, 0)) for name, count in found.items() if count > baseline.get(name, 0)}
    print("libvirt written from %d places in %d files outside the writer" % (sum(found.values()), len(found)))
    assert grown == {}, "writes added outside plugins/%s (now, allowed): %s" % (WRITER, grown)


def test_the_baseline_names_no_file_that_writes_less():
    """A file rid of calls has its count lowered here, so the count cannot creep back."""
    found = writes_by_file()
    baseline = json.loads(BASELINE.read_text(encoding="utf-8"))
    assert {name: count for name, count in baseline.items() if found.get(name, 0) < count} == {}


def test_the_walk_finds_a_write():
    tree = ast.parse("dom.destroy()\nvol.delete(0)\nconn.lookupByName('x')\n")
    assert sum(1 for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in WRITES) == 2
