import json
from pathlib import Path

import numpy as np
import pytest

from collect.hardware.costmodel import ThreeRegionCurve, fit_three_region
from collect.hardware.records import fit_collectives, load_hardware

HARDWARE = Path(__file__).resolve().parents[2] / "data" / "hardware"


def test_fit_recovers_a_known_curve():
    truth = ThreeRegionCurve(t_s=20e-6, m1=1024, m2=2**20, bw_max=2e9, L=2.0, x0=15.0, k=0.6, b=-5.0)
    sizes = 2.0 ** np.arange(2, 27)
    fitted = fit_three_region(sizes, truth.predict(sizes))
    err = np.abs(fitted.predict(sizes) / truth.predict(sizes) - 1)
    assert np.median(err) < 0.05
    assert fitted.predict(2**26) == pytest.approx(truth.predict(2**26), rel=0.05)  # bandwidth region


def test_fit_needs_three_points():
    with pytest.raises(ValueError, match="at least 3 message sizes"):
        fit_three_region([1, 2], [1e-5, 1e-5])


def _recorded():
    files = sorted(HARDWARE.glob("*.json"))
    if not files:
        pytest.skip("no recorded fingerprint in data/hardware")
    return json.loads(files[0].read_text())


def test_fit_on_recorded_fingerprint_points():
    record = _recorded()
    fits = fit_collectives(record["collectives"])
    assert set(fits) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    ratios = [
        ThreeRegionCurve(**fits[pt["op"]][str(pt["group_size"])]).predict(pt["bytes"]) / pt["time_s"]
        for pt in record["collectives"]
    ]
    # Single points on a shared 2-core machine can be 10x off (a 256 B all-reduce
    # once took 2.5 ms, a 16 KiB one 0.3 ms); the fit must follow the bulk of them.
    assert 0.67 < np.median(ratios) < 1.5
    assert np.median(np.abs(np.log(ratios))) < np.log(2.0)


def test_presets_are_datasheet_records():
    for name in (
        "v100-16gb",
        "a100-40gb",
        "a100-80gb",
        "h100-80gb",
        "h200-141gb",
        "b200-180gb",
        "b300-288gb",
        "gb200-nvl72",
        "gb300-nvl72",
    ):
        preset = load_hardware(name)
        assert preset["source"] == "datasheet" and preset["devices_per_node"] in (8, 72)  # a DGX, an NVL72 rack
        assert max(preset["peak_flops_per_s"].get(k, 0) for k in ("bfloat16", "float16")) > 1e14  # V100: no bf16
        assert all(k in preset["kernels"]["sources"] for k in ("sms", "gemm_efficiency", "attention_efficiency"))
    # a Blackwell GPU: about 2.3x an H100's dense bf16 and 2.4x its memory bandwidth (the datasheets)
    h100, b200 = load_hardware("h100-80gb"), load_hardware("b200-180gb")
    assert b200["peak_flops_per_s"]["bfloat16"] / h100["peak_flops_per_s"]["bfloat16"] == pytest.approx(2.27, rel=0.01)
    assert b200["memory_bandwidth_bytes_per_s"] / h100["memory_bandwidth_bytes_per_s"] == pytest.approx(2.39, rel=0.01)
    # an H200 is an H100's compute with more and faster memory (the datasheets)
    h200 = load_hardware("h200-141gb")
    assert h200["peak_flops_per_s"] == h100["peak_flops_per_s"] and h200["memory_bandwidth_bytes_per_s"] == 4.8e12
    with pytest.raises(ValueError, match="no preset of that name"):
        load_hardware("tpu-v9")


def test_presets_are_read_once_but_each_caller_gets_its_own_copy():
    first = load_hardware("a100-80gb")
    first["peak_flops_per_s"]["bfloat16"] = 1.0  # a caller changing its record changes no one else's
    assert load_hardware("a100-80gb")["peak_flops_per_s"]["bfloat16"] > 1e14
