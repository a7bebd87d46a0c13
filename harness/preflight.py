"""Plan every job of a run before the first one starts, so a bad value in the last job of a
multirun fails at once instead of after the first jobs' GPU work.

The job list is what Hydra's basic sweeper will launch: the command line's sweeps
combined with the experiment's own `hydra.sweeper.params` (the command line wins).
Whatever Hydra or OmegaConf reject (a typo'd key, a missing launcher, a value of the wrong
type) becomes one ConfigError line here instead of Hydra's traceback.
"""
from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from .specs import CONF_DIR, ConfigError


def _one_line(e: Exception) -> str:
    msg = str(e).strip() or type(e).__name__
    for cause in (e.__cause__, e.__context__):       # Hydra wraps the useful message
        if cause is not None and str(cause).strip():
            msg = f"{msg.splitlines()[0]} ({str(cause).strip().splitlines()[0]})"
            break
    return " ".join(msg.splitlines()[0].split()) if "\n" in msg else " ".join(msg.split())


def expand_jobs(overrides: list[str], multirun: bool = True) -> list[list[str]]:
    parser = OverridesParser.create()
    try:
        cli = parser.parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001 - Hydra's parse errors as one line
        raise ConfigError(f"cannot parse the command line: {_one_line(e)}") from None
    if not multirun:
        return [overrides]
    exp = [o for o in cli if o.key_or_group == "experiment"]
    experiments = list(exp[0].sweep_string_iterator()) if exp and exp[0].is_sweep_override() else \
        ([exp[0].value()] if exp else [None])
    rest = [o for o in cli if o.key_or_group != "experiment"]
    jobs = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for e in experiments:
            head = [f"experiment={e}"] if e else []
            fixed = head + [o.input_line for o in rest if not o.is_sweep_override()]
            try:
                cfg = compose(config_name="config", overrides=fixed, return_hydra_config=True)
            except Exception as err:  # noqa: BLE001
                raise ConfigError(_one_line(err)) from None
            params = cfg.hydra.sweeper.get("params") or {}
            given = {o.key_or_group for o in rest}
            extra = parser.parse_overrides([f"{k}={v}" for k, v in params.items() if k not in given])
            for batch in BasicSweeper.split_arguments(rest + extra, None):
                jobs += [head + job for job in batch]
    return jobs


def check_jobs(overrides: list[str], multirun: bool = True) -> int:
    """Plan every job (no GPU work); raise ConfigError naming the job with a bad value."""
    from .runner import build_context, check_writable, results_root

    jobs = expand_jobs(overrides, multirun)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in jobs:
            where = f"in job [{' '.join(job)}]: " if multirun else ""
            try:
                cfg = compose(config_name="config", overrides=job, return_hydra_config=multirun)
            except Exception as e:  # noqa: BLE001 - Hydra's composition errors as one line
                raise ConfigError(where + _one_line(e)) from None
            try:
                build_context(cfg, plan_only=True)
                check_writable(results_root(cfg))
            except ConfigError as e:
                raise ConfigError(where + str(e)) from None
    return len(jobs)


check_multirun = check_jobs
