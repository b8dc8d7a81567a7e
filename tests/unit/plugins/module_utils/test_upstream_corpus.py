"""A corpus of the upstream projects' sample shapes (issue 39), each read, linked and checked through the cores
as check mode does (engine.check_documents), with the outcome each must have: applicable, or refused naming the
field and why. The documents are written here in the shape of these upstream files:

- openshift/installer pkg/asset/machines/libvirt/machinesets.go (3c28bc3c) and machines.go (d9f0702e): the
  libvirt MachineSet and Machine with the worker-user-data Secret;
- openshift/cluster-api-provider-libvirt examples/machine-with-userdata.yml (a336f0b5): cloudInit, under its
  original cluster.k8s.io/v1alpha1 group and under machine.openshift.io/v1beta1;
- openshift/machine-api-operator install/0000_30_machine-api-operator_13_machinehealthcheck.yaml (6afce911);
  the worker health check of OpenShift's documentation (machine_management/deploying-machine-health-checks);
- ironcore-dev/ironcore config/samples/compute_v1alpha1_machine.yaml, compute_v1alpha1_machineclass.yaml,
  e2e/bases/machine-with-ephemeral-resources/machine.yaml, e2e/bases/machine-with-nonephemeral-resources/
  (machine.yaml, volume.yaml, networkinterface.yaml) and e2e/bases/ignition/ignition-secret.yaml (0b3fd712);
- ironcore-dev/libvirt-provider's GPU machine class (nvidia.com/gpu capability, a17b53b).
The integration tests test_33 to test_35 apply the applicable ones on the lab.
"""

import pytest
import yaml

from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine

