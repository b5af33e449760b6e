"""Model units: what one request costs, before it runs and after. Pure, and the ground floor:
it imports nothing of ours, so the router, the ledger, the fitting and the simulator all price
with the one rule here (`price`) and the one normalisation (`MU_PER_REPLICA_MINUTE`).

    cost = alpha * input_tokens + beta * output_tokens + gamma        [MU]
         + rho * input_tokens * log2(output_tokens)                   (prefill stalls)
         + kappa * output_tokens * (input_tokens + output_tokens / 2) (KV token-steps)
         + delta * images                                             (vision inputs)

alpha, beta and gamma are the headline price; rho and kappa (0 unless a benchmark fitted them)
refine it where the two straight lines under-price long requests. `kappa`: a batch bounded by
the KV cache holds fewer sequences the longer each one's context, so a request costs in
proportion to the KV it holds over its decode steps, sum over t of (in + t) ~ out x (in + out/2)
token-steps. `rho`: under a latency SLO, every prompt token prefilled stalls the decode step of
every running sequence, so long prompts shrink the batch that meets the SLO the more, the longer
the answers run (the simulated L40S: 512 x 128 costs 1.38x the straight-line price); log2(out)
is 0 for a one-token answer (no decode to stall) and rises slowly, as the batch shrinks.

Worked numbers for an 8B model on an H100 priced alpha=0.0004, beta=0.004, gamma=0.02:
a 50-in / 50-out chat turn costs 0.02 + 0.2 + 0.02 = 0.24 MU, so one replica (100 MU/min)
serves about 416 of them a minute; a 2,000-token prompt with 10 tokens out costs 0.8 + 0.04 +
0.02 = 0.86 MU. Before a request runs, its output is priced at max_tokens (the most it may
cost); afterwards the engine's usage gives the exact count. Prompt tokens that hit the prefix
cache skip prefill, so they are charged at `cached_token_factor` of alpha.
"""

import math
from dataclasses import dataclass

# Without a tokenizer at hand, English text runs about 4 bytes per token (OpenAI's rule of thumb).
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
    images: int = 0,
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
    if delta and images > 0:
        cost += delta * images
    return cost


def prefill_stall(input_tokens: float, output_tokens: float) -> float:
    """input x log2(output): 0 for one output token; 2,048 x 512 -> 18,432."""
    return input_tokens * math.log2(output_tokens) if output_tokens >= 1 else 0.0


def kv_token_steps(input_tokens: float, output_tokens: float) -> float:
    """KV tokens a request holds, summed over its decode steps: out x (in + out / 2).
    2,048 x 512 -> 1,179,648."""
    return output_tokens * (input_tokens + output_tokens / 2)


@dataclass(frozen=True)
class CostModel:
    alpha: float  # MU per input (prompt) token; >= 0
    beta: float  # MU per output (generated) token; >= 0, normally > alpha
    gamma: float  # MU per request, whatever its size; >= 0
    cached_token_factor: float = 0.1  # share of alpha a prefix-cache hit still costs; in [0, 1]
    rho: float = 0.0  # MU per prompt token x log2(output tokens) (prefill stalls); >= 0
    kappa: float = 0.0  # MU per KV token-step, out x (in + out / 2) (KV-bound batches); >= 0
    delta: float = 0.0  # MU per image of a request (vision encoder and preprocessing); >= 0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma", "rho", "kappa", "delta"):
            value = getattr(self, name)
            if not (value >= 0 and value != float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0 <= self.cached_token_factor <= 1:
            raise ValueError(f"cached_token_factor must be in [0, 1], got {self.cached_token_factor!r}")

    def cost(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0, images: int = 0) -> float:
        """MU of a request with these token counts (cached_tokens <= input_tokens) and images."""
        cached = min(max(cached_tokens, 0), input_tokens)
        fresh = input_tokens - cached
        return price(
            self.alpha,
            self.beta,
            self.gamma,
            fresh + self.cached_token_factor * cached,
            output_tokens,
            self.rho,
            self.kappa,
            self.delta,
            images,
        )

    def estimate(self, prompt_bytes: int, max_tokens: int) -> float:
        """MU before the request runs: prompt tokens from its size, output at max_tokens."""
        return self.cost(estimate_tokens(prompt_bytes), max_tokens)

    def requests_per_minute(
        self, input_tokens: int, output_tokens: int, mu_per_replica_minute: float
    ) -> float:
        """How many requests of one shape a replica serves per minute: 100 / 0.24 = 416.7."""
        return mu_per_replica_minute / self.cost(input_tokens, output_tokens)


def estimate_tokens(prompt_bytes: int) -> int:
    """Tokens in a prompt of this many bytes, rounded up: 0 -> 0, 1..4 -> 1, 401 -> 101."""
    return -(-max(prompt_bytes, 0) // BYTES_PER_TOKEN)
