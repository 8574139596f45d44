"""Shared by parse_vllm.py and parse_sglang.py, which tests/unit/test_serve_export.py runs in a subprocess whose
PYTHONPATH holds one engine release's parser folder and this folder: jobs come as JSON on stdin
(``{"version": ..., "jobs": [{"kind": "serve"|"bench", "argv": [...]}]}``), each is parsed, and the parsed values
go out as one ``MESHPLAN_JSON`` line."""

import contextlib
import io
import json
import sys

REQ = json.load(sys.stdin)


def plain(v, depth=0):
    """A parsed value as JSON: scalars and lists as they are, small objects (configs) as their fields."""
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x, depth + 1) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x, depth + 1) for k, x in v.items()}
    if depth < 2 and hasattr(v, "__dict__"):
        return {k: plain(x, depth + 1) for k, x in vars(v).items() if not k.startswith("_")}
    return str(v)


def run_all(parse):
    """Parse every job with ``parse(kind, argv) -> dict``; a parser error (argparse exits) is recorded, not raised."""
    out = []
    for job in REQ["jobs"]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                out.append({"ok": True, "args": parse(job["kind"], job["argv"])})
        except SystemExit:
            out.append({"ok": False, "error": err.getvalue()[-3000:]})
        except Exception as exc:  # any refusal by the engine's own checks is a result
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    print("MESHPLAN_JSON " + json.dumps(out))
