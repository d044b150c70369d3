"""`cuda-agent` command line: a thin layer over the Python API, one module per command group, each registering its
commands on `common.app` as it is imported (in the order `--help` lists them)."""

from . import judge, agent, task, export, report, model, data, train, expert, heldout, recipe  # noqa: F401, I001  (registration, in this order)
from .common import app

__all__ = ["app"]
