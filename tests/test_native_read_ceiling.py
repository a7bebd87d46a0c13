"""native/read_ceiling.py without a GPU: its arguments are refused before any GPU work, and its fit is exact on
points that lie on a line."""
import pytest
import torch

from native import read_ceiling as RC


def test_parse_sizes_sorted_distinct_and_refusals():
    assert RC.parse_sizes("64, 8,64,1024") == [8, 64, 1024]
    for text, msg in (("8,x", "whole number of MB"), ("0,8", "outside 1"), (f"8,{RC.MAX_MB + 1}", "outside 1"),
                      (" , ", "no sizes")):
        with pytest.raises(ValueError, match=msg):
            RC.parse_sizes(text)


def test_buffer_sizes_are_the_size_asked_for_in_whole_16_byte_words():
    for mb in (1, 8, 73, 2048):
        w = RC.half_words(mb)
        assert w % 4 == 0 and 2 * 4 * w == mb * 10**6     # two buffers of int32: mb MB in all
    assert RC.half_words(1) * 8 >= 10**6


def test_fit_recovers_fixed_part_and_rate():
    rate_tbs, fixed_us = 2.4, 7.0
    nbytes = [8e6, 64e6, 512e6]
    us = [fixed_us + b / (rate_tbs * 1e12) * 1e6 for b in nbytes]
    f, r = RC.fit(nbytes, us)
    assert abs(f - fixed_us) < 1e-6 and abs(r - rate_tbs) < 1e-9
    assert RC.fit([1e6, 2e6], [5.0, 5.0])[1] == float("inf")       # no growth with bytes: no finite rate
    with pytest.raises(ValueError, match="two distinct sizes"):
        RC.fit([1e6, 1e6], [5.0, 6.0])


@pytest.mark.parametrize("argv,msg", [(["--mb", "8"], "at least two sizes"), (["--mb", "8,y"], "whole number"),
                                      (["--samples", "0"], "at least 1"), (["--json", "."], "is a directory"),
                                      (["--json", "/nonexistent-dir/x.json"], "folder does not exist")])
def test_bad_arguments_refused_before_gpu_work(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        RC.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU answer")
def test_without_a_gpu_it_says_so(capsys):
    assert RC.main(["--mb", "8,16"]) == 2
    assert "no CUDA GPU visible" in capsys.readouterr().err
