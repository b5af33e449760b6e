"""What a request's images and its cached prompt prefix cost beyond its tokens, measured: the
benchmark's second pass, after the text sweep has fitted alpha, beta, gamma (rho, kappa).

Images (``delta``, MU per image token): each image shape (text in x out, n images of w x h) is
swept as the text shapes are; its cost 100 / R_s less the text price of its prompt *as the engine
counts it* (usage.prompt_tokens, which holds the images' placeholder tokens: 256 for 448 x 448 on
Qwen2-VL) is what its images cost beyond their prefill; delta fits that per image token (the
vision encoder runs over the image's tokens). The router meters the same way: the engine's prompt
tokens at alpha, plus delta per image token. Per image instead, the simulated Qwen2-VL's fit
priced a 1,024 x 768 image 21 % under (held-out 10.2 %); per image token 3.9 % (held-out 1.6 %).

Prefix cache (``cached_token_factor``, the share of alpha a cached prompt token still costs):
each prefix shape (in x out, its first ``shared`` tokens common to every request) is swept, the
cached tokens per request are read from the engine's own figures (its prefix cache's
``cached_tokens``, as vLLM reports them in usage.prompt_tokens_details), and the factor is
fitted from cost = price(fresh + factor x cached, out).

Both are one coefficient, and the price is linear in it (a_s + b_s x theta), so the weighted
least squares (relative residuals, as capacity.fitting) is closed form:
theta = sum(b (c - a) / c^2) / sum(b^2 / c^2), with a 95 % interval from its residuals and a
leave-one-shape-out held-out MAPE. Worked numbers: shapes costing 0.30 and 0.50 MU whose text
prices are 0.20 and 0.30 with 1,000 and 2,000 image tokens -> theta = (0.1 x 1000 / 0.09 + 0.2 x
2000 / 0.25) / (1000^2 / 0.09 + 2000^2 / 0.25) = 0.0001 MU per image token; both predicted
exactly (held-out 0 %).

The images and the shared prefix are SIMULATED here (``VisionDriver``, in-process, virtual
clock); over HTTP the text sweep alone runs (the HTTP driver sends token-id prompts, no images).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from capacity.benchmark.config import Slo, SweepConfig, on_virtual_clock
from capacity.benchmark.drivers import SimulatedDriver
from capacity.benchmark.sweep import sweep
from capacity.fitting import _T975, Fit
from capacity.units import MU_PER_REPLICA_MINUTE, CostModel
from dataplane.runtime.prefix_cache import BLOCK_SIZE, PrefixCache, block_hashes
from engine_model import perf_model


@dataclass(frozen=True)
class ImageShape:
    input_tokens: int  # text prompt tokens, >= 1
    output_tokens: int  # >= 1
    images: int  # images per request, >= 1
    width: int  # pixels of each image
    height: int


@dataclass(frozen=True)
class PrefixShape:
    input_tokens: int  # prompt tokens, >= 2
    output_tokens: int  # >= 1
    shared: int  # leading prompt tokens every request of the shape has in common, < input_tokens


# Common sizes (448 x 448 and 640 x 480 photos, a 1,024 x 768 screenshot), one to four images,
# short and long prompts and answers.
IMAGE_SHAPES = (
    ImageShape(128, 16, 1, 448, 448),
    ImageShape(128, 128, 1, 448, 448),
    ImageShape(512, 16, 1, 640, 480),
    ImageShape(512, 128, 2, 640, 480),
    ImageShape(128, 16, 4, 448, 448),
    ImageShape(128, 16, 1, 1024, 768),
    ImageShape(2048, 128, 2, 1024, 768),
)


def prefix_shapes(max_model_len: int) -> tuple[PrefixShape, ...]:
    """A system prompt shared by every request (RAG, agents), from a quarter to nearly all of the
    prompt, on a long prompt (2,048 tokens, or the largest power of two within half the context)
    and one a quarter of that: 8,192 -> 2,048 and 512; the 512-token tiny-test -> 256 and 64."""
    big = min(2048, 1 << max(4, (max_model_len // 2).bit_length() - 1))
    small = big // 4
    return (
        PrefixShape(small, 16, small * 7 // 8),
        PrefixShape(small, 128, small // 2),
        PrefixShape(big, 16, big * 7 // 8),
        PrefixShape(big, 128, big // 2),
        PrefixShape(big, 1, big * 15 // 16),
    )


@dataclass
class VisionDriver(SimulatedDriver):
    """The simulated engine's performance model with images and a shared prompt prefix: every
    request carries ``images`` (width, height) and starts with the same ``shared_prefix``
    tokens; the prefix cache decides what is cached, as the engine's would, and the driver
    keeps its figures (``cached_tokens`` over ``requests``)."""

    images: tuple[tuple[int, int], ...] = ()
    shared_prefix: int = 0
    cache_blocks: int = 4096  # blocks the prefix cache holds: the shared prefix and then some
    cached_tokens: int = 0  # the engine's figures: prompt tokens found cached, summed
    requests: int = 0
    prompt_tokens: int = 0  # as the engine counts them: text + image placeholder tokens, summed
    _cache: PrefixCache = field(init=False)
    _fresh: itertools.count[int] = field(init=False)
    _shared_hashes: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        vision = self.profile.vision
        if self.images and vision is None:
            raise ValueError(f"profile {self.profile.name} has no vision encoder: it takes no images")
        extra = f", {len(self.images)} image(s)" if self.images else ""
        extra += f", shared prefix {self.shared_prefix}" if self.shared_prefix else ""
        self.name = self.name.replace(" (in-process", f"{extra} (in-process", 1)
        self._cache = PrefixCache(self.cache_blocks)
        self._fresh = itertools.count(1_000_000)

    def _request(self, shape: tuple[int, int]) -> perf_model.SimRequest:
        req = super()._request(shape)
        vision = self.profile.vision
        if vision is not None and self.images:
            req.prompt_tokens += sum(vision.image_tokens(w, h) for w, h in self.images)
            req.encoder_s = sum(vision.encoder_s(w, h) for w, h in self.images)
            req.preprocess_s = sum(vision.preprocess_s(w, h) for w, h in self.images)
        if self.shared_prefix:  # the shared blocks' hashes once, the rest per request
            whole = self.shared_prefix - self.shared_prefix % BLOCK_SIZE
            if not self._shared_hashes:
                self._shared_hashes = block_hashes(range(whole))
            parent = self._shared_hashes[-1] if self._shared_hashes else 0
            rest = [
                *range(whole, self.shared_prefix),
                *itertools.islice(self._fresh, shape[0] - self.shared_prefix),
            ]
            hashes = self._shared_hashes + block_hashes(rest, BLOCK_SIZE, parent)
            req.cached_tokens = self._cache.lookup_blocks(hashes, shape[0])
        self.requests += 1
        self.cached_tokens += req.cached_tokens
        self.prompt_tokens += req.prompt_tokens
        return req


@dataclass(frozen=True)
class OneTermFit:
    value: float  # the coefficient: delta (MU per image token) or the cached-token factor
    interval: tuple[float, float]  # its 95 % confidence interval
    heldout_mape: float  # leave-one-shape-out, 0.05 = 5 %
    samples: int  # shapes measured
    rows: tuple[dict[str, float | int], ...]  # per shape: what was measured and predicted


def fit_linear_term(
    costs: Sequence[float], base: Sequence[float], slope: Sequence[float], low: float, high: float
) -> tuple[float, tuple[float, float], float]:
    """(theta, 95 % interval, held-out MAPE) for cost_s ~ base_s + slope_s x theta, theta in
    [low, high], on relative residuals (module docstring for the worked numbers)."""

    def solve(idx: Sequence[int]) -> float:
        den = sum((slope[k] / costs[k]) ** 2 for k in idx)
        num = sum(slope[k] * (costs[k] - base[k]) / costs[k] ** 2 for k in idx)
        return min(max(num / den, low), high) if den > 0 else low

    n = len(costs)
    everything = range(n)
    theta = solve(everything)
    heldout = [
        abs((base[k] + slope[k] * solve([j for j in everything if j != k])) / costs[k] - 1)
        for k in everything
    ]
    den = sum((slope[k] / costs[k]) ** 2 for k in everything)
    half = 0.0
    if n > 1 and den > 0:
        sse = sum(((base[k] + slope[k] * theta) / costs[k] - 1) ** 2 for k in everything)
        half = _t975(n - 1) * math.sqrt(sse / (n - 1) / den)
    return theta, (max(theta - half, low), min(theta + half, high)), sum(heldout) / n if n else 0.0


def _t975(dof: int) -> float:
    """Student's t, two-sided 97.5 % (the table capacity.fitting's intervals use)."""
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


async def measure_images(
    profile: perf_model.EngineProfile,
    text: CostModel,
    config: SweepConfig = SweepConfig(),
    slo: Slo = Slo(),
    shapes: Sequence[ImageShape] = IMAGE_SHAPES,
    mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE,
) -> OneTermFit:
    """delta, MU per image token, of a vision profile, given its text price ``text``."""
    costs, base, slope, rows = [], [], [], []
    for s in shapes:
        driver = VisionDriver(profile, seed=config.seed, images=((s.width, s.height),) * s.images)
        rate = await _rate(driver, (s.input_tokens, s.output_tokens), config, slo)
        prompt = driver.prompt_tokens / driver.requests  # as the engine counts it, images included
        cost = mu_per_replica_minute / rate
        costs.append(cost)
        base.append(text.cost(round(prompt), s.output_tokens))
        slope.append(prompt - s.input_tokens)  # the images' tokens
        rows.append({
            "input_tokens": s.input_tokens, "output_tokens": s.output_tokens, "images": s.images,
            "width": s.width, "height": s.height, "prompt_tokens": round(prompt),
            "requests_per_minute": rate, "cost_mu": cost,
        })  # fmt: skip
    delta, interval, heldout = fit_linear_term(
        costs, base, slope, 0.0, max(c / t for c, t in zip(costs, slope, strict=True))
    )
    for row, b, x in zip(rows, base, slope, strict=True):
        row["fitted_mu"] = b + delta * x
    return OneTermFit(delta, interval, heldout, len(rows), tuple(rows))


async def measure_prefix_cache(
    profile: perf_model.EngineProfile,
    text: CostModel,
    config: SweepConfig = SweepConfig(),
    slo: Slo = Slo(),
    shapes: Sequence[PrefixShape] | None = None,
    mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE,
) -> OneTermFit:
    """The cached-token factor (share of alpha a cached prompt token costs), given ``text``."""
    costs, base, slope, rows = [], [], [], []
    for s in shapes or prefix_shapes(profile.max_model_len):
        if s.input_tokens + s.output_tokens > profile.max_model_len:
            continue
        driver = VisionDriver(profile, seed=config.seed, shared_prefix=s.shared)
        rate = await _rate(driver, (s.input_tokens, s.output_tokens), config, slo)
        cached = driver.cached_tokens / driver.requests  # the engine's figures, per request
        cost = mu_per_replica_minute / rate
        free = replace(text, cached_token_factor=0.0)
        fresh_price = free.cost(s.input_tokens, s.output_tokens, round(cached))
        costs.append(cost)
        base.append(fresh_price)
        slope.append(text.cost(s.input_tokens, s.output_tokens) - fresh_price)
        rows.append({
            "input_tokens": s.input_tokens, "output_tokens": s.output_tokens, "shared": s.shared,
            "cached_tokens": round(cached), "requests_per_minute": rate, "cost_mu": cost,
        })  # fmt: skip
    if not rows:
        raise ValueError(f"no prefix shape fits {profile.name}'s context of {profile.max_model_len}")
    factor, interval, heldout = fit_linear_term(costs, base, slope, 0.0, 1.0)
    for row, b, x in zip(rows, base, slope, strict=True):
        row["fitted_mu"] = b + factor * x
    return OneTermFit(factor, interval, heldout, len(rows), tuple(rows))


async def _rate(driver: VisionDriver, shape: tuple[int, int], config: SweepConfig, slo: Slo) -> float:
    """The shape's sustainable requests per minute on the virtual clock."""
    one = replace(on_virtual_clock(config), shapes=(shape,))
    result = await sweep(driver, one, slo, clock=lambda: driver.elapsed_s)
    rate = result.shapes[0].sustainable_per_minute
    if rate <= 0:
        raise ValueError(f"{driver.name}: shape {shape} sustains nothing within the SLO")
    return rate


