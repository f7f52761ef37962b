"""`switchyard-strategy build MODULE.py -o OUT.wasm`: the one build command.

componentize-py wants the exported interface's functions on a class named after the interface in
the app module, and the resource's class in a top-level module named after the interface. This
writes both (forwarding to `switchyard_strategy._glue`) into a scratch folder next to a copy of
the SDK, runs componentize-py against the WIT the SDK ships, and stamps `API_VERSION` into the
result, so authors only write their own module.

`switchyard-strategy stamp FILE.wasm` stamps a component built some other way.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import API_VERSION
from .stamp import SKIPPABLE, declare_skips, stamp

_HERE = os.path.dirname(os.path.abspath(__file__))
WIT_DIR = os.path.join(_HERE, "wit")
WORLD = "strategy-component"
# Names componentize-py reserves here: the generated bindings, the interface-named resource
# module, and the app module this command writes.
_RESERVED = {"strategy", "switchyard_app", "wit_world", "componentize_py_types", "switchyard_strategy"}

APP = """\
# Written by switchyard-strategy build. componentize-py looks for the `strategy` interface's
# functions on a class named `Strategy` in this module.
import {module}  # noqa: F401 (registers the strategy through export_strategy)
from switchyard_strategy._glue import Strategy  # noqa: F401
"""

RESOURCE = """\
# Written by switchyard-strategy build. componentize-py looks for the `router` resource's class in
# a top-level module named after the interface.
from switchyard_strategy._glue import Router  # noqa: F401
"""


def build(source: str, output: str, quiet: bool = False, skips=()) -> None:
    source = os.path.abspath(source)
    if not source.endswith(".py") or not os.path.isfile(source):
        raise SystemExit(f"switchyard-strategy build: {source} is not a Python file")
    module = os.path.basename(source)[:-3]
    if module in _RESERVED:
        raise SystemExit(
            f"switchyard-strategy build: rename {os.path.basename(source)}: the module name "
            f"`{module}` is reserved for the component's glue"
        )
    output = os.path.abspath(output)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="switchyard-strategy-") as scratch:
        # Only what the component needs: the SDK (without the WIT and caches) and the glue.
        shutil.copytree(
            _HERE,
            os.path.join(scratch, "switchyard_strategy"),
            ignore=shutil.ignore_patterns("wit", "__pycache__", "build.py"),
        )
        with open(os.path.join(scratch, "switchyard_app.py"), "w") as f:
            f.write(APP.format(module=module))
        with open(os.path.join(scratch, "strategy.py"), "w") as f:
            f.write(RESOURCE)
        command = [
            sys.executable,
            "-c",
            "import sys; from componentize_py import script; sys.exit(script())",
            "-d",
            WIT_DIR,
            "-w",
            WORLD,
            "componentize",
            "-p",
            scratch,
            "-p",
            os.path.dirname(source),
            "-o",
            output,
            "switchyard_app",
        ]
        if quiet:
            command.insert(3, "-q")
        result = subprocess.run(command, cwd=scratch)
        if result.returncode != 0:
            raise SystemExit(f"switchyard-strategy build: componentize-py failed ({result.returncode})")
    stamp(output, API_VERSION)
    declare_skips(output, skips)
    if not quiet:
        size = os.path.getsize(output)
        print(
            f"built {output} ({size / 1048576:.2f} MiB, switchyard:router@{API_VERSION}) "
            f"in {time.monotonic() - started:.1f} s"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="switchyard-strategy", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="build a strategy module into a component")
    b.add_argument("module", help="the Python file that calls export_strategy")
    b.add_argument("-o", "--output", help="the component to write (default: MODULE.wasm)")
    b.add_argument("-q", "--quiet", action="store_true")
    s = commands.add_parser("stamp", help="stamp the API version into a component built otherwise")
    s.add_argument("component")
    s.add_argument("--api-version", default=API_VERSION)
    for p in (b, s):
        p.add_argument(
            "--skip",
            action="append",
            default=[],
            choices=SKIPPABLE,
            help="a call the strategy does without, which the host then skips (repeatable)",
        )
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.module, args.output or args.module[:-3] + ".wasm", args.quiet, args.skip)
    else:
        stamp(args.component, args.api_version)
        declare_skips(args.component, args.skip)


if __name__ == "__main__":
    main()
