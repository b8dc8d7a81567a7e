# machinery.compute: one entry point for people and CI. Run as root on Debian 12.
SHELL := /bin/bash
.DEFAULT_GOAL := help

POOLS ?= 3
LAB ?= $(CURDIR)/.lab
TEST_LAB ?= $(CURDIR)/.lab/test
MOLECULE_LAB ?= $(CURDIR)/.lab/molecule-test
DOCS_DIR ?= $(CURDIR)/.cache/docsite
IMAGE_DIR ?= $(CURDIR)/.lab/image
DEBIAN13_DIR ?= $(CURDIR)/.cache/debian13
# The Debian 13 root of the mixed labs' newer pools (lab/debian13/root.sh lab) is made once per machine, shared by its
# clones of the repository, in a directory named by the hash of root.sh (which lists its packages).
DEBIAN13_LAB_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/machinery-compute/debian13-$(shell \
	sha256sum lab/debian13/root.sh | cut -c1-16)
VENV := $(CURDIR)/.venv
# Every step of make test (and the steps of integration, make check) appends its wall and CPU seconds to STEPS
# (tests/steptime.py: the CPU of the daemons and guests a step starts counts too); make test prints the table at
# its end, make steps prints it any time. make test starts a new table.
STEPS ?= $(CURDIR)/tests/output/steps.jsonl
TIMED = python3 $(CURDIR)/tests/steptime.py $(STEPS)
# The seconds each integration file took in make integration's main run (make durations copies them into
# tests/integration/durations.json, the order the files go to the labs in).
DURATIONS_OUT ?= $(CURDIR)/tests/output/integration-durations.json
PY := $(VENV)/bin/python
# The contract's minimum ansible-core: unit and inventory tests run under it too, from a venv of its own.
MIN_CORE := 2.16.19
CORE_BIN := $(VENV)/cores/$(MIN_CORE)/bin
# The newest ansible-core release, on a Python that runs its controller (3.12 or later: the system's on Debian 13,
# else the newest the machine has, tests/newest_python.sh). Unit tests, its ansible-test sanity and the
# integration files of each plugin type run under it. Without such a Python it is not tested, and make says so.
NEWEST_CORE := 2.21.5
NEWEST_PYTHON ?= $(shell bash tests/newest_python.sh 3.12)
NEWEST_VENV := $(VENV)/cores/$(NEWEST_CORE)
NEWEST_SKIPPED = echo "!!! NOT TESTED: ansible-core $(NEWEST_CORE) needs Python 3.12 or later and this machine has none" \
	"(set NEWEST_PYTHON=/path/to/python3.12+) !!!" >&2
# A module, the action plugins, the inventory, the lookup (test_11's scheduler cases), the connection (the guest
# agent), the filters and the roles' plays.
NEWEST_INTEGRATION := test_03_machine.py test_05_roles.py test_06_machine_batch.py test_07_inventory.py \
	test_11_bad_input.py test_18_guest_agent.py test_37_filters.py
APT_PACKAGES := python3 python3-venv python3-dev gcc pkg-config make git libvirt-dev \
	libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils \
	dnsmasq-base iproute2 iptables mtools syslinux syslinux-common ovmf shellcheck time libxml2-utils \
	mmdebstrap fdisk e2fsprogs openssh-client netcat-openbsd openssh-server openssl binutils xz-utils docker-registry \
	apache2-utils swtpm swtpm-tools faketime skopeo
HOST_RELEASE := $(shell . /etc/os-release 2>/dev/null && echo $${VERSION_ID%%.*})
# Debian 13 moved libvirt's interface driver (how a pool lists its host bridges, machine_spec.host_interface) out of
# libvirt-daemon into a package of its own that libvirt-daemon-system only recommends; Debian 12 has no such package.
APT_PACKAGES += $(if $(filter 12,$(HOST_RELEASE)),,libvirt-daemon-driver-interface)

