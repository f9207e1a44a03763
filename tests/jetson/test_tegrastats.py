"""The tegrastats parser on real recorded lines (tests/jetson/data/SOURCES.md), every field."""

from datetime import datetime

import pytest

from jetson.errors import JetsonError
from jetson.tegrastats import CpuCore, Rail, Sample, parse_line, parse_lines, read_log
from tests.jetson.fakes import DATA


def only(name: str) -> Sample:
    samples = read_log(DATA / name)
    assert len(samples) == 1
    return samples[0]


def cores(*entries):
    """CpuCore tuples from (load, MHz) pairs, None for an offline core."""
    return tuple(CpuCore(False, None, None) if e is None else CpuCore(True, e[0], e[1]) for e in entries)


def test_jetpack6_orin_nano_super_without_root():
    s = only("jp6_orin_nano_super_user.log")
    assert s == Sample(
        clock=datetime(2025, 7, 14, 10, 29, 36), ram_used_mb=2147, ram_total_mb=7620, ram_largest_free_block="2x4MB",
        swap_used_mb=1476, swap_total_mb=3810, swap_cached_mb=1, cpus=cores(*[(0, 729)] * 6),
        emc_load_percent=None, emc_freq_mhz=None, gpu_load_percent=0, gpu_freq_mhz=(),
        temperatures_c={"cpu": 47.687, "soc2": 46.718, "soc0": 47.468, "gpu": 48.625, "tj": 48.625, "soc1": 48.25},
        temperature_peaks_c={},
        rails={"VDD_IN": Rail(4556, 4556, None), "VDD_CPU_GPU_CV": Rail(483, 483, None),
               "VDD_SOC": Rail(1451, 1451, None)},
        other={})


def test_jetpack6_orin_nano_without_root():
    s = only("jp6_orin_nano_user.log")
    assert s == Sample(
        clock=datetime(2025, 6, 18, 11, 25, 24), ram_used_mb=3452, ram_total_mb=7620, ram_largest_free_block="25x4MB",
        swap_used_mb=1518, swap_total_mb=16384, swap_cached_mb=174,
        cpus=cores((1, 1420), (2, 1420), (0, 1420), (2, 1420), (2, 729), (1, 729)),
        gpu_load_percent=0,
        temperatures_c={"cpu": 50.031, "soc2": 49.031, "soc0": 50.0, "gpu": 49.031, "tj": 50.25, "soc1": 50.25},
        rails={"VDD_IN": Rail(4824, 4824, None), "VDD_CPU_GPU_CV": Rail(518, 518, None),
               "VDD_SOC": Rail(1475, 1475, None)})


def test_jetpack6_orin_nano_as_root_under_load():
    s = only("jp6_orin_nano_root.log")
    assert s == Sample(
        clock=datetime(2024, 11, 15, 8, 38, 9), ram_used_mb=6185, ram_total_mb=7620, ram_largest_free_block="8x2MB",
        swap_used_mb=851, swap_total_mb=3810, swap_cached_mb=1,
        cpus=cores((15, 729), (11, 729), (14, 729), (13, 729), (11, 729), (8, 729)),
        emc_load_percent=43, emc_freq_mhz=2133, gpu_load_percent=63, gpu_freq_mhz=(621,),
        temperatures_c={"cpu": 53.968, "soc2": 52.437, "soc0": 50.75, "gpu": 53.343, "tj": 53.968, "soc1": 51.656},
        rails={"VDD_IN": Rail(12479, 12479, None), "VDD_CPU_GPU_CV": Rail(4667, 4667, None),
               "VDD_SOC": Rail(2817, 2817, None)},
        other={"NVDEC": "off", "NVJPG": "off", "NVJPG1": "off", "VIC": "off", "OFA": "off", "APE": "200"})


def test_jetpack6_trace_of_three_samples():
    samples = read_log(DATA / "jp6_orin_nano_user_trace.log")
    assert [s.clock for s in samples] == [datetime(2025, 12, 30, 0, 20, sec) for sec in (8, 9, 10)]
    assert [s.rails["VDD_IN"] for s in samples] == [Rail(6167, 6167, None), Rail(5608, 5888, None),
                                                    Rail(5486, 5754, None)]
    assert [s.rails["VDD_CPU_GPU_CV"] for s in samples] == [Rail(1215, 1215, None), Rail(770, 993, None),
                                                            Rail(730, 905, None)]
    assert [s.rails["VDD_SOC"] for s in samples] == [Rail(1663, 1663, None), Rail(1663, 1663, None),
                                                     Rail(1623, 1650, None)]
    assert [s.gpu_load_percent for s in samples] == [33, 0, 33]
    assert [s.ram_used_mb for s in samples] == [6677] * 3
    assert [(s.swap_used_mb, s.swap_total_mb, s.swap_cached_mb) for s in samples] == [(4635, 20194, 180)] * 3
    assert samples[0].cpus == cores((28, 960), (20, 960), (19, 960), (30, 960), (21, 729), (22, 729))
    assert samples[2].temperatures_c == {"cpu": 52.062, "soc2": 51.656, "soc0": 52.031, "gpu": 51.875,
                                         "tj": 52.718, "soc1": 52.718}


