"""Milli-CPU machines and classes (issue 50): whole multiples of 1000m are vCPUs, as every integer ever was; a
fraction is the vCPUs it rounds up to with a CFS quota of the domain, counted by capacity and the scheduler as the
fraction it is."""

from __future__ import annotations

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity, scheduler

from conftest import FakeDomain, pool_snapshot

GIB = 2 ** 30


@pytest.mark.parametrize("given, cpu", [
    (2, 2), ("2", 2), ("2000m", 2), ("2.0", 2), ("1000m", 1), (256, 256),
    ("500m", 0.5), ("0.5", 0.5), (0.5, 0.5), ("1.5", 1.5), ("1500m", 1.5), ("10m", 0.01), ("2333m", 2.333),
])
def test_cpu_is_whole_vcpus_or_a_fraction(given, cpu):
    found = check.cpu_amount(given, "cpu")
    assert found == cpu and type(found) is type(cpu)


@pytest.mark.parametrize("given, said", [
    (0, "between 1 and 256"), ("0m", "between 1 and 256"), (257, "between 1 and 256"), ("5m", "between 10m and 256"),
    ("256500m", "between 10m and 256"), ("0.0005", "finer than a millicore"), ("two", "must be a number of CPUs"),
    (True, "must be a number of CPUs"), ("-500m", "between 10m and 256"), ("1e400", "between 1 and 256"),
])
def test_cpu_out_of_range_or_no_number_is_refused_naming_the_field(given, said):
    with pytest.raises(ValidationError) as info:
        check.cpu_amount(given, "spec.cpu")
    assert info.value.field == "spec.cpu" and said in info.value.message, info.value.message


@pytest.mark.parametrize("number", [1, 2, 7, 64, 256, "3"])
def test_every_whole_number_reads_as_it_always_did(number):
    assert check.cpu_amount(number) == check.cpu_count(number)
    assert isinstance(check.cpu_amount(number), int)


def test_vcpus_and_text():
    assert [check.vcpus(cpu) for cpu in (0.5, 1, 1.5, 2, 0.01)] == [1, 1, 2, 2, 1]
    assert [check.cpu_text(cpu) for cpu in (0.5, 2, 1.5, 2.0)] == ["500m", "2", "1500m", "2"]


def domain(cpu):
    tree = dx.parse("<domain type='kvm'><name>m</name><vcpu placement='static'>1</vcpu></domain>")
    record = {"spec": {}}
    dx.write_cpu(tree, record, cpu)
    return tree, record


@pytest.mark.parametrize("cpu, vcpus, quota", [(0.5, 1, 50000), (1.5, 2, 150000), (0.01, 1, 1000),
                                               (2.333, 3, 233300)])
def test_a_fraction_is_a_cfs_quota_of_the_domain_on_the_vcpus_it_rounds_up_to(cpu, vcpus, quota):
    tree, record = domain(cpu)
    assert tree.findtext("vcpu") == str(vcpus)
    assert tree.findtext("cputune/global_period") == "100000"
    assert tree.findtext("cputune/global_quota") == str(quota)
    assert dx.read_cpu(tree) == cpu and record["spec"]["cpu"] == cpu


def test_a_whole_number_writes_no_quota_and_takes_back_the_fractions():
    whole, _record = domain(2)
    assert whole.find("cputune") is None and whole.findtext("vcpu") == "2" and dx.read_cpu(whole) == 2
    tree, record = domain(0.5)  # resized to a whole number: the quota goes, other tunings stay
    tune = tree.find("cputune")
    tune.append(dx.parse("<shares>2048</shares>"))
    dx.write_cpu(tree, record, 2)
    assert tree.findtext("vcpu") == "2" and tree.find("cputune/global_quota") is None
    assert tree.findtext("cputune/shares") == "2048" and dx.read_cpu(tree) == 2
    again, record = domain(0.5)
    dx.write_cpu(again, record, 1)
    assert again.find("cputune") is None and dx.read_cpu(again) == 1


def test_a_quota_of_the_whole_vcpus_or_none_is_whole():
    tree = dx.parse("<domain><vcpu>2</vcpu><cputune><global_period>100000</global_period>"
                    "<global_quota>-1</global_quota></cputune></domain>")
    assert dx.read_cpu(tree) == 2


def test_the_machine_and_class_options_take_millicores():
    machine_cpu = next(option for option in options.MACHINE if option.name == "cpu")
    class_cpu = next(option for option in options.MACHINE_CLASS if option.name == "cpu")
    assert machine_cpu.type == "raw" and class_cpu.type == "raw"


class StatsConn:
    """Domain stats as libvirt gives them: vcpu.current is the vCPU count, whatever the quota."""

    def __init__(self, domains):
        self.domains = domains

    def getAllDomainStats(self, _flags, _flags2=0):  # noqa: N802
        return [(dom, {"vcpu.current": int(dx.parse(dom.xml).findtext("vcpu")), "balloon.maximum": 1024 * 1024})
                for dom in self.domains]


def managed(name, cpu):
    tree, record = domain(cpu)
    record["spec"].update(name=name, machine_class=None, volumes=[], memory=GIB)
    record.update(version=1)
    dx.write_record(tree, record)
    return tree, record


def test_capacity_counts_a_fractional_machine_as_its_fraction():
    tree, record = managed("half", 0.5)
    assert capacity.size_of("half", tree, record).cpu == 0.5
    dom = FakeDomain("half", dx.tostring(tree))
    sizes = capacity.current_sizes(StatsConn([dom]), {dom.UUIDString(): record})
    assert [size.cpu for size in sizes] == [0.5]  # not the one vCPU libvirt's stats count


def test_the_scheduler_places_two_halves_on_one_cpu_and_refuses_a_third():
    pools = [pool_snapshot("a", "qemu:///a", cpu=1, classes={"half": {"cpu": 0.5, "memory": GIB}})]
    specs = [{"name": "m%d" % index, "machine_class": "half"} for index in range(2)]
    assert [found["pool"] for found in scheduler.schedule(specs, pools)] == ["a", "a"]
    with pytest.raises(scheduler.Unschedulable, match="insufficient cpu"):
        scheduler.schedule(specs + [{"name": "m2", "machine_class": "half"}], pools)


def test_a_class_of_a_tenth_fits_ten_times_in_one_cpu():
    assert capacity.class_count({"cpu": 1, "memory": 100 * GIB}, {"cpu": 0.1, "memory": GIB}) == 10


def test_a_machine_takes_millicores_and_its_topology_counts_vcpus():
    from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
    half = machine_spec.params({"name": "m", "cpu": "500m", "memory": "1Gi", "image": "my-image"})
    assert half["cpu"] == 0.5
    whole = machine_spec.params({"name": "m", "cpu": "2000m", "memory": "1Gi", "image": "my-image"})
    assert whole["cpu"] == 2 and isinstance(whole["cpu"], int)
    with pytest.raises(ValidationError) as info:
        machine_spec.params({"name": "m", "cpu": "5m", "memory": "1Gi", "image": "my-image"}, "machines[0]")
    assert info.value.field == "machines[0].cpu"


def test_an_ironcore_class_of_half_a_cpu_is_published_as_half():
    from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
    from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine
    problems = docs.Problems()
    objects = engine.parse([("d", {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "MachineClass",
                                   "metadata": {"name": "half"}, "capabilities": {"cpu": "500m", "memory": "1Gi"}})],
                           problems)
    assert problems.errors == [] and objects[0].data["cpu"] == 0.5
