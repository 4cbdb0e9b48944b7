"""The tutti-admin command group; the commands register themselves on it."""
from __future__ import annotations

import click

from .common import EXIT_CODES


@click.group(epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tutti", prog_name="tutti-admin")
def main():
    """Administer Tutti stores: SSD-backed KV cache for vLLM.

    A store is one or more files or block devices formatted together (PATH...);
    give all of its members, in any order, to every store command (format,
    info, check, bench).  list, attach, detach and health work on NVMe
    controllers: which driver has them (nvme or tutti.ko) and their health.
    """
