"""The benchmark scripts run (at tiny sizes; the real runs are by hand, see README)."""

from __future__ import annotations

import math
import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_decode_benchmark_runs_and_measures_the_gqa_cache(monkeypatch, capsys):
    tiny = "--no-hf --layers 1 --d-model 16 --n-heads 4 --vocab 32 --prompt 8 --new 4 --contexts 4 16"
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as `python benchmarks/decode.py` would: its helpers import
    monkeypatch.setattr(sys, "argv", ["decode.py", *tiny.split(), "--steps", "2", "--repeats", "1"])
    runpy.run_path(str(BENCHMARKS / "decode.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "| speedup of the cache |" in out and "| per-token time 16 / 4 |" in out
    assert "| GQA / MHA cache bytes | 0.5000 | 0.5000 |" in out  # 2 of 4 kv heads, measured


def test_train_loop_benchmark_measures_the_checkpoint_cost(monkeypatch, capsys):
    tiny = "--d-model 16 --heads 4 --layers 1 --seq-len 16 --batch 2 --steps 5 --repeats 1 --checkpoint-every 2"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["train_loop.py", *tiny.split(), "--threads", "1"])
    runpy.run_path(str(BENCHMARKS / "train_loop.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "| zoo Trainer + checkpoints every 2 |" in out
    assert "ratio with checkpoints / without: " in out and "(target >= 0.97; 2 checkpoints per run)" in out


def test_bookkeeping_benchmark_times_the_report_and_tuning_against_the_sweep(monkeypatch, capsys, tmp_path):
    from helpers import fake_run

    for seed in range(3):
        for pos in ("none", "rotary"):
            fake_run(tmp_path / "sweep", [f"pos={pos}", "mlp=gelu", f"seed={seed}"], value=3.0 - seed / 10,
                     config={"seed": seed, "train": {"lr": 3e-3}}, started="2026-01-01T00:00:00+00:00",
                     finished="2026-01-01T00:01:40+00:00")  # fmt: skip
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["bookkeeping.py", str(tmp_path / "sweep"), "--repeats", "1", "--no-process"])
    runpy.run_path(str(BENCHMARKS / "bookkeeping.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "(6 runs, 2 variants): 100 s from first start to last finish" in out
    assert "| whole report (write_report, what a sweep runs) |" in out
    assert "tune.lr: choosing the rate, all 6 runs" in out
    # 2 variants x 3 rates more runs of 10 s each (fake_run's wall time): 100 + 60 s
    assert "every sweep: the report," in out and "with tune.lr (3 rates, estimated 160 s)" in out
    assert "(target < 5%)" in out and not (tmp_path / "sweep" / "report.md").exists()  # written to a copy


def test_block_benchmark_times_the_blocks_against_their_peers(monkeypatch, capsys):
    tiny = "--batch 2 --time 8 --d-model 16 --n-heads 4 --repeats 1 --threads 1"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["block.py", *tiny.split()])
    runpy.run_path(str(BENCHMARKS / "block.py"), run_name="__main__")
    out = capsys.readouterr().out  # the gpt preset's learned positions are the model's: its block builds
    assert "| zoo gpt (sdpa) | " in out and "| zoo llama (sdpa) | " in out
    assert "| torch TransformerEncoderLayer | " in out


def test_block_benchmark_times_moe_against_per_expert_loops_and_dense(monkeypatch, capsys):
    tiny = "--moe-only --batch 2 --time 8 --d-model 16 --n-heads 4 --experts 4 --top-k 2 --repeats 1 --threads 1"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["block.py", *tiny.split()])
    runpy.run_path(str(BENCHMARKS / "block.py"), run_name="__main__")
    out = capsys.readouterr().out  # the loops were checked equal to mlp=moe before timing
    assert "| zoo mlp=moe (grouped) |" in out and "| per-expert loop, every token (dense gates) |" in out
    assert "speedup over the per-expert loop on every token: " in out and "(target >= 3)" in out
    assert "moe / dense MLP of equal active parameters: " in out


def test_contract_benchmark_times_a_part_the_whole_and_shards_that_add_up(monkeypatch, capsys):
    tiny = "--part attn=mla+qrank --within attn=mla+qrank --shards 2 --no-part-full"  # 53 rows, then 34 twice
    monkeypatch.setattr(sys, "argv", ["contract.py", *tiny.split()])
    runpy.run_path(str(BENCHMARKS / "contract.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "| attn=mla+qrank pairwise | 53 |" in out and "| attn=mla+qrank, full | 34 |" in out
    assert "| shard 2/2 | 17 |" in out
    assert "slowest shard / whole: " in out and "(ideal 1/2 = 0.50)" in out


def test_optim_benchmark_times_muon_against_adamw(monkeypatch, capsys):
    tiny = "--sizes 16 --layers 1 --seq-len 8 --batch 2 --repeats 1 --threads 1"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["optim.py", *tiny.split()])
    runpy.run_path(str(BENCHMARKS / "optim.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "| adamw |" in out and "| muon |" in out
    assert "ratio muon / adamw: " in out and "(target <= 1.2)" in out


def test_probes_benchmark_times_a_probed_run_against_a_plain_one(monkeypatch, capsys):
    from zoo.lab.training.loop_callbacks import Probing
    from zoo.lab.training.trainer import Trainer

    tiny = "--d-model 16 --heads 4 --layers 1 --seq-len 16 --batch 2 --steps 6 --eval-every 0 --probe-every 3"
    monkeypatch.setattr(sys, "argv", ["probes.py", *tiny.split(), "--repeats", "1", "task.max_bytes=30000"])
    monkeypatch.setattr(Trainer, "fit", Trainer.fit)  # the script wraps them to time them: undone after
    monkeypatch.setattr(Probing, "on_step_end", Probing.on_step_end)
    runpy.run_path(str(BENCHMARKS / "probes.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "| probe_every=0 |" in out and "| probe_every=3 (2 probes) |" in out
    assert "CPU: probed / plain " in out and "% of its fit (median; target <= 5%)" in out


def test_data_benchmark_times_the_token_loader_and_zoo_prepare(monkeypatch, capsys, tmp_path):
    for n in range(3):
        (tmp_path / f"{n}.txt").write_text("def f(x):\n    return x * 2  # ünï\n" * 300)
    tiny = f"--input {tmp_path} --glob *.txt --steps 2 --repeats 1 --workers 1 2 --vocab-size 300"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["data.py", *tiny.split()])
    runpy.run_path(str(BENCHMARKS / "data.py"), run_name="__main__")  # the two loaders were checked equal
    out = capsys.readouterr().out
    assert "| task=tokens (memory-mapped) |" in out and "| in memory |" in out
    assert "ratio memory-mapped / in memory: " in out and "(target <= 1.02)" in out
    assert "| bytes | 2 |" in out and "| bpe 2" in out and "target: >= 10 MB/s on 2 cores" in out
    assert "| bytebpe |" in out and "| the library's |" in out and "zoo-prepare's check, bytebpe (checked" in out
    assert "| tiktoken " in out or "tiktoken: not installed (pip install tiktoken); skipped" in out


def test_mup_transfer_finds_the_best_rate_per_width_and_the_regret(monkeypatch, capsys, tmp_path):
    """Fake runs where the standard best rate halves as width doubles and μP's stays: the tables say so, with
    the report's paired intervals over the 3 seeds."""
    import json

    for param, shift in (("standard", True), ("mup", False)):
        for width in (32, 64, 128):
            best = 0.004 * 64 / width if shift else 0.004
            for lr in (0.001, 0.002, 0.004, 0.008):
                for seed in (0, 1, 2):
                    folder = tmp_path / f"{param}-{width}-{lr}-{seed}"
                    folder.mkdir()
                    value = 3.0 + abs(math.log2(lr / best)) * 0.1 + seed * 0.01 + (width == 128) * seed * 0.001
                    config = {"param": {"name": param}, "block": {"d_model": width}, "train": {"lr": lr}, "seed": seed}
                    summary = {"status": "ok", "config": config, "metric": {"name": "val_bpb", "value": value}}
                    (folder / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(
        sys, "argv", ["mup_transfer.py", str(tmp_path), "--base", "64", "--out", str(tmp_path / "t.png")]
    )
    runpy.run_path(str(BENCHMARKS / "mup_transfer.py"), run_name="__main__")
    rates, params, widths = capsys.readouterr().out.split("\n\n")
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line.split("|") for line in rates.splitlines()}
    assert rows[("standard", "32")][-4].strip() == "0.008 (edge: highest)"  # the best rate moved, off the grid
    assert rows[("standard", "128")][-4].strip() == "0.002"
    assert rows[("standard", "128")][-3].strip().startswith("+0.1000 [")  # one octave off: 0.1 worse
    assert rows[("standard", "128")][-3].strip().endswith("worse")
    assert all(rows[("mup", str(w))][-4].strip() == "0.004" for w in (32, 64, 128))
    assert rows[("mup", "128")][-3].strip().startswith("+0.0000")
    assert "| 128 | -0.1000 [" in params  # at the base's best rate, 0.004: an octave off the standard optimum
    assert "| mup | 128 | 0.004 | 3.0110 | +0.0010 [" in widths  # each width against the base at its rate
    assert (tmp_path / "t.png").stat().st_size > 5_000


def test_block_benchmark_times_the_attention_output_options_against_none(monkeypatch, capsys):
    tiny = "--outputs-only --batch 2 --time 8 --d-model 16 --n-heads 4 --repeats 1 --threads 1"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["block.py", *tiny.split()])
    runpy.run_path(str(BENCHMARKS / "block.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "| none |" in out and "| 1.000 | 1.0000 |" in out  # none against itself
    for name in ("gate=headwise", "gate=elementwise", "sink=learned", "xsa=true", "all three (elementwise)"):
        assert f"| {name} |" in out
    again = next(line for line in out.splitlines() if line.startswith("| none, again |"))  # the noise floor
    assert again.endswith("| 1.0000 |")  # the same model as none, timed twice


def test_mixers_benchmark_times_whole_models_per_mixer(monkeypatch, capsys):
    tiny = "--d-model 16 --heads 4 --layers 1 --vocab 32 --seq-len 8 --batch 2 --chunk 4 --repeats 1 --threads 1"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["mixers.py", *tiny.split()])
    runpy.run_path(str(BENCHMARKS / "mixers.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "| mixer | parameters | tokens/s | / mha (softmax, sdpa) | FLOPs / token | GFLOP/s |" in out
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert {"mha (softmax, sdpa)", "linear (chunked)", "gated_deltanet (chunked)"} <= set(rows)
    assert " | 1.00 | " in rows["mha (softmax, sdpa)"]


def test_mixers_benchmark_adds_the_hybrid_from_four_layers_and_matches_parameters(monkeypatch, capsys):
    tiny = "--d-model 16 --heads 4 --layers 4 --vocab 32 --seq-len 8 --batch 2 --chunk 4 --repeats 1 --threads 1"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["mixers.py", *tiny.split(), "--match"])
    runpy.run_path(str(BENCHMARKS / "mixers.py"), run_name="__main__")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ")}  # fmt: skip
    hybrid, mha = rows["hybrid 3 gated_deltanet : 1 mha"], rows["mha (softmax, sdpa)"]
    params = {name: int(row[1].replace(",", "")) for name, row in rows.items() if name not in ("mixer", "---")}
    assert params["mha (softmax, sdpa)"] == 13008 and abs(params[hybrid[0].lstrip("| ")] - 13008) < 0.01 * 13008
    assert mha[3] == "1.00" and int(hybrid[4].replace(",", "")) > int(mha[4].replace(",", ""))  # more FLOPs/token


def test_sweep_check_benchmark_times_the_check_before_any_run(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["sweep_check.py", "quick"])
    runpy.run_path(str(BENCHMARKS / "sweep_check.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.startswith("load average ") and "| quick | 12 (0) | " in out


def test_presets_benchmark_times_each_preset_beside_a_llama_of_matched_parameters(monkeypatch, capsys):
    tiny = "--presets gpt --steps 1 --repeats 1 --batch 2 --seq-len 8 --threads 1 block.d_model=64 model.n_layers=2"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["presets.py", *tiny.split()])
    script = runpy.run_path(str(BENCHMARKS / "presets.py"), run_name="__main__")
    rows = {row[0].strip("| "): row[1:] for line in capsys.readouterr().out.splitlines()
            if (row := line.split(" | "))[0] in ("| gpt", ) or line.startswith("| llama ")}  # fmt: skip
    peer = next(name for name in rows if name.startswith("llama "))
    width, depth = (int(v) for v in peer.removeprefix("llama ").split(" x "))
    assert depth == 2 and float(rows["gpt"][-1].rstrip(" |")) > 0  # the same depth; a measured ratio
    total = int(rows["gpt"][0].replace(",", ""))

    def llama(d_model: int) -> int:
        overrides = ["preset=llama", f"block.d_model={d_model}", "block.n_heads=8", "model.n_layers=2"]
        return script["counts"](script["run_config"](overrides, script["argparse"].Namespace(
            seq_len=8, batch=2, device="cpu")))[0]  # fmt: skip

    assert llama(width) == int(rows[peer][0].replace(",", ""))
    assert abs(llama(width) - total) <= min(abs(llama(width + d) - total) for d in (-16, 16))  # the nearest width


def test_presets_benchmark_times_named_variants_against_the_first(monkeypatch, capsys):
    model = ["block.d_model=32", "block.n_heads=4", "model.n_layers=2"]
    tiny = ["--steps", "1", "--repeats", "1", "--batch", "2", "--seq-len", "8", "--threads", "1", *model]
    variants = ["base:", "bigram:model.ngram=2", "wide:block.d_ff=160,block.bias=false"]
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["presets.py", "--variants", *variants, *tiny])
    script = runpy.run_path(str(BENCHMARKS / "presets.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "load average " in out and "| variant | parameters | of them n-gram |" in out
    rows = {cells[0].removeprefix("| "): cells[1:] for line in out.splitlines()
            if (cells := line.split(" | "))[0] in ("| base", "| bigram", "| wide")}  # fmt: skip
    assert list(rows) == ["base", "bigram", "wide"] and rows["base"][-1] == "1.000 |"
    for name, overrides in script["parse_variants"](variants).items():
        args = script["argparse"].Namespace(seq_len=8, batch=2, device="cpu")
        raw = script["run_config"]([*model, *overrides], args)
        counted = script["build_run_model"](raw).parameter_counts()
        assert rows[name][0] == f"{counted['total']:,}" and rows[name][1] == f"{counted.get('ngram', 0):,}"
    assert rows["bigram"][1] != "0" and rows["base"][1] == rows["wide"][1] == "0"  # the table counted apart
    assert float(rows["wide"][-1].removesuffix(" |")) > 0
    try:
        script["parse_variants"](["base:", "base:model.ngram=2"])
    except SystemExit as error:
        assert "NAME:OVERRIDE" in str(error)
    else:
        raise AssertionError("a repeated variant name was accepted")


def flex_benchmark(monkeypatch, capsys, args: str) -> tuple[str, list[list[str]]]:  # noqa: ANN001
    """benchmarks/flex.py run with ``args``: what it printed, and its table's rows (a window row, then documents)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["flex.py", *args.split()])
    runpy.run_path(str(BENCHMARKS / "flex.py"), run_name="__main__")
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| window", "| documents"))]
    assert [row[0] for row in rows] == ["| window", "| documents"], out
    return out, rows


@pytest.mark.slow
def test_flex_benchmark_times_flex_against_sdpa_with_an_explicit_mask(monkeypatch, capsys):
    tiny = "--lengths 32 --batch 1 --heads 2 --kv-heads 1 --head-dim 16 --window 8 --docs 3 --repeats 1"
    _, rows = flex_benchmark(monkeypatch, capsys, tiny)
    for row in rows:
        assert float(row[4]) > 0 and float(row[5].rstrip(" |")) < 1e-5, row  # a ratio; the same function


def test_flex_benchmark_uncompiled_times_zoos_block_mask_against_create_block_mask(monkeypatch, capsys):
    tiny = "--uncompiled --lengths 6 --batch 2 --heads 4 --kv-heads 2 --head-dim 4 --window 3 --docs 2 --repeats 2"
    out, rows = flex_benchmark(monkeypatch, capsys, tiny)
    assert "| mask | length | create_block_mask ms | zoo ms | create_block_mask / zoo |" in out, out
    for row in rows:
        assert float(row[4]) > 0 and float(row[5].rstrip(" |")) == 0, row  # a ratio; the very same output


def test_flex_benchmark_times_bracket_masks_through_dynamo_against_the_contracts_direct_call(monkeypatch, capsys):
    tiny = "--uncompiled-paths --lengths 6 --batch 2 --heads 4 --kv-heads 2 --head-dim 4 --window 3 --docs 2"
    tiny += " --repeats 2"
    out, rows = flex_benchmark(monkeypatch, capsys, tiny)
    assert "| [] through Dynamo ms | at, direct ms | [] through Dynamo / at, direct |" in out, out
    for row in rows:
        assert float(row[4]) > 0 and float(row[5].rstrip(" |")) == 0, row  # a ratio; the very same output


def test_compile_benchmark_times_the_capture_with_einops_traced_and_with_static_plans(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", ["compile.py", "--rows", "1", "--repeats", "1"])
    runpy.run_path(str(BENCHMARKS / "compile.py"), run_name="__main__")
    out = capsys.readouterr().out
    row = out.strip().splitlines()[-1].strip("|").split("|")
    blocks, traced, planned, ratio = int(row[0]), *map(float, row[1:])
    assert blocks == 1 and traced > 0 and planned > 0
    assert math.isclose(ratio, traced / planned, rel_tol=0.02, abs_tol=0.01)
    import zoo.core.reshape

    assert zoo.core.reshape.STATIC_PLANS  # restored after the einops-traced steps
