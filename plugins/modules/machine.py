#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine
short_description: Converge a machine (a libvirt domain) on a pool
description:
  - Creates, updates, starts, stops and deletes one machine on a pool registered with
    M(machinery.compute.machine_pool).
  - The root disk is a thin qcow2 overlay on the image, which is uploaded to the pool once per checksum through
    the libvirt connection. Ignition goes to the guest through fw_cfg (C(opt/com.coreos/config)) from a mode 0600
    volume; cloud-init through a NoCloud C(cidata) ISO on a virtio-scsi cdrom (cloud kernels have no AHCI
    driver). Neither is ever put inline in the domain XML or logged.
  - The machine's record (spec, creation time, restart count) lives in the domain's metadata. Domains without it
    were not created by this collection and are refused unless O(adopt=true).
  - On an existing machine, O(cpu), O(memory), O(machine_class), O(labels) and the boot configuration are
    changed in place (live where libvirt can, otherwise the return says C(restart_required)); a different
    firmware is refused, and a different image too unless O(rebuild=true) gives the machine a new root disk.
  - A resize (a new O(machine_class), O(cpu) or O(memory)) must fit the pool's free capacity, the machine's own
    current size not counted; one that does not is refused naming the option, with nothing changed, unless
    O(allow_move) moves the machine to a pool of O(pools) that fits first. A running
    machine takes memory it can balloon to at once; more memory or another cpu count restarts it in place
    (ACPI power button, forced off after O(shutdown_timeout), then started with its new size). A resize whose
    restart fails puts the machine back as it was, running if it ran, and fails.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
  - machinery.compute.oci_image
seealso:
  - module: machinery.compute.machine_info
    description: List machines and their status, with filters.
  - module: machinery.compute.machine_batch
    description: Converge many machines over many pools in one task.
  - module: machinery.compute.machine_class
    description: Publish the classes that size machines.
  - module: machinery.compute.machine_pool
    description: Register the pool a machine runs on.
  - module: machinery.compute.volume_attach
    description: Attach or detach one disk of a machine.
  - module: machinery.compute.nic_attach
    description: Attach or detach one network interface of a machine.
  - module: machinery.compute.machine_migrate
    description: Move a machine to another pool.
attributes:
  check_mode:
    support: full
    description: Validates everything and computes the plan; writes nothing.
  diff_mode:
    support: full
    description: Shows the owned fields before and after.
