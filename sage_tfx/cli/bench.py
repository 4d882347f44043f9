"""`sage bench NAME`: benchmarks, each a ratio against a baseline measured in the same run.

Every module in sage_tfx.bench is one benchmark (module ``group_by_mean`` is
``sage bench group-by-mean``); it defines ``add_arguments(parser)``,
``run(args) -> dict`` (the figures) and a one-line docstring.
"""

import importlib
import json
import pkgutil
import sys

from ._exits import EXIT_OK


def add_parser(subparsers):
    import sage_tfx.bench as benches

    parser = subparsers.add_parser("bench", help="run a benchmark (prints figures; --json for machine output)")
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(benches.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"sage_tfx.bench.{info.name}")
        doc = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else ""
        p = sub.add_parser(info.name.replace("_", "-"), help=doc, description=module.__doc__)
        p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
        module.add_arguments(p)
        p.set_defaults(func=lambda args, m=module: _run(m, args))


def _run(module, args):
    figures = module.run(args)
    if args.json:
        print(json.dumps(figures, indent=2, sort_keys=True))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    sys.stdout.flush()
    return EXIT_OK
