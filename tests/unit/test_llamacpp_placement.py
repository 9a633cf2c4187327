"""The plan's placement reaches the llama.cpp worker: visible devices, layer split, KV cache type, flash attention.

Plans come from the real planner on hardware fixtures of real machines; the worker's argv
is parsed back by the worker's own parser. A 1x H100 box and a 2x L4 box are the 8x H100
and the L4 fixtures with their GPU list cut or doubled.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from appliance.drivers.llamacpp.driver import LlamaCppDriver, worker_command, worker_environment
from appliance.drivers.llamacpp.placement import device_environment, placement_args
from appliance.drivers.llamacpp.worker import parse_args
from appliance.hardware.snapshot import HardwareSnapshot
from appliance.hardware.units import GiB
from appliance.planner.plan import Plan, Preferences, plan
from tests.unit.test_planner import machine, variants

PREFS = Preferences(min_context=8192, parallel=1, memory_margin=GiB, vllm_available=False, min_decode_tps=0)


def h100_x1() -> HardwareSnapshot:
    box = machine("nvidia_8xh100_80g")
    return replace(box, gpus=box.gpus[:1])


def l4_x2() -> HardwareSnapshot:
    box = machine("nvidia_l4_24g")
    gpu = box.gpus[0]
    return replace(box, gpus=(gpu, replace(gpu, index=1, uuid="GPU-1a2b3c4d-0a40-0000-0000-000000000005")))


def planned(box: HardwareSnapshot, family: str, **prefs: object) -> Plan:
    p = plan(box, variants(family), replace(PREFS, **prefs))
    assert isinstance(p, Plan), p
    return p


def worker_args(p: Plan):
    return parse_args(worker_command(p, "/run/e.sock", python="/py")[3:])


def test_one_h100_sees_its_gpu_as_device_0() -> None:
    p = planned(h100_x1(), "llama-3.1-8b")
    assert p.devices == ("cuda:0",) and p.n_gpu_layers == -1
    env = worker_environment(p)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    args = worker_args(p)
    assert (args.n_gpu_layers, args.split_mode, args.main_gpu, args.tensor_split) == (-1, "none", 0, ())
    assert (args.kv_type, args.flash_attn, args.swa_full) == ("f16", "auto", True)


def test_the_plans_gpu_is_renumbered_from_zero() -> None:
    """On the 8x H100 box the GPU with most free memory wins; the worker still calls it GPU 0."""
    box = machine("nvidia_8xh100_80g")
    gpus = tuple(replace(g, memory_free=g.memory_free - (0 if g.index == 5 else GiB)) for g in box.gpus)
    p = planned(replace(box, gpus=gpus), "qwen2.5-7b")
    assert p.devices == ("cuda:5",)
    assert worker_environment(p)["CUDA_VISIBLE_DEVICES"] == "5"
    assert worker_args(p).main_gpu == 0


def test_two_l4_split_the_layers_as_the_plan_says() -> None:
    p = planned(l4_x2(), "qwen2.5-32b")
    assert p.devices == ("cuda:0", "cuda:1") and p.n_gpu_layers == -1 and len(p.tensor_split) == 2
    assert worker_environment(p)["CUDA_VISIBLE_DEVICES"] == "0,1"
    args = worker_args(p)
    assert args.split_mode == "layer" and args.main_gpu == 0
    assert args.tensor_split == pytest.approx(p.tensor_split)


def test_mi300x_uses_hip_devices() -> None:
    p = planned(machine("amd_mi300x_192g"), "llama-3.1-70b")
    assert p.devices == ("rocm:0",)
    env = worker_environment(p)
    assert env["HIP_VISIBLE_DEVICES"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "-1"
    assert worker_args(p).split_mode == "none"


def test_a_cpu_plan_hides_every_gpu() -> None:
    p = planned(machine("cpu_2core_24g"), "qwen2.5-0.5b")
    assert p.devices == ("cpu",) and p.n_gpu_layers == 0
    env = worker_environment(p)
    assert env["CUDA_VISIBLE_DEVICES"] == "-1" and env["HIP_VISIBLE_DEVICES"] == "-1"
    argv = worker_command(p, "/s")
    assert "--main-gpu" not in argv and "--tensor-split" not in argv


def test_a_cpu_plan_on_a_gpu_box_hides_the_gpus_too() -> None:
    p = planned(machine("nvidia_l4_24g"), "qwen2.5-0.5b", llamacpp_gpu=False)
    assert p.devices == ("cpu",)
    assert worker_environment(p)["CUDA_VISIBLE_DEVICES"] == "-1"


def test_partial_offload_passes_its_layer_count() -> None:
    p = planned(machine("nvidia_l4_24g"), "llama-3.1-70b")
    assert 0 < p.n_gpu_layers < 80 and p.devices == ("cuda:0",)
    args = worker_args(p)
    assert args.n_gpu_layers == p.n_gpu_layers and args.split_mode == "none"


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_a_quantized_kv_cache_turns_flash_attention_on(kv: str) -> None:
    p = planned(h100_x1(), "llama-3.1-8b", kv_cache_dtype=kv)
    assert p.kv_cache_dtype == kv and p.flash_attn == "on"
    args = worker_args(p)
    assert (args.kv_type, args.flash_attn) == (kv, "on")


def test_the_kv_cache_setting_reaches_the_plan() -> None:
    from appliance.hardware.software import SoftwareInfo
    from appliance.planner.service import preferences_for
    from appliance.settings import Settings

    prefs = preferences_for(Settings(data_dir="/nonexistent", engine_kv_cache_type="q8_0"), SoftwareInfo(None, (), False))
    assert prefs.kv_cache_dtype == "q8_0"
    f16 = planned(machine("cpu_2core_24g"), "llama-3.1-8b")
    q8 = planned(machine("cpu_2core_24g"), "llama-3.1-8b", kv_cache_dtype="q8_0")
    assert q8.memory[0].kv_cache < f16.memory[0].kv_cache  # the estimate follows the cache type


def test_mig_instance_is_named_by_uuid() -> None:
    assert device_environment(("cuda:MIG-4f1a",))["CUDA_VISIBLE_DEVICES"] == "MIG-4f1a"


def test_sliding_window_cache_size_follows_the_plan() -> None:
    assert "--no-swa-full" in placement_args(devices=("cpu",), n_gpu_layers=0, swa_full=False)
    assert parse_args(["--model", "m", "--socket", "s", "--served-name", "n", "--no-swa-full"]).swa_full is False


def test_bad_placements_are_refused() -> None:
    with pytest.raises(ValueError):
        placement_args(devices=("cuda:0", "cuda:1"), n_gpu_layers=-1, tensor_split=(1.0,))
    with pytest.raises(ValueError):
        placement_args(devices=("cpu",), n_gpu_layers=0, kv_type="fp8")
    base = ["--model", "m", "--socket", "s", "--served-name", "n"]
    for bad in (
        ["--kv-type", "q8_0", "--flash-attn", "off"],
        ["--tensor-split", "a,b"],
        ["--tensor-split", "0,0"],
        ["--main-gpu", "-1"],
    ):
        with pytest.raises(SystemExit):
            parse_args(base + bad)


def test_driver_environment_keeps_the_thread_pool_setting() -> None:
    p = planned(h100_x1(), "llama-3.1-8b")
    env = LlamaCppDriver().environment(p, None)
    assert env["OMP_NUM_THREADS"] == str(p.threads) and env["CUDA_VISIBLE_DEVICES"] == "0"
