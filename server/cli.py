"""Command line: agentserve serve | route | bench | convert-model | make-test-model."""

from __future__ import annotations

import argparse
import logging
import sys

from server import __version__
from server.config import ConfigError, Settings, load_settings
from server.model_store import ModelFileMissing


def _add_settings_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", help="YAML settings file, or a config shipped in the package by name (vllm, embedded)"
    )
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--model", help="'embedded', a model folder, or a .gguf file")
    p.add_argument(
        "--engine",
        choices=["hf", "vllm", "llamacpp"],
        help="inference engine (default hf; a .gguf model: llamacpp when installed)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device for the hf engine")


def _settings(args: argparse.Namespace, **extra: object) -> Settings:
    return load_settings(
        args.config,
        host=args.host,
        port=args.port,
        model=args.model,
        engine=args.engine,
        device=args.device,
        **extra,
    )


def _bench(argv: list[str]) -> int:
    """Hand everything after ``bench`` to benchmarks/run.py (found beside the server package)."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"
    if not script.is_file():
        print(f"agentserve: {script} not found: run 'bench' from a source checkout", file=sys.stderr)
        return 2
    saved = sys.argv
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list[:1] == ["bench"]:
        return _bench(args_list[1:])
    parser = argparse.ArgumentParser(prog="agentserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"agentserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the OpenAI API (one in-process worker by default)")
    _add_settings_flags(serve)
    serve.add_argument("--workers", type=int, help="N worker processes behind a router (default 1)")

    route = sub.add_parser("route", help="route sessions to workers that run elsewhere")
    _add_settings_flags(route)
    route.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="URL",
        help="worker base URL, or ID=URL (the id feeds the session hash: give every "
        "router replica the same ids); repeat per worker",
    )
    route.add_argument(
        "--workers-dns",
        metavar="NAME:PORT",
        help="discover workers from DNS (e.g. a Kubernetes headless Service), "
        "re-resolved every routing.dns_interval_s",
    )
    route.add_argument(
        "--policy",
        choices=["prefix_affinity", "affinity", "prefix", "round_robin", "least_loaded"],
        help="routing policy (default: routing.policy in the config, else affinity)",
    )
    route.add_argument("--load-epsilon", type=float, help="affinity: spill above (1+eps) x mean in-flight")

    sub.add_parser(
        "bench",
        help="benchmarks: TTFT and cache hit rate on agent traces (agentserve bench --help)",
        add_help=False,
    )

    convert = sub.add_parser("convert-model", help="convert the embedded GGUF (or --model X.gguf) once")
    convert.add_argument("--model", default="embedded")

    make = sub.add_parser(
        "make-test-model",
        help="a tiny random-weight model folder with a family's real tokenizer (serve it with --model OUT)",
    )
    make.add_argument("--family", required=True, help="hermes, llama3_json, mistral[:v3..v13], qwen3_coder")
    make.add_argument("out", help="folder to write (replaced if it exists)")
    make.add_argument("--layers", type=int, default=2)
    make.add_argument("--hidden", type=int, default=64)
    make.add_argument("--seed", type=int, default=0)
    make.add_argument(
        "--max-positions",
        type=int,
        default=None,
        help="context window (default: the family's, 8192); Claude Code / Codex need 32768+",
    )

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health check is noise
    try:
        if args.command == "serve":
            settings = _settings(args, workers=args.workers)
            from server.model_store import check_model

            # a missing model is a one-line exit 2 in half a second: before the app's imports (torch, ~5 s)
            check_model(settings.model)
            from server.app import check_settings

            check_settings(settings)  # before any worker starts
            if settings.workers > 1:
                from server.routing.cluster import ClusterError, serve_cluster

                try:
                    serve_cluster(settings)
                except ClusterError as exc:
                    print(f"agentserve: {exc}", file=sys.stderr)
                    return 1
            else:
                from server.app import serve_worker

                serve_worker(settings)
        elif args.command == "route":
            # only the flags given: nested settings merge with the YAML's routing section
            routing = {
                k: v
                for k, v in (("policy", args.policy), ("load_epsilon", args.load_epsilon))
                if v is not None
            }
            settings = _settings(args, routing=routing or None)
            from server.auth import check_router_auth
            from server.routing.router_app import serve_router

            check_router_auth(settings.auth)
            if not args.worker and not args.workers_dns:
                raise ConfigError(
                    "no workers: pass --worker URL (repeat per worker) or --workers-dns NAME:PORT"
                )
            if args.workers_dns:
                serve_router(settings, args.worker, workers_dns=args.workers_dns)
            else:
                serve_router(settings, args.worker)
        elif args.command == "make-test-model":
            from server.families.family import FamilyError
            from server.families.test_model import make_test_model

            try:
                print(
                    make_test_model(
                        args.family, args.out, args.hidden, args.layers, args.seed, args.max_positions
                    )
                )
            except FamilyError as exc:
                print(f"agentserve: {exc}", file=sys.stderr)
                return 2
        elif args.command == "convert-model":
            from server.model_store import resolve_model

            print(resolve_model(args.model))
    except (ConfigError, ModelFileMissing) as exc:
        print(f"agentserve: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
