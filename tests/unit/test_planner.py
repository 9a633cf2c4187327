"""Planner decisions for every fixture machine x real model shape.

Expected decisions are worked out by hand from the formulas in
``appliance/planner/estimates.py`` (the arithmetic is in the comments), never
copied from the planner's output.

Shared constants of the hand arithmetic (bytes):
    GiB = 1_073_741_824, MiB = 1_048_576, margin = 1 GiB, GPU runtime = 512 MiB = 536_870_912
    ctx 8192, parallel 1, KV f16: KV = n_layer x 8192 x n_kv x 2 x head_dim x 2 bytes
    GPU compute, device with the output head = 2048 x (2 n_embd + max(n_vocab, 4 n_ff))
    GPU compute, other devices              = 2048 x (2 n_embd + 4 n_ff)
    CPU compute = 6 MiB + 6144 x (n_embd + n_ff) + 4 n_vocab;  host overhead = 74 MiB + 160 n_vocab
    non-layer bytes = W x n_vocab x n_embd x (1 tied | 2 untied) / params; embd = half (untied) or all (tied)
    A single GPU holds W - embd (untied) or W (tied: the output head is a copy of the embeddings)
    Full offload fits when GPU weights + KV + compute + runtime <= free - margin.
    Partial offload: layers = floor((free - margin - runtime - compute_no_output) / (layer + KV/n_layer)).
Per-model numbers used below:
    KV(8192):      gemma 150_994_944 (18 layers x 8192 cells x 1024 B: llama.cpp's default swa_full keeps
                   full-size KV in the sliding-window layers too)
                   llama-1b 268_435_456, 8b 1_073_741_824, 70b 2_684_354_560,
                   qwen-0.5b 100_663_296, qwen-7b 469_762_048, qwen-32b 2_147_483_648, mixtral 1_073_741_824
    compute+out:   gemma 539_492_352, 1b 271_056_896, 8b 279_445_504, 70b 296_222_720,
                   q0.5b 314_834_944, q7b 326_107_136, q32b 332_398_592, mixtral 251_658_240
    compute-out:   8b 134_217_728, 70b 268_435_456, q7b 169_869_312, q32b 247_463_936, mixtral 251_658_240
"""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from appliance.errors import DoesNotFit
from appliance.hardware.snapshot import HardwareSnapshot
from appliance.hardware.units import GiB
from appliance.modelfacts import ModelFacts
from appliance.planner.plan import CalibrationPoint, Plan, Preferences, Refusal, Variant, plan, plan_all

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MiB = 1 << 20


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


# Memory decisions: the interactive speed floor is off here (tests/unit/test_planner_speed.py covers it).
LLAMACPP = Preferences(min_context=8192, parallel=1, memory_margin=GiB, vllm_available=False, min_decode_tps=0)

