"""Model units: what one request costs, before it runs and after. Pure, and the ground floor:
it imports nothing of ours, so the router, the ledger, the fitting and the simulator all price
with the one rule here (`price`) and the one normalisation (`MU_PER_REPLICA_MINUTE`).

    cost = alpha * input_tokens + beta * output_tokens + gamma        [MU]
         + rho * input_tokens * log2(output_tokens)                   (prefill stalls)
         + kappa * output_tokens * (input_tokens + output_tokens / 2) (KV token-steps)
         + delta * image_tokens                                       (vision inputs)

gamma may be below 0, down to -beta; a price never is. At alpha 0.0004, beta 0.004, gamma 0.02 a
50-in / 50-out chat turn costs 0.24 MU (a replica of 100 MU/min serves about 416 a minute); output
is priced at max_tokens before a request runs, at the engine's usage after. Why each term:
docs/capacity-model.md, "The price rule".
"""

import math
from dataclasses import dataclass

# Without a tokenizer at hand, text is estimated at 4 UTF-8 bytes a token: English runs about 4
# bytes a token on BPE vocabularies (OpenAI's rule of thumb), and bytes, not characters, are what
# a byte-level tokenizer splits (an emoji is 4 bytes and 1 to 4 tokens, never a quarter of one).
BYTES_PER_TOKEN = 4
# What one replica of a model does per minute on its GPU type, by definition of the model unit.
# The default of the MU_PER_REPLICA_MINUTE setting and of every profile; fits scale with it.
MU_PER_REPLICA_MINUTE = 100
# A model's context length (prompt + output tokens) when nobody said it: 2**20, above that of
# every model we price (Llama 3.1: 131,072), so it refuses absurd output budgets (10**26) and
# nothing an engine accepts. Profiles say the real one (ModelProfile.max_model_len).
DEFAULT_MAX_MODEL_LEN = 1_048_576


def price(
    alpha: float,
    beta: float,
    gamma: float,
    input_tokens: float,
    output_tokens: float,
    rho: float = 0.0,
    kappa: float = 0.0,
    delta: float = 0.0,
    image_tokens: int = 0,
) -> float:
    """The MU price rule: alpha * in + beta * out + gamma + rho * stall(in, out) + kappa * kv(in, out).

    0.0004 * 50 + 0.004 * 50 + 0.02 = 0.24 MU. With kappa 1e-7, a 2,048 x 512 request adds
    1e-7 * 512 * (2,048 + 256) = 0.118 MU. Input tokens may be fractional: prefix-cache hits
    count at a share of a token (CostModel.cost).
    """
    cost = alpha * input_tokens + beta * output_tokens + gamma
    if rho:
        cost += rho * prefill_stall(input_tokens, output_tokens)
    if kappa:
        cost += kappa * kv_token_steps(input_tokens, output_tokens)
    if delta and image_tokens > 0:
        cost += delta * image_tokens
    # a negative gamma prices a request without output tokens at 0, not less (max(cost, 0.0)'s
    # result, without a call: the router prices every request twice)
    return 0.0 if cost < 0.0 else cost


def prefill_stall(input_tokens: float, output_tokens: float) -> float:
    """input x log2(output): 0 for one output token; 2,048 x 512 -> 18,432."""
    return input_tokens * math.log2(output_tokens) if output_tokens >= 1 else 0.0


def kv_token_steps(input_tokens: float, output_tokens: float) -> float:
    """KV tokens a request holds, summed over its decode steps: out x (in + out / 2).
    2,048 x 512 -> 1,179,648."""
    return output_tokens * (input_tokens + output_tokens / 2)


