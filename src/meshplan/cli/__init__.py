"""The ``meshplan`` command line: a registry of command modules on one typer app.

Each module in COMMAND_MODULES exposes ``register(app)``; adding a command is adding a module and one name here.
User errors (MeshplanError) print one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import typer

COMMAND_MODULES = ("demo", "estimate", "validate", "plan", "export", "report", "explain", "run", "calibrate",
                   "check", "memcheck")


def build_app() -> typer.Typer:
    """The typer app with every available command module registered."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      help="Plan, predict and run hybrid parallelism for large-model training.")
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(f"meshplan.cli.{name}") is not None:
            importlib.import_module(f"meshplan.cli.{name}").register(app)
    return app


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status. Usage errors are the CLI framework's (exit 2, with
    usage); MeshplanError prints one line and exits 2."""
    from meshplan.errors import MeshplanError

    app = build_app()
    try:
        app(args=argv, prog_name="meshplan", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except MeshplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())


def console() -> None:
    """setuptools console-script wrapper."""
    sys.exit(main())
