"""benchmarks/peers/peer_common.py: the agreement verdict by hand, and the worker runner's error."""

from __future__ import annotations

import math

import pytest

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def common():
    return load_benchmark("benchmarks/peers/peer_common.py")


def test_agreement_by_hand(common):
    a = common.agreement([1.0, 3.0], [2.0, 2.0, 5.0], "sdar")
    # means 2 and 3; sds sqrt(2) and sqrt(3); se = sqrt(2/2 + 3/3) = sqrt(2) ~ 1.414; |-1| <= 2.83
    assert a["dlmrl_mean"] == 2.0 and a["sdar_mean"] == 3.0 and a["difference"] == -1.0
    assert a["dlmrl_sd"] == pytest.approx(math.sqrt(2)) and a["sdar_sd"] == pytest.approx(math.sqrt(3))
    assert a["standard_error"] == pytest.approx(math.sqrt(2)) and a["within_noise"] is True
    far = common.agreement([1.0, 1.1], [2.0, 2.1], "sdar")  # (se 0.071, difference 1)
    assert far["within_noise"] is False
    one = common.agreement([1.0], [2.0], "sdar")  # (means, no spread, no verdict)
    assert one["difference"] == -1.0 and one["standard_error"] is None and one["within_noise"] is None
    missing = common.agreement([1.0, None], [2.0, 2.0], "sdar")
    assert missing["dlmrl_mean"] is None and missing["within_noise"] is None


def test_a_failing_worker_is_one_error_with_its_stderr(common, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import sys\nsys.stderr.write('the worker broke')\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="(?s)the demo run failed \\(exit 3\\).*the worker broke"):
        common.run_worker(script, [], "demo")


def test_a_worker_returns_the_json_it_wrote(common, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import json, sys\nopen(sys.argv[sys.argv.index('--worker-out') + 1], 'w')"
                      ".write(json.dumps({'argv': sys.argv[1:-2]}))\n")
    assert common.run_worker(script, ["--x", "1"], "demo") == {"argv": ["--x", "1"]}