IGNITION_SECRET = """
apiVersion: v1
kind: Secret
metadata: {name: ignition, creationTimestamp: null}
data:
  ignition.yaml: eyJpZ25pdGlvbiI6eyJ2ZXJzaW9uIjoiMy4zLjAifX0=
"""
WORKER_SECRET = """
apiVersion: v1
kind: Secret
metadata: {name: worker-user-data, namespace: openshift-machine-api}
type: Opaque
stringData:
  disableTemplating: "true"
  userData: '{"ignition":{"config":{"merge":[{"source":"https://api-int.c1.example.com:22623/config/worker"}]},"version":"3.2.0"}}'
"""
PROVIDER = """
        value:
          apiVersion: libvirtproviderconfig.openshift.io/v1beta1
          kind: LibvirtMachineProviderConfig
          domainMemory: 8192
          domainVcpu: 4
          ignition: {userDataSecret: worker-user-data}
          volume: {poolName: machinery, baseVolumeID: c1-x7k2p-base}
          networkInterfaceName: machinery
          networkInterfaceAddress: 192.168.126.0/24
          autostart: false
"""
CORPUS = {
    "installer-machineset": (WORKER_SECRET + "---" + """
apiVersion: machine.openshift.io/v1beta1
kind: MachineSet
metadata:
  name: c1-x7k2p-worker-0
  namespace: openshift-machine-api
  labels: {machine.openshift.io/cluster-api-cluster: c1-x7k2p, machine.openshift.io/cluster-api-machine-role: worker,
           machine.openshift.io/cluster-api-machine-type: worker}
spec:
  replicas: 2
  selector:
    matchLabels: {machine.openshift.io/cluster-api-machineset: c1-x7k2p-worker-0,
                  machine.openshift.io/cluster-api-cluster: c1-x7k2p}
  template:
    metadata:
      labels: {machine.openshift.io/cluster-api-machineset: c1-x7k2p-worker-0,
               machine.openshift.io/cluster-api-cluster: c1-x7k2p,
               machine.openshift.io/cluster-api-machine-role: worker, machine.openshift.io/cluster-api-machine-type: worker}
    spec:
      providerSpec:""" + PROVIDER, []),
    "installer-machine": (WORKER_SECRET + "---" + """
apiVersion: machine.openshift.io/v1beta1
kind: Machine
metadata:
  name: c1-x7k2p-master-0
  namespace: openshift-machine-api
  labels: {machine.openshift.io/cluster-api-cluster: c1-x7k2p, machine.openshift.io/cluster-api-machine-role: master}
spec:
  providerSpec:""" + PROVIDER.replace("        ", "    "), []),
    "provider-example-old-group": ("""
apiVersion: cluster.k8s.io/v1alpha1
kind: Machine
metadata: {name: worker-example, namespace: test, generateName: vs-worker-}
spec:
  providerSpec:
    value:
      apiVersion: libvirtproviderconfig.k8s.io/v1alpha1
      kind: LibvirtMachineProviderConfig
      domainMemory: 2048
      domainVcpu: 2
      cloudInit: {sshAccess: true, userDataSecret: libvirt-actuator-user-data-secret}
      volume: {poolName: default, baseVolumeID: fedora_base}
      networkInterfaceName: default
      networkInterfaceAddress: 192.168.122.0/24
      autostart: false
      uri: qemu+ssh://root@147.75.96.109/system
""", ["Machine/worker-example: apiVersion: unknown apiVersion 'cluster.k8s.io/v1alpha1'"]),
    "provider-example": ("""
apiVersion: v1
kind: Secret
metadata: {name: libvirt-actuator-user-data-secret}
stringData: {userData: "echo hello"}
---
apiVersion: machine.openshift.io/v1beta1
kind: Machine
metadata: {name: worker-example, namespace: test, generateName: vs-worker-}
spec:
  providerSpec:
    value:
      apiVersion: libvirtproviderconfig.k8s.io/v1alpha1
      kind: LibvirtMachineProviderConfig
      domainMemory: 2048
      domainVcpu: 2
      cloudInit: {sshAccess: true, userDataSecret: libvirt-actuator-user-data-secret}
      volume: {poolName: default, baseVolumeID: fedora_base}
      networkInterfaceName: default
      networkInterfaceAddress: 192.168.122.0/24
      autostart: false
""", []),
    "mao-shipped-health-check": ("""
apiVersion: machine.openshift.io/v1beta1
kind: MachineHealthCheck
metadata:
  name: machine-api-termination-handler
  namespace: openshift-machine-api
  labels: {api: clsuterapi, k8s-app: termination-handler}
  annotations: {include.release.openshift.io/self-managed-high-availability: "true"}
spec:
  selector:
    matchLabels: {machine.openshift.io/interruptible-instance: ""}
  maxUnhealthy: 100%
  nodeStartupTimeout: "0"
  unhealthyConditions:
  - {type: Terminating, status: "True", timeout: 0s}
""", []),
    "openshift-docs-health-check": ("""
apiVersion: machine.openshift.io/v1beta1
kind: MachineHealthCheck
metadata: {name: example, namespace: openshift-machine-api}
spec:
  selector:
    matchLabels: {machine.openshift.io/cluster-api-machine-role: worker,
                  machine.openshift.io/cluster-api-machine-type: worker,
                  machine.openshift.io/cluster-api-machineset: c1-worker-us-east-1a}
  unhealthyConditions:
  - {type: "Ready", timeout: "300s", status: "False"}
  - {type: "Ready", timeout: "300s", status: "Unknown"}
  maxUnhealthy: "40%"
  nodeStartupTimeout: "10m"
""", []),
    "ironcore-samples": ("""
apiVersion: compute.ironcore.dev/v1alpha1
kind: MachineClass
metadata: {name: machineclass-sample}
capabilities: {cpu: 4, memory: 16Gi}
---
apiVersion: storage.ironcore.dev/v1alpha1
kind: Volume
metadata: {name: my-volume}
spec:
  resources: {storage: 10Gi}
---
apiVersion: v1
kind: Secret
metadata: {name: my-ignition-secret}
data: {ignition.yaml: eyJpZ25pdGlvbiI6eyJ2ZXJzaW9uIjoiMy4zLjAifX0=}
---
apiVersion: compute.ironcore.dev/v1alpha1
kind: Machine
metadata: {name: machine-sample}
spec:
  machineClassRef: {name: machineclass-sample}
  volumes:
    - name: rootdisk
      volumeRef: {name: my-volume}
  ignitionRef: {name: my-ignition-secret}
""", []),
    "ironcore-e2e-ephemeral": (IGNITION_SECRET + "---" + """
apiVersion: compute.ironcore.dev/v1alpha1
kind: Machine
metadata: {name: machine-sample}
spec:
  machineClassRef: {name: small}
  ignitionRef: {name: ignition, key: ignition.yaml}
  networkInterfaces:
  - name: primary
    ephemeral:
      networkInterfaceTemplate:
        spec:
          ipFamilies: [IPv4]
          ips: [{value: 10.0.0.12}]
          networkRef: {name: network-sample}
          virtualIP:
            ephemeral:
              virtualIPTemplate:
                spec: {type: Public, ipFamily: IPv4}
  volumes:
  - name: root-disk
    ephemeral:
      volumeTemplate:
        spec:
          volumeClassRef: {name: volumeclass-sample}
          resources: {storage: 10Gi}
          dataSource:
            osImage: {image: "gardenlinux:rootfs-image"}
""", ["spec.networkInterfaces[0].ephemeral.networkInterfaceTemplate.spec.networkRef.name: no libvirt network "
      "'network-sample'"]),
    # the e2e Machines' image on a pool that has their network: read as IronCore's puller reads it, and looked up
    # in its registry by check mode (which unit tests never reach)
    "ironcore-e2e-image": ("""
apiVersion: compute.ironcore.dev/v1alpha1
kind: Machine
metadata: {name: machine-sample}
spec:
  machineClassRef: {name: small}
  image: gardenlinux:rootfs-image
  networkInterfaces:
  - name: primary
    ephemeral:
      networkInterfaceTemplate:
        spec: {networkRef: {name: machinery}}
---
apiVersion: storage.ironcore.dev/v1alpha1
kind: Volume
metadata: {name: volume-sample}
spec:
  resources: {storage: 10Gi}
  image: gardenlinux:rootfs-image
""", ["Machine/machine-sample: spec.image: the OCI image docker.io/library/gardenlinux:rootfs-image cannot be "
      "resolved: cannot reach https://registry-1.docker.io",
      "Volume/volume-sample: spec.image: the OCI image docker.io/library/gardenlinux:rootfs-image cannot be "
      "resolved"]),
    "ironcore-e2e-nonephemeral": (IGNITION_SECRET + "---" + """
apiVersion: storage.ironcore.dev/v1alpha1
kind: Volume
metadata: {name: volume-sample}
spec:
  volumeClassRef: {name: volumeclass-sample}
  resources: {storage: 10Gi}
  dataSource:
    osImage: {image: my-image}
---
apiVersion: networking.ironcore.dev/v1alpha1
kind: NetworkInterface
metadata: {name: networkinterface-sample}
spec:
  networkRef: {name: machinery}
  ipFamilies: [IPv4]
  ips: [{value: 10.0.0.1}]
  virtualIP:
    virtualIPRef: {name: virtualip-sample}
---
apiVersion: compute.ironcore.dev/v1alpha1
kind: Machine
metadata: {name: machine-sample}
spec:
  machineClassRef: {name: small}
  volumes:
    - name: rootdisk
      volumeRef: {name: volume-sample}
  ignitionRef: {name: ignition, key: ignition.yaml}
  networkInterfaces:
    - name: primary
      networkInterfaceRef: {name: networkinterface-sample}
""", []),
    "libvirt-provider-gpu-class": ("""
apiVersion: compute.ironcore.dev/v1alpha1
kind: MachineClass
metadata: {name: x3-xlarge-gpu}
capabilities: {cpu: 4, memory: 8Gi, nvidia.com/gpu: "1"}
""", ["MachineClass/x3-xlarge-gpu: capabilities.nvidia.com/gpu: a libvirt machine here is sized by cpu and memory"]),
}


class Pools:
    """What check mode reads of the pools: one pool with class small, network machinery, image my-image."""

    def __init__(self):
        self.snapshots = [{"name": "pool1", "uri": "qemu:///system", "classes": {"small": {}}}]
        self.by_name = {"pool1": self.snapshots[0]}
        self.volumes = {"pool1": set()}
        self.images = {"pool1": {"my-image": {}}}

    def class_on(self, name):
        return ["pool1"] if name == "small" else []

    def volume_on(self, name):
        return []

    def networks_of(self, pool):
        return {"machinery", "default"}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_upstream_sample_is_applicable_or_refused_with_its_reason(name):
    text, refusals = CORPUS[name]
    documents = [("%s#%d" % (name, index), doc) for index, doc in enumerate(yaml.safe_load_all(text)) if doc]
    if not refusals:
        objects, _warnings = engine.check_documents(documents, Pools())
        assert objects
        return
    with pytest.raises(docs.ManifestError) as info:
        engine.check_documents(documents, Pools())
    said = "\n".join(info.value.problems)
    for refusal in refusals:
        assert refusal in said, (refusal, said)