# (machine, family) -> (variant, n_gpu_layers, devices) or None for a refusal.
# "-1" = every layer and the output head on the GPU(s); 0 = CPU.
EXPECTED = {
    # cpu_2core_24g: usable RAM = 24_700_000_000 - 1 GiB = 23_626_258_176; highest quality that fits wins.
    ("cpu_2core_24g", "gemma-3-270m"): ("f16", 0, ("cpu",)),
    ("cpu_2core_24g", "llama-3.2-1b"): ("f16", 0, ("cpu",)),
    # F16: 16_068_891_904 + KV 1_073_741_824 + compute (6_291_456 + 6144*18432 + 4*128256 = 120_050_688)
    #      + overhead (77_594_624 + 160*128256 = 98_115_584) = 17_360_800_000 <= 23_626_258_176
    ("cpu_2core_24g", "llama-3.1-8b"): ("f16", 0, ("cpu",)),
    # Smallest, Q4_K_M, is 42_520_395_584 bytes of weights alone > 23.6e9: refuse.
    ("cpu_2core_24g", "llama-3.1-70b"): None,
    ("cpu_2core_24g", "qwen2.5-0.5b"): ("f16", 0, ("cpu",)),
    # F16: 15_237_853_600 + 469_762_048 + (6_291_456 + 6144*22528 + 4*152064 = 145_311_744)
    #      + (77_594_624 + 160*152064 = 101_924_864) = 15_954_852_256 <= 23.6e9
    ("cpu_2core_24g", "qwen2.5-7b"): ("f16", 0, ("cpu",)),
    # Q5_K_M: 23_262_157_856 + 2_147_483_648 + 208_226_304 + 101_924_864 = 25_719_792_672 > 23.6e9
    # Q4_K_M: 19_851_336_256 + 2_147_483_648 + 208_226_304 + 101_924_864 = 22_308_971_072 <= 23.6e9
    ("cpu_2core_24g", "qwen2.5-32b"): ("q4_k_m", 0, ("cpu",)),
    # Q4_K_M 28_446_611_776 > 23.6e9: refuse.
    ("cpu_2core_24g", "mixtral-8x7b"): None,
    # RTX 4090: free = (24564-490) MiB = 25_243_418_624; usable = 24_169_676_800
    ("nvidia_rtx4090_24g", "gemma-3-270m"): ("f16", -1, ("cuda:0",)),  # 542.8e6+151.0e6+539.5e6+536.9e6 = 1.77e9
    ("nvidia_rtx4090_24g", "llama-3.2-1b"): ("f16", -1, ("cuda:0",)),  # 2_479_595_616+268_435_456+271_056_896+536_870_912
    # F16: embd = 2_102_441_350 // 2 = 1_051_220_675; 15_017_671_229 + 1_073_741_824 + 279_445_504 + 536_870_912
    #      = 16_907_729_469 <= 24_169_676_800
    ("nvidia_rtx4090_24g", "llama-3.1-8b"): ("f16", -1, ("cuda:0",)),
    # No full fit. Partial room = 25_243_418_624 - 1 GiB - 512 MiB - 268_435_456 = 23_364_370_432.
    # Q8_0: layer 909_275_420 + KV 33_554_432 -> 24 layers = 30% (< half). Q4_K_M: layer 515_674_792
    # + 33_554_432 = 549_229_224 -> floor(42.54) = 42 layers = 52.5% >= half; host keeps 38 layers:
    # 1_266_412_220 + 38*515_674_792 + 38*33_554_432 + 233_296_896 + 98_115_584 = 22.47e9 <= 58.9e9.
    ("nvidia_rtx4090_24g", "llama-3.1-70b"): ("q4_k_m", 42, ("cuda:0",)),
    ("nvidia_rtx4090_24g", "qwen2.5-0.5b"): ("f16", -1, ("cuda:0",)),
    # F16: 15_237_853_600 - 1_090_468_541 + 469_762_048 + 326_107_136 + 536_870_912 = 15_480_125_155
    ("nvidia_rtx4090_24g", "qwen2.5-7b"): ("f16", -1, ("cuda:0",)),
    # Q5_K_M: 23_262_157_856 - 552_778_434 + 2_147_483_648 + 332_398_592 + 536_870_912 = 25_726_132_574 > usable
    # Q4_K_M: 19_851_336_256 - 471_727_113 + 2_147_483_648 + 332_398_592 + 536_870_912 = 22_396_362_295 <= usable
    ("nvidia_rtx4090_24g", "qwen2.5-32b"): ("q4_k_m", -1, ("cuda:0",)),
    # Partial room = 25_243_418_624 - 1 GiB - 512 MiB - 251_658_240 = 23_381_147_648.
    # Q8_0: 1_542_053_768 + 33_554_432 per layer -> floor(14.84) = 14 = 43.75% (< half).
    # Q5_K_M: 1_032_528_772 + 33_554_432 = 1_066_083_204 -> floor(21.93) = 21 = 65.6%; host (11 layers)
    # 186_506_419 + 11*1_032_528_772 + 11*33_554_432 + 207_746_048 + 82_714_624 = 12.2e9 fits.
    ("nvidia_rtx4090_24g", "mixtral-8x7b"): ("q5_k_m", 21, ("cuda:0",)),
    # L4: free = 23034 MiB = 24_152_899_584; usable = 23_079_157_760; RAM usable = 31e9 - 1 GiB
    ("nvidia_l4_24g", "gemma-3-270m"): ("f16", -1, ("cuda:0",)),
    ("nvidia_l4_24g", "llama-3.2-1b"): ("f16", -1, ("cuda:0",)),
    ("nvidia_l4_24g", "llama-3.1-8b"): ("f16", -1, ("cuda:0",)),  # 16_907_729_469 <= 23_079_157_760
    # Partial room = 24_152_899_584 - 1 GiB - 512 MiB - 268_435_456 = 22_273_851_392.
    # Q8_0 -> floor(23.62) = 23 layers, host 57 layers x 909e6 = 51.8e9 > 29.9e9: does not fit.
    # Q4_K_M -> floor(22_273_851_392 / 549_229_224 = 40.55) = 40 = exactly half;
    # host: 1_266_412_220 + 40*515_674_792 + 40*33_554_432 + 233_296_896 + 98_115_584 = 23.57e9 <= 29.9e9
    ("nvidia_l4_24g", "llama-3.1-70b"): ("q4_k_m", 40, ("cuda:0",)),
    ("nvidia_l4_24g", "qwen2.5-0.5b"): ("f16", -1, ("cuda:0",)),
    ("nvidia_l4_24g", "qwen2.5-7b"): ("f16", -1, ("cuda:0",)),  # 15_480_125_155 <= 23_079_157_760
    ("nvidia_l4_24g", "qwen2.5-32b"): ("q4_k_m", -1, ("cuda:0",)),  # 22_396_362_295 <= 23_079_157_760
    # Room 22_290_628_608: Q8_0 14 layers (43.75%; host 18 layers = 28.93e9 <= 29.93e9, fits but < half);
    # Q5_K_M floor(22_290_628_608 / 1_066_083_204 = 20.9) = 20 = 62.5% -> chosen.
    ("nvidia_l4_24g", "mixtral-8x7b"): ("q5_k_m", 20, ("cuda:0",)),
    # 2x RTX 3060: free (12288-300) MiB = 12_570_329_088 each; usable 11_496_587_264; RAM usable 27.9e9
    ("nvidia_2x3060_12g", "gemma-3-270m"): ("f16", -1, ("cuda:0",)),
    ("nvidia_2x3060_12g", "llama-3.2-1b"): ("f16", -1, ("cuda:0",)),  # 3_555_958_880 on GPU0
    # One GPU: 16_907_729_469 > 11_496_587_264. Both: per layer 436_451_580 + 33_554_432 = 470_006_012;
    # GPU0 room 12_570_329_088 - 1 GiB - 512 MiB - 134_217_728 = 10_825_498_624 -> 23 layers;
    # GPU1 (output head) room - 279_445_504 - 1_051_220_675 = 9_629_050_173 -> 20 layers; 43 >= 32.
    ("nvidia_2x3060_12g", "llama-3.1-8b"): ("f16", -1, ("cuda:0", "cuda:1")),
    # Full on both: 19 + 18 = 37 < 80. Partial, both GPUs: floor(10_691_280_896 / 549_229_224) = 19 each
    # -> 38/80 = 47.5%; Q8_0 would keep 58 layers (52.7e9) in 27.9e9 of RAM: no. Nothing reaches half,
    # so the largest GPU share wins: Q4_K_M, 38 layers, host 24.67e9 <= 27.9e9.
    ("nvidia_2x3060_12g", "llama-3.1-70b"): ("q4_k_m", 38, ("cuda:0", "cuda:1")),
    ("nvidia_2x3060_12g", "qwen2.5-0.5b"): ("f16", -1, ("cuda:0",)),
    # One GPU: 15_480_125_155 > 11.5e9. Both: 483_095_663 per layer; GPU0 10_789_847_040 -> 22,
    # GPU1 9_543_140_675 -> 19; 41 >= 28.
    ("nvidia_2x3060_12g", "qwen2.5-7b"): ("f16", -1, ("cuda:0", "cuda:1")),
    # Full on both: Q4_K_M 32 + 30 = 62 < 64 (Q5_K_M 54, Q6_K 47, Q8_0 36). Partial on both:
    # Q8_0 floor(10_712_252_416 / 551_772_999.8) = 19 each = 38/64 = 59.4% >= half; host 26 layers:
    # 1_654_896_716 + 26*518_218_568 + 26*33_554_432 + 208_226_304 + 101_924_864 = 16.3e9 <= 27.9e9.
    ("nvidia_2x3060_12g", "qwen2.5-32b"): ("q8_0", 38, ("cuda:0", "cuda:1")),
    # Q8_0: floor(10_708_058_112 / 1_575_608_200) = 6 each (37.5%), host 20 layers = 30.8e9: no.
    # Q5_K_M: floor(10.04) = 10 each = 20/32 = 62.5%; host 13.3e9 fits.
    ("nvidia_2x3060_12g", "mixtral-8x7b"): ("q5_k_m", 20, ("cuda:0", "cuda:1")),
    # 8x H100: free (81559-500) MiB = 84_996_112_384; usable 83_922_370_560. One GPU is enough for all.
    ("nvidia_8xh100_80g", "gemma-3-270m"): ("f16", -1, ("cuda:0",)),
    ("nvidia_8xh100_80g", "llama-3.2-1b"): ("f16", -1, ("cuda:0",)),
    ("nvidia_8xh100_80g", "llama-3.1-8b"): ("f16", -1, ("cuda:0",)),
    # Q8_0: 74_975_064_064 - 1_116_515_216 + 2_684_354_560 + 296_222_720 + 536_870_912 = 77_375_997_040 <= 83.9e9
    ("nvidia_8xh100_80g", "llama-3.1-70b"): ("q8_0", -1, ("cuda:0",)),
    ("nvidia_8xh100_80g", "qwen2.5-0.5b"): ("f16", -1, ("cuda:0",)),
    ("nvidia_8xh100_80g", "qwen2.5-7b"): ("f16", -1, ("cuda:0",)),
    ("nvidia_8xh100_80g", "qwen2.5-32b"): ("q8_0", -1, ("cuda:0",)),  # 34.8e9 + 2.1e9 + ... < 83.9e9
    ("nvidia_8xh100_80g", "mixtral-8x7b"): ("q8_0", -1, ("cuda:0",)),  # 49.6e9 + 1.07e9 + ... < 83.9e9
    # MI300X (ROCm): free (196592-284) MiB = 205_843_,... ~205.8e9: everything's best GGUF on rocm:0.
    ("amd_mi300x_192g", "gemma-3-270m"): ("f16", -1, ("rocm:0",)),
    ("amd_mi300x_192g", "llama-3.2-1b"): ("f16", -1, ("rocm:0",)),
    ("amd_mi300x_192g", "llama-3.1-8b"): ("f16", -1, ("rocm:0",)),
    ("amd_mi300x_192g", "llama-3.1-70b"): ("q8_0", -1, ("rocm:0",)),
    ("amd_mi300x_192g", "qwen2.5-0.5b"): ("f16", -1, ("rocm:0",)),
    ("amd_mi300x_192g", "qwen2.5-7b"): ("f16", -1, ("rocm:0",)),
    ("amd_mi300x_192g", "qwen2.5-32b"): ("q8_0", -1, ("rocm:0",)),
    ("amd_mi300x_192g", "mixtral-8x7b"): ("q8_0", -1, ("rocm:0",)),
    # T4: free 15360 MiB = 16_106_127_360; usable 15_032_385_536; RAM usable 14e9 - 1 GiB = 12_926_258_176
    ("nvidia_t4_16g", "gemma-3-270m"): ("f16", -1, ("cuda:0",)),
    ("nvidia_t4_16g", "llama-3.2-1b"): ("f16", -1, ("cuda:0",)),  # 3_555_958_880
    # F16 16_907_729_469 > usable; Q8_0: 8_540_770_560 - 558_733_897 + 1_073_741_824 + 279_445_504
    # + 536_870_912 = 9_872_094_903 <= 15_032_385_536
    ("nvidia_t4_16g", "llama-3.1-8b"): ("q8_0", -1, ("cuda:0",)),
    # Q4_K_M: 25 layers on the GPU, host keeps 55 x 515.7e6 = 28.4e9 > 12.9e9: refuse.
    ("nvidia_t4_16g", "llama-3.1-70b"): None,
    ("nvidia_t4_16g", "qwen2.5-0.5b"): ("f16", -1, ("cuda:0",)),
    # F16 15_480_125_155 > 15_032_385_536; Q8_0: 8_098_522_912 - 579_555_670 + 469_762_048 + 326_107_136
    # + 536_870_912 = 8_851_707_338 fits.
    ("nvidia_t4_16g", "qwen2.5-7b"): ("q8_0", -1, ("cuda:0",)),
    # Partial room 16_106_127_360 - 1 GiB - 512 MiB - 247_463_936 = 14_248_050_688.
    # Q8_0 25 layers, host 39 x 518e6 = 20.2e9: no. Q6_K floor(32.85) = 32, host 32 x 400e6 + 1.28e9
    # = 14.1e9: no. Q5_K_M floor(14_248_050_688 / 379_751_322.4 = 37.5) = 37; host 27 layers:
    # 1_105_556_868 + 27*346_196_890 + 27*33_554_432 + 208_226_304 + 101_924_864 = 11.67e9 <= 12.93e9.
    ("nvidia_t4_16g", "qwen2.5-32b"): ("q5_k_m", 37, ("cuda:0",)),
    # Q4_K_M floor(14_243_856_384 / 917_521_313) = 15 layers; host 17 x 884e6 = 15.0e9 > 12.9e9: refuse.
    ("nvidia_t4_16g", "mixtral-8x7b"): None,
}