@dataclass(frozen=True)
class Extras:
    images: OneTermFit | None  # delta; None: the profile takes no images
    prefix: OneTermFit  # the cached-token factor

    def to_json(self) -> dict[str, dict[str, object]]:
        """The record's form (ProfileFit.extras), by coefficient name."""
        terms = (("delta", self.images), ("cached_token_factor", self.prefix))
        return {
            name: {
                "value": t.value,
                "interval": list(t.interval),
                "heldout_mape": t.heldout_mape,
                "samples": t.samples,
                "shapes": list(t.rows),
            }
            for name, t in terms
            if t is not None
        }

    def verdict(self, max_mape: float, max_underprice: float) -> tuple[bool, bool, str]:
        """(delta may be published, the cached-token factor may be, why): a refused delta
        refuses the fit (images would be priced wrong); a refused factor only keeps the one in
        place (cached tokens priced as before), and the text fit may still publish."""
        delta_ok, factor_ok = True, _refusal(self.prefix, max_mape, max_underprice) is None
        why = f"cached-token factor {self.prefix.value:.3g} (held-out {self.prefix.heldout_mape:.1%})"
        if not factor_ok:
            why = f"cached-token factor not published: {_refusal(self.prefix, max_mape, max_underprice)}"
        if self.images is not None:
            refusal = _refusal(self.images, max_mape, max_underprice)
            delta_ok = refusal is None
            i = self.images
            shown = f"delta {i.value:.3g} MU/image token (held-out {i.heldout_mape:.1%})"
            why = f"{shown}, {why}" if delta_ok else f"delta refused: {refusal}"
        return delta_ok, factor_ok, why


def _refusal(term: OneTermFit, max_mape: float, max_underprice: float) -> str | None:
    if term.heldout_mape > max_mape:
        return f"held-out MAPE {term.heldout_mape:.1%} > {max_mape:.0%}"
    worst = min(float(r["fitted_mu"]) / float(r["cost_mu"]) - 1 for r in term.rows)
    if worst < -max_underprice:
        return f"a shape priced {-worst:.1%} under its measurement (> {max_underprice:.0%})"
    return None


async def measure_extras(
    profile: perf_model.EngineProfile,
    fit: Fit,
    config: SweepConfig = SweepConfig(),
    slo: Slo = Slo(),
    mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE,
) -> Extras:
    """Images (when the profile has a vision encoder) and the prefix cache, priced on ``fit``."""
    text = CostModel(fit.alpha, fit.beta, fit.gamma, rho=fit.rho, kappa=fit.kappa)
    images = None
    if profile.vision is not None:
        images = await measure_images(profile, text, config, slo, mu_per_replica_minute=mu_per_replica_minute)
    prefix = await measure_prefix_cache(
        profile, text, config, slo, mu_per_replica_minute=mu_per_replica_minute
    )
    return Extras(images, prefix)
