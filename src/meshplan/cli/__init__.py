"""The ``meshplan`` command line: a registry of command modules on one typer app.

Each module in COMMAND_MODULES exposes ``register(app)``; adding a command is adding a module and one name here.
User errors (MeshplanError) print one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys

import typer

COMMAND_MODULES = ("demo", "estimate", "validate", "plan", "replan", "serve", "export", "report", "explain", "run",
                   "calibrate", "check", "memcheck")


def build_app() -> typer.Typer:
    """The typer app with every available command module registered."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      help="Plan, predict and run hybrid parallelism for large-model training and serving.")
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(f"meshplan.cli.{name}") is not None:
            importlib.import_module(f"meshplan.cli.{name}").register(app)
    return app


def _click_errors() -> tuple[type, type]:
    """The CLI framework's error and abort classes (typer >= 0.20 carries its own copy of click)."""
    try:
        from typer._click.exceptions import ClickException
    except ImportError:
        from click.exceptions import ClickException
    return ClickException, typer.Abort


class Interrupted(BaseException):
    """Ctrl-C in a command that does not handle it itself (the CLI framework would turn a KeyboardInterrupt
    into a silent exit 130)."""


def _on_sigint(signum, frame) -> None:
    raise Interrupted()


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status. Usage errors (unknown option, bad number) and MeshplanError
    print one line on stderr and exit 2; ``--help`` and a bare ``meshplan`` print help and exit 0."""
    from meshplan.errors import MeshplanError

    usage_error, abort = _click_errors()
    app = build_app()
    previous = signal.signal(signal.SIGINT, _on_sigint) if _main_thread() else None
    try:
        code = app(args=argv, prog_name="meshplan", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except usage_error as exc:
        # One line, as for every other bad input: what was wrong, and where the valid values are listed.
        if not exc.format_message():  # a bare command: its help is printed already
            return 0
        ctx = getattr(exc, "ctx", None)
        where = f"meshplan {ctx.info_name} --help" if ctx is not None and ctx.parent else "meshplan --help"
        print(f"error: {exc.format_message()} (see {where})", file=sys.stderr)
        return exc.exit_code
    except abort:
        print("aborted", file=sys.stderr)
        return 130
    except MeshplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A path the user gave that cannot be read or written (commands check theirs first; this is the net).
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted):
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())


def console() -> None:
    """setuptools console-script wrapper."""
    sys.exit(main())