@pytest.mark.parametrize(("machine_name", "family"), sorted(EXPECTED))
def test_llamacpp_decision(machine_name: str, family: str) -> None:
    expected = EXPECTED[(machine_name, family)]
    result = plan(machine(machine_name), variants(family), LLAMACPP)
    if expected is None:
        assert isinstance(result, Refusal), result
        assert result.needed, "a refusal says what would be needed"
        return
    assert isinstance(result, Plan), result
    name, layers, devices = expected
    assert (result.variant, result.n_gpu_layers, result.devices) == (name, layers, devices), result.reason
    assert result.backend == "llamacpp"
    assert result.model == f"{family}:{name}"
    assert result.model_path == f"{family}/{name}"
    assert result.context == 8192 and result.parallel == 1
    for m in result.memory:
        assert m.headroom >= GiB, m
    assert result.estimated_bytes == sum(m.used for m in result.memory)


def test_every_machine_and_model_is_covered() -> None:
    machines = {p.stem for p in (FIXTURES / "hardware").glob("*.json")}
    families = {p.stem for p in (FIXTURES / "models").glob("*.json")}
    assert {m for m, _ in EXPECTED} == machines
    assert {f for _, f in EXPECTED} == families
    assert len(EXPECTED) == len(machines) * len(families)


def test_threads_default_to_physical_cores_and_obey_the_setting() -> None:
    box = machine("cpu_2core_24g")
    p = plan(box, variants("gemma-3-270m"), LLAMACPP)
    assert isinstance(p, Plan) and p.threads == 2  # 2 physical cores
    p1 = plan(box, variants("gemma-3-270m"), replace(LLAMACPP, threads=1))
    assert isinstance(p1, Plan) and p1.threads == 1


