"""The command line run as a program (the console script, `python -m cuda_agent`): SIGTERM taken as Ctrl-C
(signals.py), with `--json` a bad option value answered on stdout as every other error is, and help laid out for
the terminal's width (rich's panels below 100 columns break choices mid-word: click's plain layout there)."""

from __future__ import annotations

import json
import shutil
import sys

import typer

from .signals import sigterm_as_interrupt

RICH_HELP_COLUMNS = 100  # narrower terminals (and pipes: 80) get click's plain help


class App(typer.Typer):
    def __call__(self, *args, **kwargs):
        if shutil.get_terminal_size().columns < RICH_HELP_COLUMNS:
            for app in (self, *(group.typer_instance for group in self.registered_groups)):
                app.rich_markup_mode = None
        with sigterm_as_interrupt():
            if "--json" not in sys.argv[1:] or "standalone_mode" in kwargs:
                return super().__call__(*args, **kwargs)
            return self._with_json_errors(*args, **kwargs)

    def _with_json_errors(self, *args, **kwargs):
        """Click's own errors (a bad option value, an unknown option) also as {"error", "exit_code"} on stdout."""
        try:
            code = super().__call__(*args, standalone_mode=False, **kwargs)
        except typer.TyperException as exc:
            sys.stdout.write(json.dumps({"error": exc.format_message(), "exit_code": exc.exit_code}) + "\n")
            sys.stderr.write(f"error: {exc.format_message()}\n")
            sys.exit(exc.exit_code)
        except typer.Abort:  # end of input at a prompt
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
