"""harness/impls.py over the one registry (kernels/baselines): the planner asks it once per point,
conf/kernel/*.yaml restates no support facts, get() keeps the Problem -> Prepared API, env_key."""
import importlib.metadata

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness import impls
from harness.impls import Prepared, Problem
from harness.specs import CONF_DIR, Precision
from kernels import Unavailable, Unsupported
from kernels.baselines import REGISTRY

KERNEL_YAMLS = sorted((CONF_DIR / "kernel").glob("*.yaml"))


def _prec(name, kind, bits, e=0, m=0, act="f16", g=128):
    return Precision(name, kind, bits, e, m, act, g)


U4, F6 = _prec("u4", "uint", 4), _prec("f6e3m2", "float", 6, 3, 2, g=-1)


def test_kernel_yamls_name_a_registered_impl_and_no_support_facts():
    seen = set()
    for path in KERNEL_YAMLS:
        d = OmegaConf.to_container(OmegaConf.load(path))
        assert d["name"] == path.stem and d.get("description")
        if d["impl"] not in REGISTRY:          # another benchmark's kernel (e.g. native)
            continue
        seen.add(d["impl"])
        assert not {"weight_kinds", "act_dtypes"} & set(d), f"{path.name} restates what the registry says"
    assert seen == set(REGISTRY)               # every registered implementation has its Hydra choice


def test_matmul_experiments_name_registered_kernels():
    for path in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        exp = OmegaConf.load(path).experiment
        if exp.get("benchmark") != "weight_only_matmul":      # (some set it through defaults)
            continue
        for k in exp.kernels:
            assert impls.resolve(k) in REGISTRY, (path.name, k)


@pytest.mark.parametrize("exp", ["tilus_fig10", "tilus_fig11", "tilus_fig14"])
def test_tilus_figures_run_the_papers_triton_baseline(exp):
    assert "triton_plain" in OmegaConf.load(CONF_DIR / "experiment" / f"{exp}.yaml").experiment.kernels


def test_resolve_names():
    assert impls.resolve("triton") == "triton_lowbit"           # the kernel config's impl
    assert impls.resolve("triton_lowbit") == "triton_lowbit"
    assert impls.resolve("triton_plain") == "triton_plain"
    with pytest.raises(Unavailable, match="registered"):
        impls.resolve("no_such_kernel")
    assert impls.is_dense("cublas") and not impls.is_dense("tilus")


def test_reason_at_plan_time():
    assert impls.reason("triton_plain", U4, 1, 8192, 57344) is None
    assert "32-bit words" in impls.reason("triton_plain", F6, 1, 8192, 57344)
    assert impls.reason("tilus", U4, 12288, 8192, 57344) is None          # prefill: dequantize + cuBLAS
    assert impls.reason("quantllm", F6, 16, 8192, 57344) is None
    assert impls.reason("marlin", U4, 16, 8192, 57344) is not None        # dense Marlin has no zero points
    assert impls.reason("cublas", U4) is not None


def test_env_key():
    def ver(d):
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            return "missing"
    assert impls.env_key("gemlite") == f"gemlite={ver('gemlite')}"
    assert impls.env_key("tilus") == f"tilus={ver('tilus')};apache-tvm-ffi={ver('apache-tvm-ffi')}"
    assert impls.env_key("marlin") == (f"marlin-kernels-dense={ver('marlin-kernels-dense')};"
                                        f"marlin-kernels={ver('marlin-kernels')}")
    assert impls.env_key("triton") == impls.env_key("cublas") == impls.env_key("triton_plain") == ""
    assert impls.env_key("no_such_kernel") == ""


def test_get_prepares_through_the_registry():
    from kernels.lowbit.formats import dequantize_ref, random_quantized
    qw = random_quantized(256, 64, "u4", 128, torch.float16, seed=7)
    p = impls.get("triton_plain")(Problem(1, 256, 64, U4, qw, "cpu"))
    assert isinstance(p, Prepared) and p.tolerance == REGISTRY["triton_plain"].tolerance
    x = torch.randn(1, 256, dtype=torch.float16)
    ref = x.double() @ dequantize_ref(qw)
    assert ((p.fn(x).double() - ref).norm() / ref.norm()).item() < 2e-3
    assert p.config_for(1).startswith("bm16")
    w = torch.randn(256, 64).to(torch.float16)
    p = impls.get("cublas")(Problem(3, 256, 64, Precision("f16", "dense", 16, 0, 0, "f16", -1), w, "cpu"))
    assert p.tolerance is None and p.config_for(3) == "torch.matmul"
    with pytest.raises(Unsupported, match="32-bit words"):
        impls.get("triton_plain")(Problem(1, 256, 64, F6, random_quantized(256, 64, "f6e3m2", -1), "cpu"))


def _plan(exp, precision):
    from harness.runner import build_context
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={exp}", f"precision={precision}",
                                                       "run.device=cuda"])
    return build_context(cfg, plan_only=True)[2]


def test_planner_records_skip_reasons_and_env_once_per_point():
    pts = _plan("tilus_fig14", "f6e3m2")
    by = {}
    for p in pts:
        by.setdefault(p.impl, []).append(p)
    assert {p.skip_reason for p in by["triton_plain"]} == {impls.reason("triton_plain", F6)}
    assert all(p.skip_reason is None for p in by["tilus"])                 # every M, prefill included
    assert all(p.skip_reason is None for p in by["quantllm"])
    assert all(p.weight_dtype == "f16" and p.skip_reason is None for p in by["cublas"])
    assert {p.env for p in by["gemlite"]} == {impls.env_key("gemlite")}
    assert {p.env for p in by["triton"]} == {""}
    assert max(p.M for p in by["tilus"]) == 12288