def test_kv_cache_of_gemma_with_eight_slots_matches_llama_cpp_log() -> None:
    # 8 slots of 8192 tokens: n_ctx = 65536 cells. llama.cpp 0.3.36 logged for this model at n_ctx 65536,
    # n_seq_max 8, kv_unified, swa_full off: non-SWA 192.00 MiB (3 layers x 65536 cells) + SWA 67.50 MiB
    # (15 layers x (512*8 + 512) cells), each cell-layer 1 head x (256 + 256) x 2 bytes = 1024 B
    # -> (3*65536 + 15*4608) * 1024 = 272_105_472.
    box = machine("cpu_2core_24g")
    q4 = [v for v in variants("gemma-3-270m") if v.name == "q4_k_m"]
    p = plan(box, q4, replace(LLAMACPP, parallel=8, swa_full=False))
    assert isinstance(p, Plan)
    assert (p.context, p.parallel) == (8192, 8)
    assert p.memory[0].kv_cache == 272_105_472
    assert p.swa_full is False
    # llama.cpp's default (swa_full on): every layer full size, 18 x 65536 x 1024 = 1_207_959_552 (1152 MiB).
    full = plan(box, q4, replace(LLAMACPP, parallel=8))
    assert isinstance(full, Plan) and full.swa_full is True
    assert full.memory[0].kv_cache == 1_207_959_552


