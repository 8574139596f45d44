"""SGLang's own parsers on exported command lines (argv after ``python -m module``): ``launch_server``'s
``ServerArgs.add_cli_args`` + ``ServerArgs.from_cli_args`` (its ``__post_init__`` fills and checks the rest), and
``bench_serving``'s parser (0.3.0 builds it under ``if __name__ == "__main__"``; 0.5's ``cli_main`` with the run
replaced)."""

import argparse
import ast
import dataclasses
import importlib.abc
import importlib.machinery
import sys
import types
from unittest import mock

from parse_common import REQ, plain, run_all

if REQ["version"] != "0.3.0":
    import transformers.utils.import_utils  # noqa: F401 - first, so transformers records "no torchvision"

    class TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        """torchvision (no CPU build installable beside this torch) only feeds multimodal model configs."""

        def find_spec(self, name, path=None, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            m = mock.MagicMock()
            m.__spec__, m.__path__, m.__name__ = spec, [], spec.name
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, TorchvisionStub())
    # bench_serving imports one constant from here (sglang/srt/disaggregation/utils.py FAKE_BOOTSTRAP_HOST); the
    # module itself pulls in the model layers and GPU kernels
    stub = types.ModuleType("sglang.srt.disaggregation.utils")
    stub.FAKE_BOOTSTRAP_HOST = "2.2.2.2"
    sys.modules[stub.__name__] = stub
from sglang.srt.server_args import ServerArgs


def bench(argv):
    sys.argv = ["bench_serving", *argv]
    if REQ["version"] == "0.3.0":
        import sglang.bench_serving as bench_module

        with open(bench_module.__file__) as f:
            tree = ast.parse(f.read())
        main = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)][0]
        body = [s for s in main.body if "run_benchmark" not in ast.unparse(s)]
        ns = dict(vars(bench_module))
        exec(compile(ast.Module(body=body, type_ignores=[]), bench_module.__file__, "exec"), ns)
        return ns["args"]
    import sglang.benchmark.serving as serving  # what `python -m sglang.bench_serving` runs in 0.5

    got = []
    serving.run_benchmark = got.append
    serving.cli_main()
    return got[0]


def parse(kind, argv):
    if kind == "bench":
        return {k: plain(v) for k, v in vars(bench(argv)).items()}
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server = ServerArgs.from_cli_args(parser.parse_args(argv))
    names = getattr(server, "__struct_fields__", None) or [f.name for f in dataclasses.fields(server)]  # 0.5: msgspec
    return {k: plain(getattr(server, k)) for k in names}


run_all(parse)
