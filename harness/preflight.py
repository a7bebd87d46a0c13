"""Plan every job of a multirun before the first one starts, so a bad value in the
last job fails at once instead of after the first jobs' GPU work.

The job list is what Hydra's basic sweeper will launch: the command line's sweeps
combined with the experiment's own `hydra.sweeper.params` (the command line wins).
"""
from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from .specs import CONF_DIR, ConfigError


def expand_jobs(overrides: list[str]) -> list[list[str]]:
    parser = OverridesParser.create()
    cli = parser.parse_overrides(overrides)
    exp = [o for o in cli if o.key_or_group == "experiment"]
    experiments = list(exp[0].sweep_string_iterator()) if exp and exp[0].is_sweep_override() else \
        ([exp[0].value()] if exp else [None])
    rest = [o for o in cli if o.key_or_group != "experiment"]
    jobs = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for e in experiments:
            head = [f"experiment={e}"] if e else []
            fixed = head + [o.input_line for o in rest if not o.is_sweep_override()]
            cfg = compose(config_name="config", overrides=fixed, return_hydra_config=True)
            params = cfg.hydra.sweeper.get("params") or {}
            given = {o.key_or_group for o in rest}
            extra = parser.parse_overrides([f"{k}={v}" for k, v in params.items() if k not in given])
            for batch in BasicSweeper.split_arguments(rest + extra, None):
                jobs += [head + job for job in batch]
    return jobs


def check_multirun(overrides: list[str]) -> int:
    """Plan every job (no GPU work); raise ConfigError naming the job with a bad value."""
    from .runner import build_context

    jobs = expand_jobs(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in jobs:
            cfg = compose(config_name="config", overrides=job)
            try:
                build_context(cfg, plan_only=True)
            except ConfigError as e:
                raise ConfigError(f"in job [{' '.join(job)}]: {e}") from None
    return len(jobs)