def test_reason_names_the_rejected_higher_quality_variant() -> None:
    p = plan(machine("nvidia_l4_24g"), variants("qwen2.5-32b"), LLAMACPP)
    assert isinstance(p, Plan)
    # "Q4_K_M, 8k ctx, all 64 layers on GPU0, 1.6 GiB headroom; Q5_K_M needs ... usable on GPU0"
    # headroom = 24_152_899_584 - 22_396_362_295 = 1_756_537_289 = 1.64 GiB
    assert p.reason.startswith("Q4_K_M, 8k ctx, all 64 layers on GPU0, 1.6 GiB headroom, ~")  # then the speed estimate
    assert "; Q8_0 " in p.reason
    rejected = dict(p.rejected)
    # Q5_K_M on GPU0 needs 25_726_132_574 B = 24.0 GiB > 23_079_157_760 B = 21.5 GiB usable; a partial
    # offload would hold floor((24_152_899_584 - 1 GiB - 512 MiB - 247_463_936) / 379_751_322.4 = 58.7) layers.
    assert rejected["q5_k_m"] == "needs 24.0 GiB > 21.5 GiB usable on GPU0; fits only partly on GPU (58/64 layers on GPU0)"
    assert rejected["bf16"] == "safetensors needs vLLM, which is not installed"


