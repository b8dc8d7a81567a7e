# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One machine: its spec, domain, status, capabilities, boot configuration, images, attachments, backups and moves."""