.PHONY: help deps venv venvs core-venv newest-venv steps durations sanity-newest debian13 debian13-lab ee integration-mixed image image-real lab-up lab-down lab-status demo demo-down test checks unit sanity lint \
	sanity-and-lint molecule-and-packaging test-stages integration-main integration-labs-up check check-static \
	check-integration \
	packaging integration molecule docs docs-lint benchmark benchmark-scale clean

help:
	@echo "make demo        a 3-pool lab of real libvirtd hosts, classes, machines booted with Ignition + cloud-init"
	@echo "make test        unit tests, ansible-test sanity, ansible-lint, packaging, integration tests on a fresh lab"
	@echo "make check       before a commit (about 5 minutes): unit, sanity, lint, an integration file per module family"
	@echo "make demo REAL=1 the same, then a play inside a real Debian guest (builds make image-real first)"
	@echo "make molecule    the roles' molecule scenarios on a lab of their own"
	@echo "make docs        the collection's documentation site (antsibull-docs, Sphinx) in .cache/docsite/html"
	@echo "make ee          the execution environment image (ansible-builder, podman, a Debian base) and AWX jobs in it"
	@echo "make debian13    the two commands above in a Debian 13 root (mmdebstrap; RUN='make unit' for another)"
	@echo "make lab-up [POOLS=N] [NEWER=N: the last N pools on Debian 13's libvirt and QEMU] | lab-down | lab-status | image | image-real | venv | benchmark"

deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# The virtual environment finds machinery.compute from this working tree: its site-packages holds a link
# ansible_collections/machinery/compute -> the repository, which ansible-core scans on sys.path.
# requirements*.txt name the packages (the runtime ones with their oldest supported releases), constraints.txt
# pins the versions the tests run with.
# (libvirt-python's pin follows a newer libvirt of the machine: tests/constraints.sh).
$(VENV)/.stamp: requirements.txt requirements-dev.txt constraints.txt
	$(MAKE) --no-print-directory deps
	test -x $(PY) || python3 -m venv $(VENV)
	bash tests/constraints.sh > $(VENV)/constraints.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt -c $(VENV)/constraints.txt
	site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
		mkdir -p "$$site/ansible_collections/machinery" && \
		ln -sfn $(CURDIR) "$$site/ansible_collections/machinery/compute"
	touch $@

venv: $(VENV)/.stamp

venvs: venv core-venv newest-venv

core-venv: venv
	bash tests/core_venv.sh $(VENV) $(MIN_CORE) >/dev/null

newest-venv: venv
	@if [ -n "$(NEWEST_PYTHON)" ]; then \
		bash tests/core_venv.sh $(VENV) $(NEWEST_CORE) $(NEWEST_PYTHON) >/dev/null; \
	else $(NEWEST_SKIPPED); fi

# The images are built in a cache of the machine's, shared by its clones of the repository, and copied into
# IMAGE_DIR (lab/cached_image.sh): a fresh clone copies what an unchanged recipe built before instead of building
# it again (the three took 98 s, 71 CPU s, in make test's first stage). IMAGE_CACHE=$(IMAGE_DIR): no cache.
IMAGE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/machinery-compute/images
IMAGE_CACHED = set -o pipefail; bash lab/cached_image.sh $(1) $(2) $(IMAGE_CACHE) $(IMAGE_DIR) | tail -n 1

# The busybox image, and the idle image (lab/image/idle) for tests that need a machine running but never look
# inside it.
image: deps
	@$(call IMAGE_CACHED,lab/image/build.sh,machinery-test)
	@$(call IMAGE_CACHED,lab/image/idle/build.sh,machinery-idle)

# A real Debian 12 guest (systemd, cloud-init, sshd, Python, the guest agent) for the tests and the demo that
# work inside machines; the busybox image above stays the fast default.
image-real: deps
	@$(call IMAGE_CACHED,lab/image/real/build.sh,machinery-real)

