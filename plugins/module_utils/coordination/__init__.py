# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How runs keep out of each other's way: the holds on machines (docs/concurrency.md is the reference)."""