def test_jetpack6_agx_orin_as_root_with_runs_of_spaces_and_no_clock():
    s = only("jp6_agx_orin_root.log")
    assert s == Sample(
        clock=None, ram_used_mb=29114, ram_total_mb=30697, ram_largest_free_block="3x4MB",
        swap_used_mb=4915, swap_total_mb=15348, swap_cached_mb=1,
        cpus=cores((3, 729), (4, 729), (0, 729), (1, 729), (0, 2201), (100, 2201), (1, 2201), (0, 2201),
                   (100, 2201), (0, 2201), (0, 2201), (0, 2201)),
        emc_load_percent=1, emc_freq_mhz=2133, gpu_load_percent=0, gpu_freq_mhz=(305, 305),
        temperatures_c={"cpu": 53.062, "soc2": 48.25, "soc0": 48.843, "gpu": 47.812, "tj": 53.062, "soc1": 48.968},
        rails={"VDD_GPU_SOC": Rail(3205, 3205, None), "VDD_CPU_CV": Rail(4405, 4405, None),
               "VIN_SYS_5V0": Rail(4767, 4767, None)},
        other={"NVENC": "off", "NVDEC": "off", "NVJPG": "off", "NVJPG1": "off", "VIC": "off", "OFA": "off",
               "NVDLA0": "off", "NVDLA1": "off", "PVA0_FREQ": "off", "APE": "174"})


def test_jetpack6_agx_orin_without_root():
    s = only("jp6_agx_orin_user.log")
    assert s == Sample(
        clock=None, ram_used_mb=2448, ram_total_mb=62840, ram_largest_free_block="2x4MB",
        swap_used_mb=0, swap_total_mb=31420, swap_cached_mb=0, cpus=cores(*[(0, 2201)] * 12), gpu_load_percent=0,
        temperatures_c={"cpu": 42.0, "soc2": 37.843, "soc0": 39.187, "gpu": 37.75, "tj": 42.0, "soc1": 37.937},
        rails={"VDD_GPU_SOC": Rail(4940, 4940, None), "VDD_CPU_CV": Rail(988, 988, None),
               "VIN_SYS_5V0": Rail(4442, 4442, None)})


def test_jetpack7_orin_nano_rails_with_peaks_temperatures_with_peaks_and_no_swap():
    samples = read_log(DATA / "jp7_orin_nano_super_trace.log")
    assert len(samples) == 4
    first, second = samples[0], samples[1]
    assert second == Sample(
        clock=datetime(2026, 9, 19, 13, 33, 3), ram_used_mb=2845, ram_total_mb=7486, ram_largest_free_block="33x4MB",
        cpus=cores((1, 729), *[(0, 729)] * 5), emc_load_percent=3, emc_freq_mhz=665, gpu_load_percent=0,
        gpu_freq_mhz=(305,),
        temperatures_c={"cpu": 45.375, "soc2": 44.687, "soc0": 46.25, "gpu": 46.562, "tj": 46.562, "soc1": 46.281},
        temperature_peaks_c={"cpu": 45.812, "soc2": 44.843, "soc0": 46.25, "gpu": 46.843, "tj": 46.843,
                             "soc1": 46.281},
        rails={"VDD_IN": Rail(3462, 3522, 3582), "VDD_CPU_GPU_CV": Rail(442, 483, 523),
               "VDD_SOC": Rail(1127, 1127, 1127)},
        other={"NVDEC0": "off", "NVJPG0": "off", "NVJPG1": "off", "VIC": "off", "OFA": "off", "APE": "200"})
    assert first.swap_used_mb is None and first.swap_total_mb is None and first.swap_cached_mb is None
    assert [s.rails["VDD_IN"].current_mw for s in samples] == [3582, 3462, 3462, 3462]
    assert [s.rails["VDD_IN"].average_mw for s in samples] == [3582, 3522, 3502, 3492]
    assert [s.gpu_freq_mhz for s in samples] == [(305,), (305,), (305,), (306,)]
    assert [s.ram_used_mb for s in samples] == [2850, 2845, 2840, 2837]


