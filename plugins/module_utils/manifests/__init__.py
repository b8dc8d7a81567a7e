# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes-style manifests (IronCore, OpenShift Machine API, KupenStack, vitistack) applied to libvirt pools."""