# NEWER=N: the last N pools are Debian 13 hosts, their daemons run with the programs of a Debian 13 root that has
# libvirt 11 and QEMU 10 (lab/debian13/root.sh lab: made once, kept in $(DEBIAN13_LAB_DIR)/lab).
lab-up: deps image
	python3 lab/lab.py up --pools $(POOLS) --dir $(LAB) --image $(IMAGE_DIR)/machinery-test.qcow2 \
		--newer $(or $(NEWER),0) $(if $(NEWER),--newer-root $$(bash lab/debian13/root.sh lab $(DEBIAN13_LAB_DIR)))

lab-down:
	python3 lab/lab.py down --dir $(LAB)

lab-status:
	python3 lab/lab.py status --dir $(LAB)

# REAL=1: then a machine from the real image, handed over by the inventory plugin (a source demo_real.yml writes
# into $(LAB)/demo-inventory), and a play inside it.
demo: venv lab-up $(if $(filter 1,$(REAL)),image-real)
	cd playbooks && $(VENV)/bin/ansible-playbook demo.yml -e lab_file=$(LAB)/lab.json
ifeq ($(REAL),1)
	mkdir -p $(LAB)/demo-inventory
	cd playbooks && $(VENV)/bin/ansible-playbook -i $(LAB)/demo-inventory demo_real.yml \
		-e lab_file=$(LAB)/lab.json -e real_image=$(IMAGE_DIR)/machinery-real.qcow2
endif

demo-down:
	cd playbooks && $(VENV)/bin/ansible-playbook demo_down.yml -e lab_file=$(LAB)/lab.json
	python3 lab/lab.py down --dir $(LAB)

# The first run explores the hold protocol's model with its wider bounds (MACHINERY_MODEL=full, about 40 s: see
# docs/concurrency.md, "The models"); the runs under the other cores, with the lighter ones.
unit: venv core-venv newest-venv
	MACHINERY_MODEL=full $(VENV)/bin/pytest -q -p no:cacheprovider tests/unit
	@echo "-- the same under ansible-core $(MIN_CORE)"
	$(CORE_BIN)/pytest -q -p no:cacheprovider tests/unit
	@if [ -n "$(NEWEST_PYTHON)" ]; then \
		echo "-- the same under ansible-core $(NEWEST_CORE) (Python $$($(NEWEST_VENV)/bin/python -V | cut -d' ' -f2))"; \
		$(NEWEST_VENV)/bin/pytest -q -p no:cacheprovider tests/unit; \
	else $(NEWEST_SKIPPED); fi

sanity: venv
	bash tests/sanity/run.sh $(VENV)

# ansible-test sanity of the newest release, on its own Python, with the same empty ignore files.
sanity-newest: newest-venv
	@if [ -n "$(NEWEST_PYTHON)" ]; then \
		echo "-- ansible-test sanity of ansible-core $(NEWEST_CORE)"; \
		bash tests/sanity/run.sh $(NEWEST_VENV); \
	else $(NEWEST_SKIPPED); fi

