"""python -m serve predict | verify | search | serve: see serve.cli, serve.search.cli and serve.app."""

import sys

USAGE = """\
    python -m serve predict SPEC.json [--model URI] [--probe NAME] -> {"model": ..., "predictions": [...]}
    python -m serve probe NAME [--model URI]            -> how a probe's runs correct the model (collect.probe)
    python -m serve verify SPEC.json [--budget-s 3600]  -> each plan's peak traced under fake tensors, beside its
                                                           prediction
    python -m serve search SEARCH.json [--plot out.png] -> the top plans as a table
    python -m serve serve [--port 8000]                 -> the HTTP service (make serve)"""


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("predict", "probe", "search", "serve", "verify"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    # each command imports only what it runs: a prediction's start-up is part of its answer time
    command, rest = argv[0], argv[1:]
    if command == "search":
        from serve.search.cli import main as run  # lazy: start-up
    elif command == "serve":
        from serve.app import main as run  # lazy: start-up
    elif command == "verify":
        from serve.verify.cli import main as run  # lazy: start-up
    elif command == "probe":
        from serve.cli import probe_main as run  # lazy: start-up
    else:
        from serve.cli import main as run  # lazy: start-up
    run(rest)


if __name__ == "__main__":
    main(sys.argv[1:])
