"""native/ncu_table.py over the committed ncu prints: it recomputes the numbers native/NOTES.md section 39 quotes,
and refuses bad arguments with one line."""
from pathlib import Path

import pytest

from native import ncu_table as NT

ROOT = Path(__file__).resolve().parents[1]
CHECKS = str(ROOT / "results" / "checks") + "/"
W = 8192 * 57344


def _by_recipe(path):
    with open(CHECKS + path) as fh:
        rows = NT.table(fh.read(), weights=W)
    return {name.split("<")[1].split(",")[0] + " " + name.split("_")[1]: (n, m) for name, n, m in rows}


def test_section_39_issue_table():
    t = _by_recipe("h100_ncu_decode_m16_lowbits_xt_c4e8e42.txt")
    assert list(t) == ["rec_f16_u1 gemv", "rec_f16_u1 regs", "rec_f16_u2 regs", "rec_f16_i2 regs"]
    n, u1 = t["rec_f16_u1 gemv"]
    assert n == 5
    assert u1["Duration"] == pytest.approx(90.0, abs=0.05)
    assert u1["instructions per weight"] == pytest.approx(2.74, abs=0.005)
    assert 100 - u1["No Eligible"] == pytest.approx(53, abs=0.5)
    assert t["rec_f16_u2 regs"][1]["instructions per weight"] == pytest.approx(2.87, abs=0.005)
    assert t["rec_f16_i2 regs"][1]["Registers Per Thread"] == 122


def test_section_39_stall_table_and_the_xt_off_one():
    on = _by_recipe("h100_ncu_decode_m16_stalls_xt_b073851.txt")
    off = _by_recipe("h100_ncu_decode_m16_stalls_2a20ca5.txt")
    throttle = "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"
    cyc = "cycles per issue (sum of stalls)"
    assert on["rec_f16_u1 gemv"][1][cyc] == pytest.approx(6.86, abs=0.005)
    assert off["rec_f16_u1 gemv"][1][cyc] == pytest.approx(7.13, abs=0.005)
    assert on["rec_f16_u1 gemv"][1][throttle] == pytest.approx(1.31, abs=0.005)
    assert off["rec_f16_u1 gemv"][1][throttle] == pytest.approx(1.55, abs=0.005)
    assert on["rec_f16_i2 regs"][1][throttle] == pytest.approx(off["rec_f16_i2 regs"][1][throttle], abs=0.01)


@pytest.mark.parametrize("argv, msg", [
    ([str(ROOT / "results")], "is not a file"),
    ([str(ROOT / "README.md")], "holds no ncu kernel launches"),
    ([CHECKS + "h100_ncu_decode_m16_stalls_xt_b073851.txt", "--weights", "8192*x"], "product of positive integers"),
])
def test_bad_arguments_stop_with_one_line(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        NT.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert msg in err[-1] and "Traceback" not in "".join(err)