@dataclass(frozen=True)
class CostModel:
    """The price rule's coefficients for one model on one GPU type (its profile's fit); what the
    routing table and the router call an endpoint's ``coefficients``."""

    alpha: float  # MU per input (prompt) token; >= 0
    beta: float  # MU per output (generated) token; >= 0, normally > alpha
    gamma: float  # MU per request, whatever its size; >= -beta (a fitted intercept may be below 0)
    cached_token_factor: float = 0.1  # share of alpha a prefix-cache hit still costs; in [0, 1]
    rho: float = 0.0  # MU per prompt token x log2(output tokens) (prefill stalls); >= 0
    kappa: float = 0.0  # MU per KV token-step, out x (in + out / 2) (KV-bound batches); >= 0
    delta: float = 0.0  # MU per image token of a request (its vision encoder); >= 0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "rho", "kappa", "delta"):
            value = getattr(self, name)
            if not (value >= 0 and value != float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (self.gamma >= -self.beta and math.isfinite(self.gamma)):
            raise ValueError(f"gamma must be a finite number >= -beta ({-self.beta!r}), got {self.gamma!r}")
        if not 0 <= self.cached_token_factor <= 1:
            raise ValueError(f"cached_token_factor must be in [0, 1], got {self.cached_token_factor!r}")

    def cost(
        self, input_tokens: int, output_tokens: int, cached_tokens: int = 0, image_tokens: int = 0
    ) -> float:
        """MU of a request with these token counts (cached_tokens <= input_tokens; input_tokens
        holds the image_tokens, as the engine counts them)."""
        prompt = input_tokens + 0.0  # a float, as fresh + factor x cached is
        if cached_tokens:  # clamped to the prompt (the usual request has none: no clamp calls)
            cached = min(max(cached_tokens, 0), input_tokens)
            prompt = input_tokens - cached + self.cached_token_factor * cached
        return price(
            self.alpha,
            self.beta,
            self.gamma,
            prompt,
            output_tokens,
            self.rho,
            self.kappa,
            self.delta,
            image_tokens,
        )

    def estimate(self, prompt_bytes: int, max_tokens: int) -> float:
        """MU before the request runs: prompt tokens from its size, output at max_tokens."""
        return self.cost(estimate_tokens(prompt_bytes), max_tokens)

    def requests_per_minute(
        self, input_tokens: int, output_tokens: int, mu_per_replica_minute: float
    ) -> float:
        """How many requests of one shape a replica serves per minute: 100 / 0.24 = 416.7."""
        return mu_per_replica_minute / self.cost(input_tokens, output_tokens)


def estimate_tokens(prompt_bytes: int, bytes_per_token: int = BYTES_PER_TOKEN) -> int:
    """Tokens in a prompt of this many UTF-8 bytes, rounded up: 0 -> 0, 1..4 -> 1, 401 -> 101."""
    return -(-max(prompt_bytes, 0) // bytes_per_token)


def text_bytes(text: str) -> int:
    """UTF-8 bytes of a text, what ``estimate_tokens`` counts: "hello" -> 5, "héllo" -> 6, an
    emoji -> 4; a lone surrogate (JSON's "\\ud800") 3."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


# An image's tokens, as Qwen2-VL's processor counts them (HF Qwen2VLImageProcessor smart_resize):
# resized to multiples of IMAGE_PATCH_PX within [IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS], one token per
# 28 x 28 cell. The router estimates with it before the engine says (usage's multimodal tokens).
IMAGE_PATCH_PX = 28  # 14-pixel patches merged 2 x 2
IMAGE_MIN_PIXELS = 56 * 56
IMAGE_MAX_PIXELS = 28 * 28 * 1280  # 1,280 tokens an image at most (vLLM's serving recipe)


def image_tokens(
    width: int,
    height: int,
    patch_px: int = IMAGE_PATCH_PX,
    min_pixels: int = IMAGE_MIN_PIXELS,
    max_pixels: int = IMAGE_MAX_PIXELS,
) -> int:
    """Tokens of one image: 448 x 448 -> 16 x 16 = 256; 1,024 x 768 -> 1,036 x 756 -> 37 x 27 = 999;
    1,920 x 1,080 -> 1,316 x 728 (capped) -> 47 x 26 = 1,222; 20 x 20 -> 56 x 56 -> 4."""
    f = patch_px
    w, h = max(f, round(width / f) * f), max(f, round(height / f) * f)
    if w * h > max_pixels:
        scale = math.sqrt(width * height / max_pixels)
        w, h = max(f, math.floor(width / scale / f) * f), max(f, math.floor(height / scale / f) * f)
    elif w * h < min_pixels:
        scale = math.sqrt(min_pixels / (width * height))
        w, h = math.ceil(width * scale / f) * f, math.ceil(height * scale / f) * f
    return (w // f) * (h // f)