options:
  name:
    description: Machine name, a DNS-1123 label (also the domain name).
    type: str
    required: true
  state:
    description:
      - V(running) creates and starts, V(stopped) creates or stops (ACPI power button, forced off after
        O(shutdown_timeout)), V(present) creates and leaves the power state alone, V(absent) shuts down and
        deletes the machine with its ephemeral volumes, seed ISO, Ignition file and console log.
      - V(restarted) restarts the guest as O(restart) says (a stopped or suspended machine is booted); like
        C(ansible.builtin.service), every run restarts, so it always reports a change (in check mode too, doing
        nothing). The restart count goes up by one.
      - V(paused) pauses the running guest's CPUs (a stopped machine is started paused); V(suspended) saves its
        memory to the host's disk and stops it (libvirt managed save; a machine that is off is refused, naming
        this option). V(running) resumes either, with no new boot. Each is idempotent; the diff shows
        C(power) before and after (running, paused, suspended, off).
    type: str
    choices: [running, stopped, present, absent, restarted, paused, suspended]
    default: running
  restart:
    description:
      - How O(state=restarted) restarts. V(soft) asks the guest with the ACPI power button and forces it off after
        O(shutdown_timeout), then starts it; V(hard) power-cycles it at once (destroy, start).
    type: str
    choices: [soft, hard]
    default: soft
  machine_class:
    description: Name of a class published on the pool; gives O(cpu) and O(memory) unless they are set too.
    type: str
  cpu:
    description:
      - CPUs, 1 to 256. A whole number (V(2), also V(2000m)) is that many virtual CPUs.
      - A fraction, in millicores or as a decimal (V(500m), V(0.5), V(1500m), at least V(10m)), is the vCPUs it
        rounds up to with a CFS quota of the domain (C(<cputune>) C(global_period)/C(global_quota)) allowing that
        fraction of one host CPU's time per period; the pool's capacity counts it as the fraction it is.
    type: raw
  memory:
    description: Memory as a quantity (V(512Mi), V(2Gi), V(1.5G)) or bytes.
    type: raw
  image:
    description:
      - OS image (qcow2 or raw) as a path on the host that runs the module, an V(http://) / V(https://) URL, or
        the name of an image published on the pool with M(machinery.compute.machine_image) (a DNS-1123 label
        with no V(/); a file of that name in the current directory is given as V(./name)).
      - 'An OS image in an OCI registry in IronCore''s OS image format, V(oci://<registry>/<repository>:<tag>) or
        V(oci://<registry>/<repository>@sha256:<digest>): its disk layer (media type
        C(application/vnd.ironcore.image.rootfs)) is downloaded, verified by its digest and cached on the pool by
        it like any image; the layer''s digest is the machine''s recorded image checksum. See O(image_ca_file) and
        O(image_pull_secret).'
      - Required to create a machine, unless it boots from an existing volume (O(volumes[].volume)) or a volume
        made from an image (O(volumes[].image)); with no image, the first such volume is the boot disk. Fixed
        afterwards, unless O(rebuild=true) gives the machine a new root disk from it.
      - A qcow2 image must stand alone (no backing file) and be unencrypted. A raw image must look like a disk,
        a whole number of 512-byte sectors starting with a partition table (MBR or GPT) or a file system (ext,
        XFS, btrfs, squashfs, ISO 9660). Anything else is refused before anything is written.
      - A pool caches each image once, by its sha256. A URL is only downloaded when the pool has no image of
        O(image_checksum) yet; when it has one, the URL is not contacted at all, so a URL that refuses
        connections, answers 404 or serves other bits by now is accepted and the cached image is used.
    type: str
  image_checksum:
    description: sha256 of the image (V(sha256:<hex>) or V(<hex>)); required for a URL, verified for a path.
    type: str
  clone_from:
    description:
      - Make the new machine's root disk from another machine's (or one of its snapshots'). Exclusive with
        O(image). Read only when the machine is created; an existing machine keeps its disks.
      - The clone is a new machine with its own name, UUID, MACs and cloud-init instance id; its size, NICs,
        volumes and boot configuration are what this task gives, as for any machine. For a clone with an identity
        of its own inside the guest (machine-id, SSH host keys), clone a machine sealed by
        M(machinery.compute.machine_image) O(machinery.compute.machine_image#module:generalize), or build on that
        captured image with O(image).
      - The source must be stopped unless O(clone_from.snapshot) is given (the stopped machine is reverted to it
        for the copy and back); a source whose root disk is encrypted is refused. The source is held while its
        disk is copied.
    type: dict
    suboptions:
      uri:
        description: libvirt URI of the source's pool; defaults to O(uri). Another pool's disk is streamed over.
        type: str
      machine:
        description: Name of the source machine.
        type: str
        required: true
      snapshot:
        description:
          - A snapshot of the source (M(machinery.compute.machine_snapshot)) to copy instead of its present disk.
        type: str
      mode:
        description:
          - V(full) copies the disk whole and flat; the clone shares nothing with the source.
          - V(linked) captures the disk as a base in the image cache of the clone's pool (by checksum) and makes
            the root disk a thin overlay on it; the base stays while any clone uses it (a prune of
            M(machinery.compute.machine_pool) leaves backing files alone).
        type: str
        choices: [full, linked]
        default: full
  root_size:
    description:
      - Size of the root disk (at least the image's virtual size); defaults to the image's size.
      - Read when the root disk is made, at creation and by a rebuild (O(rebuild)); a rebuild without it keeps
        the size the root had, grown to the new image's size if that is larger.
    type: raw
  volumes:
    description: Extra disks, each a new empty volume (O(volumes[].size)), an existing volume of the pool's
      storage (O(volumes[].volume)) or an overlay on an image (O(volumes[].image)).
    type: list
    elements: dict
    suboptions:
      name:
        description: Name of the disk within the machine.
        type: str
        required: true
      size:
        description: Size of a new empty volume; with O(volumes[].image), the least size of the overlay disk (it
          is at least the image's).
        type: raw
      volume:
        description: Name of an existing volume in the pool's C(machinery) storage pool.
        type: str
      image:
        description:
          - Image path or URL (or a published image's name) for an overlay disk.
          - A machine without O(image) boots from its first existing volume or volume of an image, else its first
            empty volume.
        type: str
      image_checksum:
        description: sha256 of O(volumes[].image).
        type: str
      device:
        description: Target device; assigned stably (vdb, vdc, ...) when not given.
        type: str
      bus:
        description: Disk bus.
        type: str
        choices: [virtio, scsi, sata]
        default: virtio
      ephemeral:
        description: Delete the volume with the machine. Defaults to true for new volumes and false for
          existing ones.
        type: bool
      shareable:
        description:
          - Attach an existing raw O(volumes[].volume) that other machines use as well (a shared disk, without
            host caching). Without it, a volume another machine uses is refused.
          - The pool's own volumes (image caches, Ignition files, seeds, console logs) are never attachable.
        type: bool
        default: false
      iops:
        description:
          - I/O operations per second the disk may make (100 to 64000), as libvirt C(iotune) C(total_iops_sec).
          - Changed on an existing machine by listing the volume again with a new value; a running machine takes
            it at once (C(virDomainSetBlockIoTune), live and persistent).
        type: int
      throughput:
        description:
          - Bytes per second the disk may move, in MB/s (125 to 4000; 1 MB = 10^6 bytes), as libvirt C(iotune)
            C(total_bytes_sec). Changed like O(volumes[].iops).
        type: int
      encrypted:
        description:
          - Create the new volume as LUKS (a raw volume inside); the guest sees a plain disk. A volume of
            O(volumes[].image) is then a full encrypted copy of the image (not an overlay over the cached image),
            at least O(volumes[].size) large; an existing O(volumes[].volume) cannot be encrypted.
          - The passphrase is kept in a private libvirt secret on the pool, deleted with the volume; only the
            secret's uuid is in the volume's and the domain's XML. Fixed at creation.
        type: bool
        default: false
      passphrase:
        description:
          - The LUKS passphrase of an O(volumes[].encrypted) volume; required with it, never empty, never
            returned or logged. Used when the volume is created; it cannot be read back, so a different value
            on a later run is not compared (the volume keeps its passphrase).
        type: str
  network_interfaces:
    description:
      - NICs. When omitted the machine gets one NIC C(eth0) on the pool's first network; V([]) means none.
    type: list
    elements: dict
    suboptions:
      name:
        description: Name of the NIC within the machine.
        type: str
        required: true
      network:
        description: libvirt network.
        type: str
      bridge:
        description: Host bridge; it must exist on the pool host (checked through libvirt before anything is created).
        type: str
      mac:
        description: MAC address; derived from the machine and NIC names when not given, so it is stable.
        type: str
      model:
        description: NIC model.
        type: str
        choices: [virtio, e1000e, rtl8139]
        default: virtio
      ephemeral:
        description: Whether the NIC lives and dies with the machine.
        type: bool
        default: true
      security_groups:
        description:
          - Names of security groups (M(machinery.compute.security_group)) on the pool that guard this NIC.
          - Once a NIC has a group, inbound traffic that no group of the NIC allows is dropped (DHCP passes), and
            so is outbound traffic, which a group without egress rules allows as a whole (see
            C(docs/security-groups.md) in the collection).
          - On a running machine a change takes effect at once (the NIC's nwfilter is redefined or its filter
            reference updated live). V([]) removes every group; leaving the option out keeps the NIC's groups.
          - An unknown group fails naming it, and nothing is changed.
        type: list
        elements: str
      ip_address:
        description:
          - A fixed IPv4 address for the NIC, made a DHCP host reservation (C(<host mac ip name>)) for its MAC on
            its libvirt O(network_interfaces[].network), live and persistent. It must lie in the network's DHCP
            range and be held by no other MAC (reservation or lease); it is released when the machine is deleted.
          - A network in CIDR form (C(192.168.126.0/24)) allocates the address instead - the first from the
            network's 51st host upward that the DHCP range contains and no host entry, lease or other machine of
            the run holds (the rule of OpenShift's libvirt provider) - kept while the machine lives.
          - A DHCP lease outlives its guest. An address a deleted machine's guest had leased goes to another MAC
            only when that lease ends (the network's lease time, an hour by default); until then it is refused,
            and the error says when the lease ends.
          - Changed on an existing machine by listing the NIC again; the guest takes the new address at its next
            DHCP request, so the return says C(restart_required) for a running machine.
        type: str
  ignition:
    description: Ignition config, as a JSON string or a mapping.
    type: raw
  cloud_init:
    description: NoCloud data for cloud-init.
    type: dict
    suboptions:
      user_data:
        description: user-data; a mapping is written as C(#cloud-config).
        type: raw
      meta_data:
        description:
          - meta-data, a mapping or YAML text of one; C(instance-id) and C(local-hostname) default to the
            machine name (in the mapping form).
        type: raw
      network_config:
        description:
          - network-config, a mapping or YAML text of one, with C(version) 1 (and a C(config) list) or 2.
        type: raw
  ssh_authorized_keys:
    description: Public keys merged into the cloud-config (or the Ignition C(core) user when only Ignition is
      given).
    type: list
    elements: str
  topology:
    description:
      - The CPU topology the guest sees (C(<cpu><topology/>)); sockets x cores x threads must equal the vCPU
        count (O(cpu) or the class's). Each defaults to 1. Ranges are those of the vitistack Machine CRD.
      - A change is recorded at once and taken by a running machine at its next start (C(restart_required)).
        A machine with a topology that changes its vCPU count must be given the new topology too.
    type: dict
    suboptions:
      sockets:
        description: Sockets (1 to 16).
        type: int
        default: 1
      cores:
        description: Cores per socket (1 to 256).
        type: int
        default: 1
      threads:
        description: Threads per core (1 to 8).
        type: int
        default: 1
  swap:
    description:
      - Swap size (a quantity such as V(1Gi)); V(0) or nothing means none. The machine gets one more ephemeral
        disk, volume C(<name>-swap.qcow2), named C(swap) in its volumes, whose serial is C(machinery-swap), so the
        guest finds it as C(/dev/disk/by-id/virtio-machinery-swap) (or by C(/sys/block/vdX/serial)) and formats
        it with C(mkswap). See the collection's docs/capabilities.md for a cloud-init snippet.
      - Fixed at creation.
    type: raw
  labels:
    description:
      - Labels of the machine (kept in its record; used by selectors and the inventory).
      - Keys and values follow the Kubernetes label rules; values must be strings (quote V("true") or V("1")).
    type: dict
  tolerations:
    description:
      - Taints of the pool this machine tolerates (C(key), C(operator) Equal or Exists, C(value), C(effect)
        NoSchedule or NoExecute; an empty effect matches both), kept in its record and changed in place.
      - The scheduler (M(machinery.compute.machine_batch), M(machinery.compute.machine_set)) places the machine
        by them; M(machinery.compute.machine_pool) lists as RV(machinery.compute.machine_pool#module:pool.must_leave)
        the machines that tolerate no C(NoExecute) taint of their pool, and the C(drain) role moves exactly those.
      - When not given, an existing machine keeps the tolerations it has.
    type: list
    elements: dict
  hostname:
    description:
      - The guest's host name (DNS-1123 labels joined by dots), handed over with the boot configuration
        (IronCore's C(Machine.spec.hostname)).
      - With O(cloud_init) (or O(ssh_authorized_keys) alone, or this option alone) it is the seed's
        C(local-hostname); with O(ignition) the file C(/etc/hostname), unless the config writes that file itself.
      - When not given, cloud-init sets the machine's name; an existing machine keeps what it was given. A change is
        read by the guest at its next first boot, as any change of the boot configuration.
    type: str
  secure_boot:
    description:
      - UEFI Secure Boot with the distribution's keys enrolled (Microsoft's UEFI CA among them, so shim-signed
        bootloaders start), through libvirt's firmware auto-selection; SMM is turned on with it. Needs
        O(firmware=uefi), and a pool whose firmware can do it (Debian's C(ovmf) package), else it is refused
        naming this option before anything is made.
      - Fixed at creation, like O(firmware); left out, a new machine has it off.
    type: bool
  tpm:
    description:
      - An emulated TPM 2.0 (QEMU's CRB interface backed by swtpm, which the pool host needs (Debian's C(swtpm)
        and C(swtpm-tools) packages); the guest sees C(/dev/tpm0).
      - Its state is kept by libvirt with the machine on its pool host, carried by a live move, and deleted with
        the machine. Adding or removing it on a running machine takes effect at its next start.
      - Left out, a new machine has none and an existing one keeps what it has.
    type: bool
  efi_vars:
    description:
      - UEFI variables the machine's firmware store is to hold (IronCore's C(Machine.spec.efiVars)). Needs
        O(firmware=uefi), else it is refused naming this option.
      - They are written into the store, the volume C(<name>-nvram.fd) of the pool's storage, only while the machine
        is off (QEMU holds the store as its flash while it runs). A new machine gets them before its first boot;
        a stopped one at once; a running one when this run shuts it down and starts it again (O(state=restarted),
        a resize's restart, a rebuild) or stops it, and otherwise the run writes nothing, warns and returns
        C(restart_required).
      - The store is read and only variables that differ are written (check mode writes nothing and
        shows them in the diff). A variable not listed is left as the firmware or the OS wrote it, including one
        listed by an earlier run; the store keeps the variables through moves, backups and rebuilds.
      - Secure Boot's own variables (C(PK), C(KEK), C(db), C(dbx), C(SecureBoot), C(SetupMode), ...) are refused
        (O(secure_boot) enrolls the distribution's keys).
      - When not given, the store is not read and nothing is written.
    type: list
    elements: dict
    suboptions:
      name:
        description: The variable's name (as efivarfs shows it before the GUID), up to 128 characters.
        type: str
        required: true
      guid:
        description:
          - The variable's vendor GUID (IronCore's C(uuid)), such as V(8be4df61-93ca-11d2-aa0d-00e098032b8c) for
            UEFI's global variables (C(BootOrder), C(Timeout)); a variable of your own takes a GUID of your own.
        type: str
        required: true
      value:
        description: The variable's data, base64-encoded, not empty (UEFI deletes a variable without data).
        type: str
        required: true
      runtime_access:
        description:
          - Whether the OS may read it once it runs (UEFI's C(RUNTIME_ACCESS); Linux shows it in
            C(/sys/firmware/efi/efivars)). The variable is always non-volatile and readable by the boot loader.
        type: bool
        default: true
  firmware:
    description: Firmware, fixed at creation; V(bios) when not given.
    type: str
    choices: [bios, uefi]
  virt_type:
    description: V(auto) uses what the pool measured when it was registered.
    type: str
    choices: [auto, kvm, qemu]
    default: auto
  wait:
    description:
      - After starting, wait for nothing more, for the domain to run, or for a DHCP address.
      - V(address) needs a NIC on a libvirt network (whose DHCP lease is read); it is refused up front otherwise.
      - When the run boots the guest, V(address) waits for a lease that guest was granted or renewed. A lease the
        network still lists from an earlier boot (the same MAC, as for a machine created again under its old name)
        does not count until the guest asks for it again.
    type: str
    choices: [none, running, address]
    default: running
  wait_timeout:
    description: Seconds to wait for O(wait=address); must be positive.
    type: int
    default: 300
  run_strategy:
    description:
      - What keeps the machine running when nobody asks (KubeVirt's run strategies).
      - V(always) runs it at all times; libvirt starts it when its host boots (autostart), restarts it after a
        guest crash (C(on_crash=restart)), and every converge starts it when it finds it off, O(state=present)
        included. A guest that powers itself off stays off until the next converge or the host's next boot.
      - V(on_failure) brings it back after a failure but not after a clean shutdown. A crash restarts it, a host
        that loses power while it runs starts it again when it boots (autostart is on while it runs), and a
        converge with O(state=present) starts it when it finds it crashed or failed. A converge that finds it
        shut down turns autostart off.
      - V(manual) does nothing of itself (no autostart, a crash leaves it off); O(state) alone starts and stops it.
      - V(halted) keeps it off (with O(state=present) a converge stops it).
      - Left out, a new machine gets the strategy its O(state) implies (V(running) means V(always), V(stopped)
        V(halted), V(present) V(manual)); an existing one keeps its own, except that an V(always) machine asked
        to stop becomes V(halted) and a V(halted) one asked to run V(always), as KubeVirt's stop and start do. A
        machine made before run strategies existed gets the one its state implies (under V(present) it keeps none).
      - Refused, naming this option, with a state it contradicts (V(always) with O(state=stopped), V(halted)
        with O(state=running)).
      - A change is made in place, live, and shown in the diff (C(run_strategy), C(autostart)). It is part of
        the action that changes the machine's power (C(create), C(start), C(stop), C(restart), ...), as the
        strategy a O(state) implies is; only a strategy changed while the power stays as it is is an action of
        its own, C(update run_strategy) (the autostart with it).
    type: str
    choices: [always, on_failure, manual, halted]
  shutdown_timeout:
    description:
      - Seconds the guest has to power off after the ACPI request before it is forced off.
      - V(0) forces it off at once; a negative number is refused.
    type: int
    default: 60
  adopt:
    description: Take over a domain of the same name that this collection did not create (only its record is
      written; its devices are left as they are).
    type: bool
    default: false
  unique_across:
    description:
      - URIs of other pools a new machine's name must be unique across (the machines role passes all pools).
      - Creation takes the admission locks of this pool and of these pools, in URI order, checks that no other
        pool has a machine of this name, re-checks capacity and defines the domain; a concurrent run that got
        there first makes this one fail with a clear cause instead of creating a second machine of the name.
    type: list
    elements: str
  allow_move:
    description:
      - Whether a resize that does not fit the machine's pool moves the machine first. The move is cold, to the
        pool of O(pools) that fits the new size best (the filters and the spread score of the scheduler, Ready, taints
        the machine tolerates, the class published, room for the new size), as
        M(machinery.compute.machine_migrate) makes it (journaled; a move that fails is rolled back and the
        guest started again on its pool). The machine is then resized there; C(actions) holds the move and
        the resize, and a warning names the pool.
      - Without it, or when no pool of O(pools) fits, the resize is refused naming O(machine_class) (or
        O(cpu), O(memory)) and nothing is changed.
      - An instruction for this run only; it is not recorded.
    type: bool
    default: false
  rebuild:
    description:
      - Whether a changed O(image) (or O(image_checksum)) of an existing machine gives it a new root disk made
        from that image, as a create makes one (a thin overlay on the image cached in the pool). The name, UUID,
        MACs, data volumes, labels and record are kept; the record's image is updated.
      - The cloud-init seed is given again with a new instance id (C(iid-<name>.r<n>) for the n-th rebuild, unless
        O(cloud_init.meta_data) sets its own), so cloud-init in the new root runs as on a first boot; the
        O(cloud_init) of this run is used when given, else the seed the machine has. A new O(ignition) is
        written too; an unchanged one is read again by the new root's first boot.
      - The image is cached and the boot files made while the machine still runs; then it is shut down (ACPI,
        forced off after O(shutdown_timeout)), the new root made under a new volume name, the domain redefined
        to use it and started again if it ran (unless O(state=stopped)); only then are the old root and boot
        files deleted. A failure before that deletes what the run made and leaves the machine as it was,
        running if it ran.
      - Refused, naming this option, for a machine with snapshots (they live inside the old root disk), an
        adopted one, and one that boots from a volume.
      - Without it a changed O(image) is refused as before. With the same image it changes nothing. An
        instruction for this run only; it is not recorded. Only this module rebuilds (not
        M(machinery.compute.machine_batch) or M(machinery.compute.machine_set), which would take their
        machines down at once).
    type: bool
    default: false
  pools:
    description:
      - The pools O(allow_move) may move the machine to, as libvirt URIs or mappings with C(uri) and an optional
        C(name) (the machine's own pool may be among them; it is skipped). Used by O(allow_move).
      - Checked whenever it is given, even when no move is needed; with O(allow_move), an empty list is refused.
      - When no machine O(name) is on O(uri) and the task gives no size to create one, the error names the pools
        of this list that hold a machine of that name (one moved away by an earlier run, say).
    type: list
    elements: raw
  server_group:
    description:
      - The server group the machine belongs to, fixed at creation and kept in its record (listings show it).
      - The scheduler (M(machinery.compute.machine_batch), M(machinery.compute.machine_set), the
        P(machinery.compute.scheduler#lookup) lookup) places the machine by the group's policy, counting the
        members already on the pools and those placed before it in the same run. V(anti-affinity) refuses a pool
        that holds a member, V(affinity) a pool without members when the group has some elsewhere; the
        machine is then refused naming the group and policy rather than placed against them.
        V(soft-affinity) and V(soft-anti-affinity) only prefer the pools with the most (or fewest) members.
      - Creation re-checks the group under the admission locks, as it re-checks capacity, and fails with
        RV(reason=PoolFull) when a V(anti-affinity) member is already on the pool, or when an V(affinity) group
        has members on a pool of O(unique_across) and none on this one (without O(unique_across), an
        V(affinity) group is checked by the scheduler only).
    type: dict
    suboptions:
      name:
        description: The group's name (a DNS-1123 label).
        type: str
        required: true
      policy:
        description: How members are placed relative to each other.
        type: str
        required: true
        choices: [affinity, anti-affinity, soft-affinity, soft-anti-affinity]
notes:
  - Creation re-checks capacity on the pool under its admission lock (a storage volume created atomically in
    the pool's registry); when a concurrent run took the room the module fails with RV(reason=PoolFull), which
    the machines role answers by rescheduling.
"""

EXAMPLES = r"""
- name: A machine from an image with Ignition, waiting for its address
  machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: web-1
    machine_class: small
    image: /var/lib/images/fcos.qcow2
    image_checksum: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    root_size: 10Gi
    ignition:
      ignition:
        version: 3.4.0
    labels:
      app: web
    wait: address

- name: A machine with a CPU topology, swap, a limited and an encrypted disk, and a fixed address
  machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: db-1
    cpu: 4
    memory: 4Gi
    topology: {sockets: 1, cores: 2, threads: 2}
    swap: 2Gi
    image: /var/lib/images/debian-12.qcow2
    volumes:
      - {name: data, size: 20Gi, iops: 3000, throughput: 125}
      - name: secrets
        size: 1Gi
        encrypted: true
        passphrase: "{{ vault_db_passphrase }}"
    network_interfaces:
      - {name: eth0, network: machinery, ip_address: 192.168.100.50}

- name: Stop it gracefully
  machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: web-1
    state: stopped

- name: Delete it with its ephemeral volumes
  machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: web-1
    state: absent
"""

RETURN = r"""
machine:
  description:
    - Status of the machine after the run.
    - The other modules that return machines (M(machinery.compute.machine_info), M(machinery.compute.machine_batch),
      M(machinery.compute.nic_attach), M(machinery.compute.volume_attach), M(machinery.compute.machine_migrate))
      and the C(machinery) hostvar of the P(machinery.compute.machines#inventory) inventory give statuses of this
      shape and refer to this description of it.
    - A machine that is absent has only C(name), C(pool), C(uri) and C(phase=Terminated); in check mode, one that
      does not exist yet has these (C(phase=Pending)) and the C(machine_class), C(cpu), C(memory) and C(labels)
      it would get.
  returned: always
  type: dict
  contains:
    name:
      description: Machine name.
      type: str
      sample: web-1
    uuid:
      description: Domain UUID.
      type: str
      sample: 0533223d-634a-4d52-b08a-a66127dfd6dc
    pool:
      description: Pool name.
      type: str
      sample: hv1
    uri:
      description: libvirt URI of the pool the machine was read through.
      type: str
      sample: qemu+ssh://root@hv1/system
    phase:
      description: Pending, Running, Shutdown, Terminating, Terminated or Failed.
      type: str
      sample: Running
    machine_class:
      description: Class name, if any.
      type: str
      sample: small
    cpu:
      description: CPUs, a whole number of vCPUs, or a fraction (0.5) that a CFS quota holds its vCPUs to.
      type: raw
      sample: 2
    topology:
      description: The CPU topology (sockets, cores, threads), or null when the machine has none of its own.
      type: dict
      sample: {"sockets": 1, "cores": 2, "threads": 1}
    swap:
      description: Swap size as a quantity, or null.
      type: str
      sample: 1Gi
    memory:
      description: Memory as a quantity.
      type: str
      sample: 512Mi
    image:
      description: Image source; null for a machine booted from a volume.
      type: str
      sample: /srv/images/fedora-coreos.qcow2
    labels:
      description: Labels.
      type: dict
      sample: {"app": "web"}
    server_group:
      description: The server group (C(name), C(policy)) the machine was created in, or null.
      type: dict
      sample: {"name": "db", "policy": "anti-affinity"}
    ip_addresses:
      description:
        - Addresses from the networks' DHCP leases; when there is none, the routable addresses the guest agent
          reports (see C(guest)).
      type: list
      elements: str
      sample: ["192.168.122.152"]
    network_interfaces:
      description: The NICs of the machine's record, in order.
      type: list
      elements: dict
      contains:
        name:
          description: NIC name.
          type: str
          sample: eth0
        mac:
          description: MAC address.
          type: str
          sample: 52:54:00:3e:4e:09
        network:
          description: The libvirt network, or the host bridge.
          type: str
          sample: default
        ip_addresses:
          description: Addresses from the network's DHCP lease while the machine runs.
          type: list
          elements: str
          sample: ["192.168.122.152"]
        ip_address:
          description: The fixed address reserved for the NIC, or null.
          type: str
          sample: 192.168.122.50
        ephemeral:
          description: Whether the NIC goes with the machine.
          type: bool
          sample: true
        state:
          description: Attached once the guest has it, Pending before.
          type: str
          sample: Attached
    volumes:
      description: The disks of the machine's record, the root disk first (none for a machine booted from a volume).
      type: list
      elements: dict
      contains:
        name:
          description: Volume name; C(root) for the root disk.
          type: str
          sample: data
        device:
          description: Target device in the guest's configuration.
          type: str
          sample: vdb
        size:
          description: Size as a quantity.
          type: str
          sample: 64Gi
        ephemeral:
          description: Whether the volume goes with the machine.
          type: bool
          sample: true
        iops:
          description: The I/O operations per second the disk is limited to (O(volumes[].iops)), or null (not on the
            root disk).
          type: int
          sample: 3000
        throughput:
          description: The MB/s the disk is limited to (O(volumes[].throughput)), or null (not on the root disk).
          type: int
          sample: 125
        encrypted:
          description: Whether the volume is encrypted (not on the root disk).
          type: bool
          sample: false
        state:
          description: Attached once the guest has it, Pending before, Missing when its volume is gone from the
            pool's storage.
          type: str
          sample: Attached
    conditions:
      description:
        - Ready, VolumesReady and NetworkInterfacesReady, then BootstrapReady (True once the guest agent answered
          or its channel is connected; Unknown when no agent has connected).
      type: list
      elements: dict
      contains:
        type:
          description: Ready, VolumesReady, NetworkInterfacesReady or BootstrapReady.
          type: str
          sample: Ready
        status:
          description: V(True), V(False) or V(Unknown), as strings (as in Kubernetes).
          type: str
          sample: 'True'
        reason:
          description: One word for why, for example the phase for Ready, or Attached, Pending or Missing.
          type: str
          sample: Running
        message:
          description: More about the reason, or empty.
          type: str
          sample: ''
    guest:
      description:
        - What the machine says about itself through the QEMU guest agent, asked only when the machine runs and
          the agent's channel is connected; null otherwise.
        - C(hostname), C(os) (name, pretty_name, id, version, version_id, machine), C(kernel) (release, version),
          C(timezone) (name, offset), C(boot_time) (UTC, ISO 8601), C(interfaces) (name, mac, addresses of
          address, prefix, family), C(agent_errors) (what the agent refused).
        - See C(docs/guest-agent.md) in the collection.
      type: dict
      sample:
        hostname: web-1
        os:
          name: Debian GNU/Linux
          pretty_name: Debian GNU/Linux 12 (bookworm)
          id: debian
          version: 12 (bookworm)
          version_id: '12'
          machine: x86_64
        kernel:
          release: 6.1.0-56-cloud-amd64
          version: '#1 SMP PREEMPT_DYNAMIC Debian 6.1.192-2 (2026-11-16)'
        timezone: {"name": "UTC", "offset": 0}
        boot_time: '2026-11-22T14:39:08+00:00'
        interfaces:
          - name: eth0
            mac: 52:54:00:7d:6c:e1
            addresses:
              - {"address": "192.168.122.152", "prefix": 24, "family": "ipv4"}
              - {"address": "fe80::5054:ff:fe7d:6ce1", "prefix": 64, "family": "ipv6"}
        agent_errors: []
    restart_count:
      description: Starts after the first one.
      type: int
      sample: 0
    run_strategy:
      description: The machine's run strategy (see O(run_strategy)); null for a machine that has none.
      type: str
      sample: always
    power_state:
      description: What the guest is doing, finer than O(state) shows it.
      type: str
      choices: [running, paused, suspended, off, crashed]
      sample: running
    autostart:
      description: Whether its host starts it when the host boots (libvirt autostart).
      type: bool
      sample: true
    created:
      description: Creation time (UTC, ISO 8601).
      type: str
      sample: '2026-11-22T15:16:57+00:00'
    age:
      description: Time since creation, as C(kubectl) shows it (C(45s), C(3m), C(5h), C(2d)); C(<unknown>) without
        a creation time.
      type: str
      sample: 1m
    last_error:
      description: Why the last start of the machine failed, cleared by the next start that succeeds; null when none
        failed.
      type: str
      sample: null
    managed:
      description: Whether the collection created the machine (its domain carries the collection's record).
      type: bool
      sample: true
restart_required:
  description:
    - True when a change was recorded that the running guest only takes at its next start.
    - A resize that restarts the machine in place leaves nothing to a next start (the action C(restart) is in
      RV(actions)).
  returned: always
  type: bool
  sample: false
actions:
  description: The short form of each planned action, in order, for example C(create), C(start), C(update cpu, memory),
    C(restart) (a resize taken by a running machine). The run strategy and libvirt autostart change within the
    action that changes the power (a stop is C(stop) alone); C(update run_strategy) is a strategy changed with
    nothing else, C(update autostart) an autostart changed alone (an O(run_strategy=on_failure) machine found
    shut down).
  returned: always
  type: list
  elements: str
  sample: ["update labels"]
reason:
  description: On failure, the kind of cause; C(PoolFull) when admission found no room on the pool.
  returned: failure
  type: str
  sample: PoolFull
field:
  description: On failure, the option the error is about, when there is one.
  returned: failure
  type: str
  sample: topology.cores
plan:
  description:
    - The actions of the run (or, in check mode, of the run it would make), in order, each with what it changes.
  returned: always
  type: list
  elements: dict
  contains:
    action:
      description: The kind of action, for example C(create), C(start), C(update), C(attach), C(register).
      type: str
      sample: update
    target:
      description: What it acts on (a machine, volume, NIC, storage pool, network or document name).
      type: str
      sample: web-1
    fields:
      description: For C(update), the owned fields it changes.
      type: list
      elements: str
      sample: ["labels"]
    before:
      description: The owned fields before the action, where it changes some.
      type: dict
      sample: {"labels": {"app": "web"}}
    after:
      description: The owned fields after the action, where it changes some.
      type: dict
      sample: {"labels": {"app": "web", "tier": "front"}}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample: [{"action": "define", "target": "web-1"}, {"action": "set_live", "target": "web-1"}]
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import PoolFull, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets.resize_move import (
    found_elsewhere, move_pools, resize_elsewhere)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine import MachineService
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class MachineModule(MachineryModule):
    argument_spec = options.argument_spec(options.MACHINE + options.MACHINE_MOVE)

    def run(self, ctx):
        params = machine_spec.machine_params(self.params)
        entries = move_pools(self.params["pools"], params["allow_move"])
        plan = None
        try:
            outcome = MachineService(ctx, self.check_mode).ensure(params)
        except PoolFull as exc:
            if not (params["allow_move"] and getattr(exc, "resize", None)):
                raise
            plan, outcome = resize_elsewhere(ctx, params, exc, entries, self.check_mode, self.url_opener())
        except ValidationError as exc:
            raise found_elsewhere(exc, ctx.uri, entries) from None
        return self.converged(plan or outcome.plan, machine=outcome.machine,
                              restart_required=outcome.restart_required,
                              warnings=plan.warnings if plan is not None else outcome.warnings)


def main():
    MachineModule()()


if __name__ == "__main__":
    main()
