"""`python -m harness`: the Hydra app. See README.md for examples."""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from .specs import ConfigError, choices

GROUPS = ("experiment", "model", "precision", "gpu", "kernel")


def check_argv(argv: list[str]) -> None:
    """Unknown group choices fail at once, before Hydra starts any job of a multirun."""
    for arg in argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if not sep or key not in GROUPS:
            continue
        if value.startswith(("choice(", "range(", "glob(")):
            continue
        valid = choices(key)
        for v in (s.strip() for s in value.split(",")):
            if v and v != "null" and v not in valid:
                raise ConfigError(f"unknown {key} {v!r}; valid {key} choices: {', '.join(valid)}")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from .runner import run_job
    try:
        run_job(cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)


def _multirun_flag_last(argv: list[str]) -> list[str]:
    """Let `-m` stand anywhere (Hydra's parser wants overrides before it)."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return [a for a in argv if a not in flags] + flags


if __name__ == "__main__":
    sys.argv[1:] = _multirun_flag_last(sys.argv[1:])
    try:
        check_argv(sys.argv[1:])
        runs_jobs = not any(a.startswith(("--cfg", "-c", "--info", "--help", "-h", "--hydra-help", "--resolve"))
                            for a in sys.argv[1:])
        if runs_jobs and ("-m" in sys.argv or "--multirun" in sys.argv):
            from .preflight import check_multirun
            n = check_multirun([a for a in sys.argv[1:] if "=" in a or a.startswith("~")])
            print(f"preflight: {n} job(s) planned, no config error", file=sys.stderr)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    main()
