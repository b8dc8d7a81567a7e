# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one writer of libvirt: every change the collection makes to a domain, a device, a snapshot, a block job, a
migration, a storage pool or volume, a network, an nwfilter or a secret is made by ``write`` (docs/concurrency.md,
"One writer").

Before each write it checks the holds of the run bound to this process (``bind``; the module base binds its
run's Coordination). A write that changes a machine (a domain, a snapshot of it, a definition or start of it from
its XML) is refused with UnheldWrite unless the run holds that machine, or claimed it for its create: a path that
forgot to declare its holds is a bug, said as such, and writes nothing (``covers``). Then a hold that another run
took over (this run was paused past its lease) stops the write with
HoldLost, and nothing is written. The check reads the lock's generations from the store at that moment (the
fence, coordination/locks.py VolumeLock.still_held), so a paused run that wakes up writes nothing after its holds
passed on, on whichever call it wakes. The lock volumes themselves are written by the coordination package's
store (coordination/volumes.py PoolStore), which is the fence and is not checked against itself; a lock volume
deleted through core/storage.py passes ``checked=False``.

A leaf: it imports nothing of the collection, so core/storage.py and core/connection.py write through it too (the
one import of coordination that core makes, tests/unit/plugins/test_layout.py). tests/unit/plugins/test_one_writer.py
walks plugins/ and fails on any call of a name in WRITES outside coordination/."""

from __future__ import annotations

import os
import re
import signal

# libvirt-python's methods that change something
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

# For the lab tests: a run whose environment names one of WRITES here stops itself (SIGSTOP) right before its first
# write of that method, before the writer checks its holds: inside a step whose holds converge checked already. The
# test learns it stopped from waitpid (WUNTRACED), lets the hold pass on, and continues it. "method:text" stops
# before the first write of that method whose first argument holds ``text`` (a volume's name in the XML it is
# created from: one copy among a run's other copies and document commits). Unset, nothing stops.
STOP_BEFORE_WRITE_ENV = "MACHINERY_STOP_BEFORE_WRITE"

_process = [None]  # the run bound for the whole process: its worker threads write under its holds too


# the writes of a connection whose object is the domain its XML names (a storage pool's createXML is a volume's)
_DOMAIN_FROM_XML = frozenset(("defineXML", "defineXMLFlags", "createXML", "createXMLWithFiles"))
_NAME = re.compile(r"<name>\s*([^<\s]+)\s*</name>")


class UnknownWrite(Exception):
    """A call of ``write`` with a method that is not one of libvirt's writes (a bug in the collection)."""


class UnheldWrite(Exception):
    """A write to a machine that the run bound to the process does not hold (a bug in the collection: the path
    did not declare the hold). Nothing was written."""


def machine_of(target, method, args):
    """The name of the machine a write changes, or None for a write to something else (a volume, a network, a
    storage pool, a secret). Read from the objects libvirt-python gave (a domain's name is kept in its handle, a
    snapshot's domain in the snapshot's) or from the XML a domain is defined from: no call to libvirt."""
    kind = type(target).__name__
    if kind == "virDomain":
        return target.name()
    if kind == "virDomainSnapshot":
        return target.getDomain().name()
    if kind == "virConnect" and method in _DOMAIN_FROM_XML and args and isinstance(args[0], str):
        found = _NAME.search(args[0])
        return found.group(1) if found else None
    return None


def bind(run):
    """Bind ``run`` (a holds.Coordination, or anything with ``check_holds(before)``) to this process: every write
    from now on checks its holds. Returns the run bound before, for ``unbind``."""
    before = _process[0]
    _process[0] = run
    return before


def unbind(before=None):
    _process[0] = before


def bound():
    """The run whose holds a write checks now, or None (a test, the lab: nothing to check)."""
    return _process[0]


def stops_before(asked, method, args):
    """Whether STOP_BEFORE_WRITE_ENV's value ``asked`` ("method" or "method:text") names this write."""
    if not asked:
        return False
    wanted, _colon, text = asked.partition(":")
    return wanted == method and (not text or bool(args) and text in str(args[0]))


def write(target, method, *args, before=None, checked=True):
    """``target.method(*args)`` (a libvirt object and one of its WRITES), once the bound run's holds were checked.
    ``before`` names the write in a HoldLost message (default: the method). ``checked=False`` only for the
    coordination package's own lock volumes (a run lets its holds go even when they passed on)."""
    if method not in WRITES:
        raise UnknownWrite("%s is not one of libvirt's writes: this is a bug in machinery.compute" % method)
    if stops_before(os.environ.get(STOP_BEFORE_WRITE_ENV), method, args):
        del os.environ[STOP_BEFORE_WRITE_ENV]  # once
        os.kill(os.getpid(), signal.SIGSTOP)
    run = bound() if checked else None
    if run is not None:
        covers = getattr(run, "covers", None)
        machine = machine_of(target, method, args) if covers is not None else None
        if machine is not None and not covers(machine):
            raise UnheldWrite("machinery.compute bug: %s of machine %s by a run that holds no hold or claim on it; "
                              "nothing was written. Every path that changes a machine declares its hold "
                              "(docs/concurrency.md, \"One writer\"): please report this" % (before or method, machine))
        run.check_holds(before or method)
    return getattr(target, method)(*args)
