"""``python -m impala_jax.run EXPERIMENT.py [section.field=value ...] [--stop KEY=VALUE ...]``

An experiment file defines a module-level ``config`` (an IMPALAConfig) and optionally ``stop``
(result paths to thresholds, as in Tune and RLlib's tuned examples). Overrides go through the
same builder methods: ``training.lr=3e-4`` calls ``config.training(lr=3e-4)``; values are
Python literals.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
import time
from pathlib import Path

EXAMPLES = """examples:
  python -m impala_jax.run experiments/cartpole.py
  python -m impala_jax.run experiments/cartpole.py training.lr=3e-4 \\
      env_runners.num_envs_per_env_runner=64 --stop num_env_steps_sampled_lifetime=200000
"""


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m impala_jax.run",
        description=__doc__.split("\n\n")[1],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("experiment", help="experiment file defining `config` (and `stop`)")
    parser.add_argument("overrides", nargs="*", help="section.field=value, e.g. training.lr=1e-3")
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="stop when result KEY (slash path) reaches VALUE; replaces the file's `stop`",
    )
    parser.add_argument("--logdir", default="runs", help="where run directories go (runs/)")
    parser.add_argument("--name", default=None, help="run name (default: the experiment's)")
    parser.add_argument("--seed", type=int, default=None, help="debugging(seed=N)")
    parser.add_argument("--quiet", action="store_true", help="no per-iteration lines")
    return parser.parse_args(argv)


def load_experiment(path: str):
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"error: experiment file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise SystemExit(f"error: experiment file {path} failed to load: {err!r}") from err
    if not hasattr(module, "config"):
        raise SystemExit(f"error: experiment file {path} defines no module-level `config`")
    return module.config, dict(getattr(module, "stop", {}) or {})


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: a string such as an env id


def apply_overrides(config, overrides: list[str]):
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, field = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"error: override {item!r} is not of the form section.field=value")
        method = getattr(config, section, None)
        if section.startswith("_") or not callable(method):
            raise SystemExit(f"error: override {item!r}: config has no section {section!r}")
        try:
            method(**{field: _literal(value)})
        except TypeError as err:
            raise SystemExit(
                f"error: override {item!r}: {section}() has no field {field!r}"
            ) from err
        except ValueError as err:
            raise SystemExit(f"error: override {item!r}: {err}") from err
    return config


def stop_reached(result: dict, stop: dict) -> str | None:
    from impala_jax.metrics import get_path

    for key, threshold in stop.items():
        try:
            value = get_path(result, key)
        except (KeyError, TypeError):
            continue
        if value == value and value >= threshold:  # NaN never stops a run
            return f"{key}={value:g} >= {threshold:g}"
    return None


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config, stop = load_experiment(args.experiment)
    config = apply_overrides(config, args.overrides)
    if args.seed is not None:
        config.debugging(seed=args.seed)
    if args.stop:
        stop = {k: _literal(v) for k, _, v in (s.partition("=") for s in args.stop)}
    try:
        config.validate()
    except ValueError as err:
        raise SystemExit(f"error: {err}") from err
    name = args.name or Path(args.experiment).stem
    run_dir = Path(args.logdir) / f"{name}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "params.json").write_text(json.dumps(config.to_dict(), indent=1, default=str))
    started = time.perf_counter()
    with config.build() as algo, open(run_dir / "result.json", "a") as log:
        while True:
            result = algo.train()
            log.write(json.dumps(result, default=float) + "\n")
            log.flush()
            if not args.quiet:
                er = result["env_runners"]
                print(
                    f"iter {result['training_iteration']:4d}  "
                    f"steps {result['num_env_steps_sampled_lifetime']:>10,d}  "
                    f"return {er['episode_return_mean']:8.2f}  "
                    f"env steps/s {result['perf']['env_steps_sampled_per_s']:>9,.0f}  "
                    f"{time.perf_counter() - started:7.1f} s",
                    flush=True,
                )
            reason = stop_reached(result, stop)
            if reason:
                break
        path = algo.save(run_dir / "checkpoint_final")
    print(f"stopped: {reason} after {time.perf_counter() - started:.1f} s; checkpoint {path}")
    print(f"run directory: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
