# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The core every resource kind shares: options, convergence, XML elements, errors, validation, the libvirt connection."""