def test_refusal_says_what_is_needed_and_maps_to_does_not_fit() -> None:
    r = plan(machine("cpu_2core_24g"), variants("llama-3.1-70b"), LLAMACPP)
    assert isinstance(r, Refusal)
    # Smallest GGUF Q4_K_M on CPU: 42_520_395_584 + 2_684_354_560 + (6_291_456 + 6144*36864 + 4*128256
    # = 233_296_896) + 98_115_584 = 45_536_162_624, + 1 GiB margin = 46_609_904_448 B = 43.4 GiB.
    assert any(line.startswith("43.4 GiB of free RAM") for line in r.needed), r.needed
    err = r.to_error()
    assert isinstance(err, DoesNotFit) and err.status == 422
    assert "llama-3.1-70b does not fit" in err.message


def test_refusal_suggests_a_smaller_context_when_that_fits() -> None:
    # qwen2.5-32b Q4_K_M on the CPU box at 32k: KV = 64 x 32768 x 4096 = 8_589_934_592;
    # 19_851_336_256 + 8_589_934_592 + 208_226_304 + 101_924_864 = 28.75e9 > 23.63e9. At 16k KV is
    # 4_294_967_296 -> 24.46e9: no. At 8k (2_147_483_648) -> 22.31e9: fits, so "--ctx 8192".
    r = plan(machine("cpu_2core_24g"), variants("qwen2.5-32b"), replace(LLAMACPP, min_context=32768))
    assert isinstance(r, Refusal)
    assert "a context of 8192 tokens or less (--ctx 8192)" in r.needed


def test_quality_floor_rejects_lower_variants() -> None:
    # On the CPU box qwen2.5-32b fits only as Q4_K_M; a floor of Q5_K_M leaves nothing.
    r = plan(machine("cpu_2core_24g"), variants("qwen2.5-32b"), replace(LLAMACPP, quality_floor="Q5_K_M"))
    assert isinstance(r, Refusal)
    assert dict(r.rejected)["q4_k_m"] == "below the quality floor Q5_K_M"


def test_context_is_capped_at_the_trained_context() -> None:
    # qwen2.5-0.5b was trained for 32768: a request's context is capped there.
    p = plan(machine("cpu_2core_24g"), variants("qwen2.5-0.5b"), replace(LLAMACPP, min_context=65536))
    assert isinstance(p, Plan) and p.context == 32768
    assert "capped at the trained 32k" in p.reason


def test_memory_budget_caps_one_engine() -> None:
    # Budget 10 GiB = 10_737_418_240. F16 llama-3.1-8b needs 17_360_800_000: over. Q8_0:
    # 8_540_770_560 + 1_073_741_824 + 120_050_688 + 98_115_584 = 9_832_678_656 <= budget.
    p = plan(machine("cpu_2core_24g"), variants("llama-3.1-8b"), replace(LLAMACPP, memory_budget=10 * GiB))
    assert isinstance(p, Plan) and p.variant == "q8_0"
    assert dict(p.rejected)["f16"].startswith("needs 16.2 GiB > the memory budget 10.0 GiB")


def test_cpu_only_llamacpp_build_never_offloads() -> None:
    p = plan(machine("nvidia_rtx4090_24g"), variants("llama-3.1-8b"), replace(LLAMACPP, llamacpp_gpu=False))
    assert isinstance(p, Plan) and p.n_gpu_layers == 0 and p.devices == ("cpu",)


