"""`{% load console_format %}`: the console's figures, written by capacity.numbers. `figure` is
the number for people ("3,388.24"), `quantity:"GPU"` with its unit ("1 GPU", "8 GPUs"), `unit`
the unit alone, `percent` a fraction as a percentage ("5.2 %"); each carries the exact value in a
title where what it shows is rounded, and is bare text where nothing is lost (`<td>8</td>`).
`{% meaning "alpha" %}` is what a figure means, for the title beside it."""

import functools

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from capacity import numbers
from controlplane.api.serializers.ledgers import ModelCapacitySerializer, PoolCapacitySerializer

register = template.Library()


def _figure(value: numbers.Number | None, text: str, places: int = 2) -> SafeString:
    if numbers.rounded(value, places):
        return format_html('<span class="figure" title="{}">{}</span>', numbers.exact(value), text)
    return format_html("{}", text)


@register.filter
def figure(value: numbers.Number | None, places: int = 2) -> SafeString:
    return _figure(value, numbers.shown(value, places), places)


@register.filter
def quantity(value: numbers.Number | None, unit: str) -> SafeString:
    return _figure(value, numbers.with_unit(value, unit))


@register.filter
def unit(value: numbers.Number | None, name: str) -> str:
    """The unit alone, as `quantity` would write it after the value: for a figure set apart."""
    return numbers.unit_for(numbers.shown(value), name)


@register.filter
def percent(share: numbers.Number | None) -> SafeString:
    """A fraction as a percentage, to one decimal under 10 % (0.052 -> "5.2 %", 0.31 -> "31 %")."""
    if share is None:
        return format_html("{}", "—")
    value = float(share) * 100
    text = f"{numbers.shown(round(value, 1 if abs(value) < 10 else 0))} %"
    return format_html('<span class="figure" title="{}">{}</span>', numbers.exact(share), text)


# What each figure of a model-unit profile means, for the titles beside it (the profile table's
# headings and cells, a benchmark's line): docs/capacity-ledger.md, "Reading the capacity page".
COEFFICIENTS = {
    "alpha": "alpha, MU per input token: what prefill costs. 1,000 input tokens cost 1,000 x alpha MU.",
    "beta": "beta, MU per output token: what decode costs, usually more than alpha.",
    "gamma": "gamma, MU per request whatever its tokens: a fixed overhead. It may be negative (down"
    " to -beta) where requests measured cheaper than their tokens alone; a one-token answer never"
    " costs below 0.",
    "rho": "rho, MU per input token x log2(output tokens): long prompts that stall prefill under"
    " the latency target. 0: the benchmark found no such cost.",
    "kappa": "kappa, MU per KV-cache token-step, output x (input + output / 2): batches bounded by"
    " the KV cache, so long requests are never priced below what they cost. 0: none found.",
    "delta": "delta, MU per image token, on top of the prompt's prefill.",
    "cached_token_factor": "The share of alpha a prompt token found in the prefix cache costs.",
    "mu_per_replica_minute": "MU/min one replica serves: capacity is sold in these.",
    "gpus_per_replica": "GPUs one replica takes, all on one node.",
    "r2": "R squared, how much of the measured cost the fit explains: 1 is all of it.",
    "heldout_mape": "The fit's mean error on request shapes it was not fitted on; a fit with more"
    " than BENCHMARK_MAX_HELDOUT_MAPE is refused.",
    "samples": "Request shapes (input, output tokens) the benchmark measured.",
}


@register.simple_tag
def meaning(name: str) -> str:
    """The title for a figure: a profile's coefficient (COEFFICIENTS), else a pool's ledger
    figure as /api/v1/capacity/ describes it (its serializer's help text: the API's schema and
    the console say the same), "model.<name>" for a per-model one."""
    if name in COEFFICIENTS:
        return COEFFICIENTS[name]
    return _ledger_meanings()[name]


@functools.cache
def _ledger_meanings() -> dict[str, str]:
    pool = {name: str(f.help_text or "") for name, f in PoolCapacitySerializer().fields.items()}
    model = {f"model.{name}": str(f.help_text or "") for name, f in ModelCapacitySerializer().fields.items()}
    return pool | model