lint: venv
	PATH=$(VENV)/bin:$$PATH $(VENV)/bin/ansible-lint --profile production playbooks extensions/awx/playbooks $(wildcard roles/*) extensions/molecule

# The documentation site: antsibull-docs renders every plugin and role and the extra docs (docs/docsite/), the
# guides of docs/*.md join them, Sphinx builds HTML into $(DOCS_DIR)/html. Offline; warnings are errors.
docs: venv
	bash docs/docsite/build.sh $(VENV) $(DOCS_DIR)

# What antsibull-docs checks before a site is built: plugin and role docs, extra-docs.yml and the rst it lists.
docs-lint: venv
	PATH=$(VENV)/bin:$$PATH $(VENV)/bin/antsibull-docs lint-collection-docs --plugin-docs .

# The collection as ansible-galaxy builds it: only what a user installs, and ansible-doc reads every plugin from a
# fresh install of it.
packaging: venv
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/packaging

# The integration suite runs on three labs at once (pytest-xdist, one test file at a time per lab): most of its time
# is guests booting and runs waiting on them, and a third lab fills the cores' idle gaps that two left (94% busy
# against 86%; 1,460 s against 1,597 s, docs/performance.md). INTEGRATION_LABS=1 runs it on one.
# Files go to the labs longest first (tests/integration/durations.json), so no lab ends the run alone on a long one;
# every run writes its files' times to tests/output/integration-durations.json, make durations copies them there.
# The inventory tests run a second time under the minimum ansible-core: before 2.19 the plugin marks strings
# unsafe itself, and warnings and constructed values look different.
INTEGRATION_LABS ?= 3
INTEGRATION_LAB_DIRS = $(foreach n,$(shell seq 1 $(INTEGRATION_LABS)),$(TEST_LAB)$(n))
INTEGRATION_LABS_DOWN = for dir in $(INTEGRATION_LAB_DIRS); do python3 lab/lab.py down --dir $$dir; done
# The labs come up at once (each takes about 14 s, mostly waiting on its daemons); when one fails, all go down.
# The suite starts some 1,500 Python processes (module runs, ansible-playbook) that import the collection's code
# from this tree: it is compiled once first, so none compiles it again (0.4 CPU s a module run without bytecode,
# 0.25 with; Python reads bytecode even where PYTHONDONTWRITEBYTECODE keeps it from writing any).
# $(1): more options of lab.py up.
INTEGRATION_LABS_UP = pids=; for dir in $(INTEGRATION_LAB_DIRS); do \
		python3 lab/lab.py up --pools 3 --dir $$dir --image $(IMAGE_DIR)/machinery-test.qcow2 $(1) & pids="$$pids $$!"; \
	done; \
	status=0; for pid in $$pids; do wait $$pid || status=1; done; \
	if [ $$status -ne 0 ]; then $(INTEGRATION_LABS_DOWN); exit 1; fi
# The mixed fleet, last: the labs come up again with their last pool a Debian 13 host (lab.py --newer 1), and the
# files that need such a fleet run on them: moves between the releases (test_40), and the pool and machine
# lifecycles with the Debian 13 pool first (tests/integration/newer_first.py).
# On a machine of Debian 13 or later there is no newer release to mix in: the step says so instead.
MIXED_INTEGRATION := test_40_mixed_versions.py test_01_machine_pool.py test_03_machine.py
MIXED ?= $(if $(filter 12,$(HOST_RELEASE)),1,0)
MIXED_SKIPPED = echo "!!! NOT TESTED: the mixed fleet (Debian 13 pools beside the machine's) needs a Debian 12 machine," \
	"this is Debian $(HOST_RELEASE) !!!" >&2
integration: venv core-venv newest-venv image image-real debian13-lab
	$(PY) -m compileall -q plugins
	$(TIMED) integration-main $(MAKE) --no-print-directory integration-main
	$(TIMED) integration-mixed $(MAKE) --no-print-directory integration-mixed

# The labs, the suite, the inventory under the minimum core, the newest core's files, and the labs down: one step
# whose CPU counts the labs' guests, of parts that do not (tests/steptime.py).
integration-main:
	$(TIMED) labs-up $(MAKE) --no-print-directory integration-labs-up
	set -o pipefail; export MACHINERY_LAB=$(TEST_LAB)1/lab.json \
		MACHINERY_LABS=$$(printf '%s/lab.json:' $(INTEGRATION_LAB_DIRS)) \
		MACHINERY_REAL_IMAGE=$(IMAGE_DIR)/machinery-real.qcow2; \
		MACHINERY_DURATIONS_OUT=$(DURATIONS_OUT) $(TIMED) suite \
		$(VENV)/bin/pytest -q -p no:cacheprovider --durations=25 -n $(INTEGRATION_LABS) --dist loadfile \
			--no-loadscope-reorder --ignore=tests/integration/test_40_mixed_versions.py \
			--ignore=tests/integration/test_42_execution_environment.py \
			tests/integration && \
		echo "-- the inventory tests under ansible-core $(MIN_CORE)" && \
		$(TIMED) inventory-$(MIN_CORE) \
			$(CORE_BIN)/pytest -q -p no:cacheprovider tests/integration/test_07_inventory.py && \
		if [ -n "$(NEWEST_PYTHON)" ]; then \
			echo "-- the files of each plugin type under ansible-core $(NEWEST_CORE)" && \
			$(TIMED) newest-$(NEWEST_CORE) \
				$(NEWEST_VENV)/bin/pytest -q -p no:cacheprovider -n $(INTEGRATION_LABS) --dist loadfile \
				$(addprefix tests/integration/,$(NEWEST_INTEGRATION)); \
		else $(NEWEST_SKIPPED); fi; \
		status=$$?; $(INTEGRATION_LABS_DOWN); exit $$status

integration-labs-up:
	$(call INTEGRATION_LABS_UP,--newer 0)

# INTEGRATION_LABS=1 make integration-mixed runs the mixed fleet's step alone, on one lab.
integration-mixed: venv image debian13-lab
ifeq ($(MIXED),1)
	@echo "-- a mixed fleet: the last pool of each lab on Debian 13's libvirt and QEMU"
	$(call INTEGRATION_LABS_UP,--newer 1 --newer-root $(DEBIAN13_LAB_DIR)/lab)
	set -o pipefail; python3 tests/integration/newer_first.py $(INTEGRATION_LAB_DIRS) && \
		export MACHINERY_LAB=$(TEST_LAB)1/lab-newer-first.json \
		MACHINERY_LABS=$$(printf '%s/lab-newer-first.json:' $(INTEGRATION_LAB_DIRS)); \
		$(VENV)/bin/pytest -q -p no:cacheprovider -n $(INTEGRATION_LABS) --dist loadfile \
			$(addprefix tests/integration/,$(MIXED_INTEGRATION)); \
		status=$$?; $(INTEGRATION_LABS_DOWN); exit $$status
else
	@$(MIXED_SKIPPED)
endif

# The execution environment, built and run: ansible-builder and podman (Debian's package) make machinery-ee:debian
# on a base image made from Debian packages (extensions/awx/ee/), then AWX's jobs run in it through ansible-runner's
# container mode against a lab of its own (3 pools, two of them used), over SSH and TLS (test_42_execution_environment.py).
EE_DIR ?= $(CURDIR)/.cache/ee
EE_LAB ?= $(CURDIR)/.lab/ee
ee: venv image
	bash extensions/awx/ee/build.sh $(EE_DIR) $(VENV) >/dev/null
	python3 lab/lab.py up --pools 3 --dir $(EE_LAB) --image $(IMAGE_DIR)/machinery-test.qcow2 --newer 0
	if [ -f $(EE_DIR)/containers.conf ]; then export CONTAINERS_CONF=$(EE_DIR)/containers.conf; fi; \
	MACHINERY_LAB=$(EE_LAB)/lab.json MACHINERY_EE_IMAGE=machinery-ee:debian \
		$(VENV)/bin/pytest -q -p no:cacheprovider tests/integration/test_42_execution_environment.py; \
		status=$$?; python3 lab/lab.py down --dir $(EE_LAB); exit $$status

# The Debian 13 root whose libvirt and QEMU a mixed lab's newer pools run (lab-up NEWER=N, the integration suite).
debian13-lab: deps
ifeq ($(MIXED),1)
	bash lab/debian13/root.sh lab $(DEBIAN13_LAB_DIR) >/dev/null
endif

# make test in two stages:
# 1. the virtual environments beside the images and the Debian 13 root of the mixed labs (a fresh machine builds
#    these, and keeps them: a fresh clone copies them), then everything but the integration suite as two jobs at a
#    time (make -j2), longest first: the roles' molecule scenarios (which use the CPU while molecule's guests boot
#    and its plays wait on them), ansible-test sanity of the pinned and of the newest ansible-core (each makes its
#    test venvs with pip once per clone), the unit tests under the three cores, ansible-lint, the docs lint and
#    the packaging test. The venvs come first because all of these need them: make -j2 passes over a goal whose
#    prerequisite runs and starts the next, so shared prerequisites undid the order. This was two stages of two
#    sides each, balanced while every clone built the real image and the Debian 13 root; with those kept, a side
#    of the first stage stood idle while the newest core's sanity ran (docs/performance.md).
# 2. the integration suite, then the inventory file under the minimum ansible-core and the files of each plugin
#    type under the newest, then the mixed fleet.
# Each parallel job shows its output whole when it ends. The apt packages come first, so no two jobs run apt-get.
# Each step runs under tests/steptime.py (timed-STEP runs make STEP so), and the table of their times ends the
# output, also when a step failed; make test's exit status is the stages'.
TEST_BUILDS := venvs image image-real debian13-lab
TEST_CHECKS := molecule sanity sanity-newest unit lint docs-lint packaging
test:
	@rm -f $(STEPS)
	@status=0; $(TIMED) total $(MAKE) --no-print-directory test-stages || status=$$?; \
		$(MAKE) --no-print-directory steps; exit $$status

test-stages:
	$(TIMED) deps $(MAKE) --no-print-directory deps
	$(MAKE) --no-print-directory -j2 --output-sync=recurse $(addprefix timed-,$(TEST_BUILDS))
	$(MAKE) --no-print-directory -j2 --output-sync=recurse $(addprefix timed-,$(TEST_CHECKS))
	$(TIMED) integration $(MAKE) --no-print-directory integration

timed-%:
	$(TIMED) $* $(MAKE) --no-print-directory $*

steps:
	@python3 tests/steptime.py $(STEPS)

# The files' times of the last make integration (tests/output/integration-durations.json, written whatever the
# outcome) into tests/integration/durations.json; a file that did not run keeps its time.
durations:
	python3 tests/integration/durations.py $(DURATIONS_OUT) tests/integration/durations.json

# make check: the loop before a commit, under 5 minutes on two cores (docs/performance.md). The unit tests under the
# pinned ansible-core, ansible-test sanity of that core and ansible-lint on one side; on the other, one integration
# file of each module family (pools and classes, machines, the batch action and the scheduler, sets and health
# checks, manifests and images, volumes, the controllers' attach, backup and migrate, the filters), each short in
# tests/integration/durations.json, on a 3-pool lab of its own brought up and torn down. Its steps' table ends it.
# make test still runs everything else: the other cores, the other files, molecule, packaging, the mixed fleet.
CHECK_LAB ?= $(CURDIR)/.lab/check
CHECK_STEPS ?= $(CURDIR)/tests/output/check-steps.jsonl
CHECK_INTEGRATION := test_01_machine_pool.py test_03_machine.py test_27_placement.py test_14_machine_sets.py \
	test_34_ironcore_upstream.py test_22_volumes.py test_48_controllers.py test_37_filters.py
check: venv image
	@rm -f $(CHECK_STEPS)
	@status=0; $(MAKE) --no-print-directory STEPS=$(CHECK_STEPS) -j2 --output-sync=recurse \
		timed-check-static timed-check-integration || status=$$?; \
		python3 tests/steptime.py $(CHECK_STEPS); exit $$status

check-static: venv
	$(TIMED) unit $(VENV)/bin/pytest -q -p no:cacheprovider tests/unit
	$(TIMED) lint $(MAKE) --no-print-directory lint
	$(TIMED) sanity $(MAKE) --no-print-directory sanity

check-integration: venv image
	$(PY) -m compileall -q plugins
	$(TIMED) lab-up python3 lab/lab.py up --pools 3 --dir $(CHECK_LAB) --image $(IMAGE_DIR)/machinery-test.qcow2 || \
		{ python3 lab/lab.py down --dir $(CHECK_LAB); exit 1; }
	MACHINERY_LAB=$(CHECK_LAB)/lab.json $(TIMED) integration \
		$(VENV)/bin/pytest -q -p no:cacheprovider $(addprefix tests/integration/,$(CHECK_INTEGRATION)); \
		status=$$?; python3 lab/lab.py down --dir $(CHECK_LAB); exit $$status

checks: venv
	$(MAKE) --no-print-directory sanity-and-lint
	$(MAKE) --no-print-directory docs-lint
	$(MAKE) --no-print-directory packaging

sanity-and-lint: venv
	$(TIMED) sanity $(MAKE) --no-print-directory sanity
	$(TIMED) lint $(MAKE) --no-print-directory lint

molecule-and-packaging: venv image
	$(TIMED) molecule $(MAKE) --no-print-directory molecule
	$(TIMED) docs-lint $(MAKE) --no-print-directory docs-lint
	$(TIMED) packaging $(MAKE) --no-print-directory packaging

# The roles' molecule scenarios (extensions/molecule/: create, converge, idempotence, verify, destroy) on a 2-pool
# lab of their own. molecule runs ansible-config and ansible-playbook from PATH.
molecule: venv image
	python3 lab/lab.py up --pools 2 --dir $(MOLECULE_LAB) --image $(IMAGE_DIR)/machinery-test.qcow2
	export PATH=$(VENV)/bin:$$PATH MACHINERY_LAB=$(MOLECULE_LAB)/lab.json ANSIBLE_NOCOLOR=1 NO_COLOR=1; \
		$(VENV)/bin/molecule test --all; \
		status=$$?; python3 lab/lab.py down --dir $(MOLECULE_LAB); exit $$status

# The README's two commands on Debian 13: a trixie root made with mmdebstrap (kept in $(DEBIAN13_DIR)/base, made
# again when missing), copied afresh to $(DEBIAN13_DIR)/machine, entered with the mounts the lab needs and this
# repository at /src/machinery, with .venv, .lab and .cache of its own. RUN='make unit' runs another command in
# that copy instead (kept between runs).
debian13:
	bash lab/debian13/root.sh build $(DEBIAN13_DIR)
	$(if $(RUN),bash lab/debian13/root.sh run $(DEBIAN13_DIR) '$(RUN)',time bash lab/debian13/root.sh readme $(DEBIAN13_DIR))

# The parallel floor wants 10 pools (300 machines on 10); the plots want matplotlib (benchmarks/requirements.txt).
# benchmark-scale: 10,000 machines over 20 pools for the inventory and the 1,000-machine runs of docs/performance.md.
benchmark: POOLS = 10
benchmark: venv lab-up
	$(VENV)/bin/pip install -q --disable-pip-version-check -r benchmarks/requirements.txt
	$(PY) benchmarks/scheduler_scale.py
	$(PY) benchmarks/parallel_floor.py --lab $(LAB)/lab.json 30:3 300:10
	$(PY) benchmarks/info_scale.py --lab $(LAB)/lab.json 30 300 1000
	$(PY) benchmarks/create_floor.py --lab $(LAB)/lab.json
	$(PY) benchmarks/converge.py --lab $(LAB)/lab.json --community $$(bash benchmarks/community_libvirt.sh $(VENV))
	$(PY) benchmarks/hotplug.py --lab $(LAB)/lab.json
	$(PY) benchmarks/fleet_sets.py --lab $(LAB)/lab.json
	$(PY) benchmarks/inventory_scale.py --lab $(LAB)/lab.json --community $$(bash benchmarks/community_libvirt.sh $(VENV)) \
		--core 2.18.19 --core $(MIN_CORE)

benchmark-scale: POOLS = 20
benchmark-scale: venv lab-up
	$(VENV)/bin/pip install -q --disable-pip-version-check -r benchmarks/requirements.txt
	$(PY) benchmarks/parallel_floor.py --lab $(LAB)/lab.json 30:3 300:10 1000:10 --plot docs/images/create.png
	$(PY) benchmarks/info_scale.py --lab $(LAB)/lab.json --plot docs/images/info.png 30 300 1000
	$(PY) benchmarks/grow_scale.py --lab $(LAB)/lab.json --hold 1000 --add 100 --pools 10
	$(PY) benchmarks/grow_scale.py --lab $(LAB)/lab.json --kind set --hold 1000 --add 100 --pools 10
	$(PY) benchmarks/inventory_scale.py --lab $(LAB)/lab.json --count 10000 --rounds 3

clean:
	python3 lab/lab.py down --dir $(LAB) --purge || true
	rm -rf $(VENV) tests/output
