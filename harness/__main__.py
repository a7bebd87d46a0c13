"""`python -m harness`: the Hydra app. See README.md for examples, `python -m harness --help` for a summary.

Before Hydra starts, the command line is checked as a whole: unknown config choices, bad values
and typo'd keys stop here with one line (exit 2), before any job (and any GPU work) starts. With
`-m`, every job of the sweep is planned first. Whether Triton kernels are interpreted (no GPU) is
decided here, once, before anything imports Triton.
"""
from __future__ import annotations

import os
import sys

GROUPS = ("experiment", "model", "precision", "gpu", "kernel")
FAILED_JOBS: list[str] = []


def check_argv(argv: list[str]) -> None:
    """Unknown group choices fail at once, before Hydra starts any job of a multirun."""
    from .specs import ConfigError, choices

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


def choose_interpreter(argv: list[str]) -> None:
    """TRITON_INTERPRET=1 when this run is on the CPU (run.device=cpu, or auto without a GPU)."""
    wants = [a.partition("=")[2] for a in argv if a.partition("=")[0] == "run.device"]
    want = wants[-1] if wants else "auto"
    devices = {d.strip() for d in want.split(",")}
    if devices == {"cpu"}:
        os.environ["TRITON_INTERPRET"] = "1"
    elif devices == {"auto"}:
        import torch
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"


def _multirun_flag_last(argv: list[str]) -> list[str]:
    """Let `-m` stand anywhere (Hydra's parser wants overrides before it)."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return [a for a in argv if a not in flags] + flags


def print_help() -> None:
    from omegaconf import OmegaConf

    from .specs import CONF_DIR, choices

    print(__doc__.split("\n")[0].split(":", 1)[0] + ": measure the papers' experiments into tidy CSVs.\n")
    print("Experiments (experiment=NAME; `-m` runs its own sweep):")
    for e in choices("experiment"):
        d = OmegaConf.load(CONF_DIR / "experiment" / f"{e}.yaml").get("experiment", {})
        fig = d.get("figure", "")
        print(f"  {e:<16} {d.get('description', '')}" + (f" [{fig}]" if fig and fig != e else ""))
    print("\nConfig groups (GROUP=CHOICE):")
    for g in GROUPS:
        print(f"  {g + ':':<11} " + ", ".join(c for c in choices(g) if c != "auto" or g == "gpu"))
    print("\nKnobs: run.results_dir run.resume run.device(auto|cuda|cpu) run.seed run.progress "
          "timing.samples timing.warmup_ms timing.flush_l2 timing.cuda_graph timing.host_ahead; "
          "experiment.M=[1,16] and experiment.params.* per experiment (see conf/experiment/NAME.yaml)")
    print("\nExamples:")
    print("  python -m harness experiment=tilus_fig10 -m                      # Tilus Fig. 10, its own sweep")
    print("  python -m harness experiment=gemm_shapes model=llama3_70b,gemma2_9b precision=f16 -m")
    print("  python -m harness experiment=smoke kernel=triton run.device=cpu precision=i4")
    print("\nResults: results/<gpu>/<experiment>/results.csv; figures and report: make figures. "
          "Hydra's own help: --hydra-help. More: README.md")


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    @hydra.main(config_path="../conf", config_name="config", version_base="1.3")
    def app(cfg: DictConfig) -> None:
        from .runner import Interrupted, run_job
        from .specs import ConfigError
        try:
            run_job(cfg)
        except ConfigError as e:
            print(f"config error: {e}", file=sys.stderr)
            sys.exit(2)
        except Interrupted as e:
            print(str(e), file=sys.stderr)
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - a failed job is reported and the sweep goes on
            from hydra.core.hydra_config import HydraConfig
            try:
                job = " ".join(HydraConfig.get().overrides.task)
            except Exception:
                job = ""
            line = f"job [{job}] failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            print(line, file=sys.stderr)
            FAILED_JOBS.append(line)

    app()


def cli() -> int:
    argv = _multirun_flag_last(sys.argv[1:])
    sys.argv[1:] = argv
    if any(a in ("--help", "-h") for a in argv):
        print_help()
        return 0
    from .specs import ConfigError
    try:
        check_argv(argv)
        choose_interpreter(argv)
        runs_jobs = not any(a.startswith(("--cfg", "-c", "--info", "--hydra-help", "--resolve", "--package", "-p"))
                            for a in argv)
        if runs_jobs:
            from .preflight import check_jobs
            multirun = "-m" in argv or "--multirun" in argv
            n = check_jobs([a for a in argv if "=" in a or a.startswith("~")], multirun)
            if multirun:
                print(f"preflight: {n} job(s) planned, no config error", file=sys.stderr)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: every finished point is kept; the same command resumes.", file=sys.stderr)
        return 130
    if FAILED_JOBS:
        print(f"{len(FAILED_JOBS)} job(s) failed:\n  " + "\n  ".join(FAILED_JOBS), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli())