def test_calibration_corrects_the_next_estimate() -> None:
    box = machine("cpu_2core_24g")
    fam = [v for v in variants("gemma-3-270m") if v.name == "q4_k_m"]
    first = plan(box, fam, LLAMACPP)
    assert isinstance(first, Plan) and not first.calibrated
    measured = first.estimated_bytes + 100 * MiB
    cal = CalibrationPoint("gemma-3-270m:q4_k_m", "llamacpp", 8192, first.estimated_bytes, measured)
    second = plan(box, fam, LLAMACPP, [cal])
    assert isinstance(second, Plan) and second.calibrated
    assert second.estimated_bytes == measured
    assert "calibrated +100 MiB" in second.reason
    other_backend = CalibrationPoint("gemma-3-270m:q4_k_m", "vllm", 8192, 1, 10**12)
    third = plan(box, fam, LLAMACPP, [other_backend])
    assert isinstance(third, Plan) and third.estimated_bytes == first.estimated_bytes


def test_plan_all_gives_one_row_per_variant() -> None:
    rows = plan_all(machine("cpu_2core_24g"), variants("llama-3.1-8b"), LLAMACPP)
    # Quality order (BF16 is the checkpoint's own dtype, ranked above F16), then one row each.
    assert [r.variant for r in rows] == ["bf16", "f16", "q8_0", "fp8", "q5_k_m", "q4_k_m", "awq"]
    assert [r.chosen for r in rows] == [False, True, False, False, False, False, False]
    assert [r.fits for r in rows] == [False, True, True, False, True, True, False]
    assert rows[0].reason == "safetensors needs vLLM, which is not installed" and rows[0].placement == "-"
    q8 = rows[2]
    assert q8.placement == "CPU" and "not chosen" in q8.reason and q8.memory[0].device == "cpu"


def test_plan_round_trips_through_json() -> None:
    p = plan(machine("nvidia_2x3060_12g"), variants("llama-3.1-8b"), LLAMACPP)
    assert isinstance(p, Plan)
    # 8b F16 over both GPUs: capacities 23 and 20 -> 32*23//43 = 17, 32*20//43 = 14, the spare
    # layer to GPU0 -> 18/14 -> split (0.5625, 0.4375).
    assert p.tensor_split == (0.5625, 0.4375)
    assert Plan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_bad_preferences_are_rejected() -> None:
    from appliance.errors import BadRequest

    with pytest.raises(BadRequest):
        plan(machine("cpu_2core_24g"), variants("gemma-3-270m"), replace(LLAMACPP, parallel=0))
    with pytest.raises(BadRequest):
        plan(machine("cpu_2core_24g"), variants("gemma-3-270m"), replace(LLAMACPP, backend="tgi"))


def test_planner_modules_do_no_io() -> None:
    root = Path(__file__).resolve().parents[2] / "appliance"
    forbidden_modules = {"os", "pathlib", "subprocess", "socket", "shutil", "time", "psutil", "httpx", "sqlite3", "io"}
    for path in sorted(root.glob("planner*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not {n.split(".")[0] for n in names} & forbidden_modules, (path.name, names)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"open", "print", "input"}, (path.name, node.func.id)


def test_speculative_ngram_setting_reaches_the_llamacpp_worker_command() -> None:
    from appliance.drivers.llamacpp.driver import worker_command
    from appliance.hardware.software import SoftwareInfo
    from appliance.planner.service import preferences_for
    from appliance.settings import Settings

    prefs = preferences_for(Settings(data_dir="/nonexistent", speculative_ngram=True), SoftwareInfo(None, (), False))
    assert prefs.speculative_ngram
    on = plan(machine("cpu_2core_24g"), variants("qwen2.5-0.5b"), replace(LLAMACPP, speculative_ngram=True))
    off = plan(machine("cpu_2core_24g"), variants("qwen2.5-0.5b"), LLAMACPP)
    assert isinstance(on, Plan) and isinstance(off, Plan)
    assert on.speculative and not off.speculative
    assert "--spec-ngram" in worker_command(on, "/s") and "--spec-ngram" not in worker_command(off, "/s")