def test_jetpack7_thor_as_root_three_gpcs_without_load():
    s = only("jp7_thor_r38_root.log")
    assert s == Sample(
        clock=datetime(2026, 4, 21, 15, 50, 52), ram_used_mb=105265, ram_total_mb=125772,
        ram_largest_free_block="34x4MB",
        cpus=cores(*[(0, 972)] * 6, (1, 972), *[(0, 972)] * 4, (8, 972), (0, 972), (0, 972)),
        emc_load_percent=0, emc_freq_mhz=2750, gpu_load_percent=None, gpu_freq_mhz=(314, 314, 314),
        temperatures_c={"cpu": 37.343, "tj": 38.875, "soc012": 37.468, "gpu": 38.875, "soc345": 37.406},
        rails={"VDD_GPU": Rail(1962, 1962, None), "VDD_CPU_SOC_MSS": Rail(5887, 5887, None),
               "VIN_SYS_5V0": Rail(5635, 5635, None), "VIN": Rail(19780, 19780, None)},
        other={"NVENC0_FREQ": "@314", "NVENC1_FREQ": "@314", "NVDEC0_FREQ": "@314", "NVDEC1_FREQ": "@314",
               "NVJPG0_FREQ": "@314", "VIC": "off", "OFA_FREQ": "@315", "PVA0_FREQ": "off", "APE": "300"})


def test_jetpack7_thor_without_root():
    s = only("jp7_thor_r38_user.log")
    assert s == Sample(
        clock=datetime(2026, 1, 20, 22, 46, 22), ram_used_mb=17842, ram_total_mb=125772,
        ram_largest_free_block="79x4MB",
        cpus=cores((0, 972), (0, 972), (0, 1566), (0, 1566), *[(0, 972)] * 6, (1, 972), (0, 972), (0, 972), (0, 972)),
        temperatures_c={"cpu": 30.468, "tj": 31.218, "soc012": 30.218, "soc345": 31.218},
        rails={"VDD_GPU": Rail(0, 0, None), "VDD_CPU_SOC_MSS": Rail(5535, 5535, None),
               "VIN_SYS_5V0": Rail(5040, 5040, None), "VIN": Rail(16802, 16802, None)})


def test_jetpack72_thor_rails_with_peaks():
    s = only("jp7_thor_r39_user.log")
    assert s == Sample(
        clock=datetime(2026, 7, 2, 13, 45, 44), ram_used_mb=36529, ram_total_mb=125749,
        ram_largest_free_block="12x4MB", swap_used_mb=11, swap_total_mb=4096, swap_cached_mb=9,
        cpus=cores((2, 972), (1, 972), *[(0, 972)] * 11, (2, 972)),
        temperatures_c={"cpu": 60.406, "tj": 63.281, "soc012": 58.468, "gpu": 62.906, "soc345": 63.281},
        rails={"VDD_GPU": Rail(37528, 37528, 37528), "VDD_CPU_SOC_MSS": Rail(18961, 18961, 18961),
               "VIN_SYS_5V0": Rail(18331, 18331, 18331), "VIN": Rail(87426, 43713, 87426)})


def test_offline_cores_negative_temperatures_and_unknown_fields_are_kept():
    # Offline cores ("off"), a sensor that reads -256C when absent and MTS are all printed by some
    # boards (Orin NX, AGX Xavier); none of them may stop the parse.
    s = parse_line("RAM 1224/15368MB (lfb 8x4MB) CPU [1%@729,0%@729,off,off] CV0@-256C MTS fg 0% bg 0% "
                   "VDD_IN 4319mW/4319mW")
    assert s.cpus == cores((1, 729), (0, 729), None, None)
    assert s.temperatures_c == {"CV0": -256.0}
    assert s.other == {"MTS": "fg 0% bg 0%"}
    assert s.rails == {"VDD_IN": Rail(4319, 4319, None)}


@pytest.mark.parametrize("line, says", [
    ("hello world", "'hello' where a field name was expected"),
    ("CPU [1%@729] VDD_IN 4319mW/4319mW", "no RAM field"),
    ("RAM 1224MB", "RAM '1224MB' is not used/totalMB"),
    ("RAM 1224/15368MB CPU [1%@729,busy]", "CPU core 'busy' is neither load%@MHz nor off"),
    ("RAM 1224/15368MB GR3D_FREQ fast", "GR3D_FREQ 'fast' is not load%@MHz"),
    ("RAM 1224/15368MB EMC_FREQ", "EMC_FREQ has no value"),
])
def test_a_line_that_is_not_tegrastats_is_refused_with_the_line_named(line, says):
    with pytest.raises(JetsonError) as e:
        parse_lines(["RAM 1/2MB", "", line], source="run.log")
    assert str(e.value).startswith(f"run.log line 3: not a tegrastats line ({says})")
    assert f"found: {line}" in str(e.value)


def test_an_empty_line_alone_is_refused():
    with pytest.raises(JetsonError, match=r"tegrastats output: not a tegrastats line \(no RAM field\)"):
        parse_line("   ")
