"""vLLM, Ray and MIG decisions of the planner, worked out by hand.

vLLM per GPU (planner_estimates): weights / tp + KV / min(tp, n_kv)
    + compute 4096 x (4 n_embd + 2 n_ff / tp) + 268_435_456 (sampler) + 1_610_612_736 (runtime)
gpu_memory_utilization = ceil(100 x that / total) / 100; it fits when free - util x total >= margin.
All cases: context 8192, 1 sequence, margin 1 GiB.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from appliance.hardware.snapshot import GpuInfo, HardwareSnapshot
from appliance.hardware.units import GiB
from appliance.modelfacts import ModelFacts
from appliance.planner.plan import Plan, Preferences, Variant, plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MiB = 1 << 20
# Memory decisions: the interactive speed floor is off here (tests/unit/test_planner_speed.py covers it).
VLLM = Preferences(min_context=8192, parallel=1, memory_margin=GiB, vllm_available=True, min_decode_tps=0)


def machine(name: str) -> HardwareSnapshot:
    return HardwareSnapshot.from_json((FIXTURES / "hardware" / f"{name}.json").read_text())


def variants(family: str) -> list[Variant]:
    data = json.loads((FIXTURES / "models" / f"{family}.json").read_text())
    facts = ModelFacts.from_dict(data["facts"])
    return [
        Variant(
            family,
            v["name"],
            v["format"],
            v["quantization"],
            v["size_bytes"],
            replace(facts, format=v["format"]),
            f"{family}/{v['name']}",
        )
        for v in data["variants"]
    ]


def test_l4_runs_llama_8b_bf16_on_vllm() -> None:
    # 16_060_522_496 + KV 32*8192*8*256*2 = 1_073_741_824 + compute 4096*(16384+28672) + 268_435_456
    # = 452_984_832 + 1_610_612_736 = 19_197_861_888; / 24_152_899_584 = 0.7948 -> 0.80;
    # headroom 24_152_899_584 - 0.80 x 24_152_899_584 = 4.83e9 >= 1 GiB.
    p = plan(machine("nvidia_l4_24g"), variants("llama-3.1-8b"), VLLM)
    assert isinstance(p, Plan)
    assert (p.backend, p.variant, p.tensor_parallel_size, p.gpu_memory_utilization) == ("vllm", "bf16", 1, 0.80)
    assert p.devices == ("cuda:0",) and p.kv_cache_dtype == "auto" and p.threads is None
    assert p.memory[0].headroom > 4 * GiB


def test_t4_cannot_run_fp8_and_takes_awq() -> None:
    # bf16 needs 19_197_861_888 > 16_106_127_360 total. FP8 kernels need compute capability 8.0 (T4: 7.5).
    # AWQ: 5_730_000_000 + 1_073_741_824 + 452_984_832 + 1_610_612_736 = 8_867_339_392 -> 0.5506 -> 0.56.
    p = plan(machine("nvidia_t4_16g"), variants("llama-3.1-8b"), VLLM)
    assert isinstance(p, Plan)
    assert (p.backend, p.variant, p.gpu_memory_utilization) == ("vllm", "awq", 0.56)
    rejected = dict(p.rejected)
    assert rejected["fp8"] == "FP8 needs compute capability 8.0, GPU0 has 7.5"
    assert rejected["bf16"].startswith("needs ")


def test_two_3060s_split_qwen_7b_with_tensor_parallel() -> None:
    # TP=1: 15_231_271_864 + 469_762_048 + 482_344_960 + 1_610_612_736 = 17.8e9 > 12.9e9.
    # TP=2 (28 heads divide): 7_615_635_932 + 469_762_048/2 + (4096*(14336+18944) + 268_435_456 = 404_750_336)
    # + 1_610_612_736 = 9_865_880_028; / 12_884_901_888 = 0.7657 -> 0.77; headroom 12_570_329_088 - 9.92e9 = 2.65e9.
    p = plan(machine("nvidia_2x3060_12g"), variants("qwen2.5-7b"), VLLM)
    assert isinstance(p, Plan)
    assert (p.variant, p.tensor_parallel_size, p.pipeline_parallel_size, p.gpu_memory_utilization) == ("bf16", 2, 1, 0.77)
    assert p.devices == ("cuda:0", "cuda:1") and p.distributed_executor is None


def test_h100s_take_the_smallest_tensor_parallel_size_that_fits() -> None:
    # bf16 141_107_412_992 needs TP>=2. TP=2: 70_553_706_496 + 2_684_354_560/2 + (4096*(32768+28672)
    # + 268_435_456 = 520_093_696) + 1_610_612_736 = 74_026_590_208; / 85_520_809_984 = 0.8656 -> 0.87.
    p = plan(machine("nvidia_8xh100_80g"), variants("llama-3.1-70b"), VLLM)
    assert isinstance(p, Plan)
    assert (p.variant, p.tensor_parallel_size, p.gpu_memory_utilization) == ("bf16", 2, 0.87)
    assert p.devices == ("cuda:0", "cuda:1")


def test_mi300x_runs_mixtral_bf16_on_one_gpu() -> None:
    # 93_405_585_408 + 1_073_741_824 + (4096*(16384+57344) + 268_435_456 = 570_425_344) + 1_610_612_736
    # = 96_660_365_312; / 206_141_652_992 = 0.4689 -> 0.47.
    p = plan(machine("amd_mi300x_192g"), variants("mixtral-8x7b"), VLLM)
    assert isinstance(p, Plan)
    assert (p.backend, p.variant, p.devices, p.gpu_memory_utilization) == ("vllm", "bf16", ("rocm:0",), 0.47)


def test_vllm_on_the_cpu_box_gets_a_fraction_of_ram() -> None:
    # Only when asked for: backend=vllm. 988_097_824 + KV 24*8192*2*128*2 = 100_663_296 + compute
    # 4096*(3584+9728) + 268_435_456 = 322_961_408 + 2.5 GiB 2_684_354_560 = 4_096_077_088;
    # / 25_275_990_016 (one NUMA node) = 0.1621 -> 0.17 (measured: 0.05 failed, 0.2 worked).
    box = machine("cpu_2core_24g")
    assert plan(box, variants("qwen2.5-0.5b"), VLLM).backend == "llamacpp"  # auto never picks vLLM without a GPU
    p = plan(box, variants("qwen2.5-0.5b"), replace(VLLM, backend="vllm"))
    assert isinstance(p, Plan)
    assert (p.backend, p.variant, p.devices, p.gpu_memory_utilization) == ("vllm", "bf16", ("cpu",), 0.17)
    assert dict(p.rejected)["f16"] == "GGUF runs on llama.cpp; backend vllm was asked"


def test_ray_spans_two_nodes_with_pipeline_stages() -> None:
    # Two 1x4090 nodes. bf16 and fp8 halves (70.6e9, 36.4e9) do not fit one 24 GB card. AWQ halves:
    # 19_885_000_000 + 2_684_354_560/2 + (4096*(32768+57344) + 268_435_456 = 637_534_208) + 1_610_612_736
    # = 23_475_324_224; / 25_757_220_864 = 0.9114 -> 0.92; headroom 25_243_418_624 - 23_696_643_195
    # = 1_546_775_429 >= 1 GiB.
    local = machine("nvidia_rtx4090_24g")
    other = replace(local, hostname="ws-4090-b")
    p = plan(local, variants("llama-3.1-70b"), replace(VLLM, ray_address="ray://head:10001", cluster=(other,)))
    assert isinstance(p, Plan)
    assert (p.variant, p.tensor_parallel_size, p.pipeline_parallel_size, p.distributed_executor) == ("awq", 1, 2, "ray")
    assert p.gpu_memory_utilization == 0.92
    assert p.devices == ("ws-4090/cuda:0", "ws-4090-b/cuda:0")
    # Without the cluster the AWQ model does not fit locally and llama.cpp's partial offload wins (see test_planner).
    q = plan(local, variants("llama-3.1-70b"), VLLM)
    assert isinstance(q, Plan) and (q.backend, q.variant, q.n_gpu_layers) == ("llamacpp", "q4_k_m", 42)


def test_mig_instances_are_used_alone() -> None:
    # An H100 in MIG mode as two instances of 40000 MiB free. MIG instances are never split across,
    # so no TP=2 and no two-GPU llama.cpp split. vLLM AWQ 39.77e9 on one instance: 39_770_000_000 +
    # 2_684_354_560 + 637_534_208 + 1_610_612_736 > 40000 MiB: no. llama.cpp partial on one instance:
    # room 41_943_040_000 - 1 GiB - 512 MiB - 268_435_456 = 40_063_991_808; Q8_0 per layer 942_829_852
    # -> 42 layers = 52.5% >= half (host RAM is 2 TB) -> Q8_0, 42 layers on that instance.
    box = machine("nvidia_8xh100_80g")
    parent = box.gpus[0]
    migs = tuple(
        GpuInfo(
            index=0,
            vendor="nvidia",
            name="H100 MIG 3g.40gb",
            memory_total=40960 * MiB,
            memory_free=40000 * MiB,
            memory_used=960 * MiB,
            uuid=f"MIG-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
            compute_capability=parent.compute_capability,
            mig_enabled=True,
            mig_instance=True,
            mig_slot=i,
        )
        for i in range(2)
    )
    p = plan(replace(box, gpus=migs), variants("llama-3.1-70b"), VLLM)
    assert isinstance(p, Plan)
    assert (p.backend, p.variant, p.n_gpu_layers) == ("llamacpp", "q8_0", 42)
    assert p.devices == ("cuda:MIG-00000000-aaaa-bbbb-cccc-dddddddddddd",)
    assert "GPU0.MIG0" in p.reason
