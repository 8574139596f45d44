"""vLLM's own CLI parser on exported command lines (argv after the program name): ``vllm serve`` as vllm/scripts.py
main() builds it in 0.6.0, ``vllm serve`` and ``vllm bench serve`` as vllm/entrypoints/cli/main.py main() does in
0.11 (each subcommand's ``validate`` run too), then ``AsyncEngineArgs.from_cli_args`` on a serve command."""

import sys

from parse_common import REQ, plain, run_all

if REQ["version"] == "0.6.0":
    sys.modules["triton"] = None  # the venv's triton is newer than 0.6.0's triton_utils imports; no kernel runs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    serve = parser.add_subparsers(required=True, dest="subparser").add_parser("serve")
    serve.add_argument("model_tag", type=str)
    serve.add_argument("--config", type=str, default="", required=False)
    make_arg_parser(serve)
    validate = {}
else:
    import vllm.platforms as platforms

    # no GPU here: detect the CPU platform so the config defaults can be computed
    platforms.builtin_platform_plugins["cpu"] = lambda: "vllm.platforms.cpu.CpuPlatform"
    import vllm.entrypoints.cli.benchmark.main as bench_cli
    import vllm.entrypoints.cli.serve as serve_cli
    from vllm.utils import FlexibleArgumentParser

    parser, validate = FlexibleArgumentParser(description="vLLM CLI"), {}
    sub = parser.add_subparsers(required=False, dest="subparser")
    for module in (serve_cli, bench_cli):
        for cmd in module.cmd_init():
            cmd.subparser_init(sub)
            validate[cmd.name] = cmd.validate
from vllm.engine.arg_utils import AsyncEngineArgs


def parse(kind, argv):
    args = parser.parse_args(argv)
    if args.subparser in validate:
        validate[args.subparser](args)
    if args.subparser == "serve":
        args.model = args.model_tag  # what ServeSubcommand.cmd does before building the engine arguments
        AsyncEngineArgs.from_cli_args(args)
    return {k: plain(v) for k, v in vars(args).items() if k != "dispatch_function"}


run_all(parse)
