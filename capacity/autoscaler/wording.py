"""The horizontal decider's decisions in words, one rule for every scale event; pure. A sentence
first, naming the rule that set the replicas (horizontal.Rule) with its figure over the window
that rule reads ("scaled 2 -> 3: 2.3 replicas needed over the last 20 s", "scaled 1 -> 2: raised
to the minimum 2"), then the same numbers in every event (the scale-up window's load and needs,
the scale-down window's highest need, a burst's hold), all the decision's own
(`Decision.figures`), so a scale-down after a scale-up quotes what the scale-up did. A need is
rounded up to a tenth: 3.01 reads "3.1", never fewer replicas than were asked for."""

from __future__ import annotations

import math
from typing import Any

from capacity.autoscaler.horizontal import Decision, Figures, Rule


def headline(d: Decision) -> str:
    """What happened and why, for a person: "scaled 2 -> 3: ...", "held at 3: ..." or "samples
    cover ...: no decision"."""
    if d.replicas is None:
        return sentence(d)
    if d.replicas == d.current:
        return f"held at {d.current}: {sentence(d)}"
    return f"scaled {d.current} -> {d.replicas}: {sentence(d)}"


def explain(d: Decision, held: str = "", held_figures: str = "") -> str:
    """The sentence, then the numbers: what a scale event says after "scaled 2 -> 3: ". Where
    the actuator held the decision lower (its pool's room), `held` says so in the sentence and
    `held_figures` comes before the decision's numbers."""
    first = f"{sentence(d)}, {held}" if held else sentence(d)
    rest = [text for text in (held_figures, numbers(d)) if text]
    return ". ".join([first, *(f"{text[:1].upper()}{text[1:]}" for text in rest)])


def sentence(d: Decision) -> str:
    """Why the decision is what it is, by the rule that set it, with that rule's figure."""
    f, cfg = d.figures, d.figures.config
    replicas = d.replicas
    if d.rule is Rule.NO_DATA or replicas is None:
        return f"samples cover {f.coverage:.0%} of the last {cfg.scale_up_window_s:g} s: no decision"
    over_up = f"over the last {cfg.scale_up_window_s:g} s"
    over_down = f"over the last {cfg.scale_down_window_s:g} s"
    up = f"{_tenths(d.need)} replicas needed {over_up}{_plan(f)}"
    down = f"at most {_tenths(d.down_need)} replicas needed {over_down}{_plan(f)}"
    if d.rule is Rule.LOAD:
        if replicas > d.current:
            return up if f.cap is None else f"{up}, at most {f.cap} this tick"
        if replicas < d.current:
            return down
        return f"{up}, {down.removesuffix(_plan(f))}"
    if d.rule is Rule.TOLERANCE:
        need = up if d.need is not None and math.ceil(d.need) > d.current else down
        return f"{need}, within {cfg.tolerance:.0%} of {d.current}"
    if d.rule is Rule.BURST_HOLD:
        unheld = max(d.need or 0.0, f.arrivals_need)
        return f"{_hold(f, f'{_tenths(f.held)} replicas')}; at most {_tenths(unheld)} needed {over_down}"
    if d.rule is Rule.COVERAGE:
        covered = f"samples cover {f.down_coverage:.0%} of the last {cfg.scale_down_window_s:g} s"
        return f"{covered}: no scale-down yet"
    if d.rule is Rule.BACKLOG:
        return f"{f.backlog_mu:.1f} MU wait at the router: no scale-down while a backlog waits"
    if d.rule is Rule.SCALE_TO_ZERO:
        return f"no request for {cfg.scale_to_zero_grace_s:g} s and scale to zero is allowed"
    if d.rule is Rule.ACTIVE:
        return f"a request came within the last {cfg.scale_to_zero_grace_s:g} s: at least one replica"
    if d.rule is Rule.MAXIMUM:
        if replicas < d.current:
            return f"lowered to the maximum {replicas}"
        return f"{up}, held at the maximum {replicas}"
    bound = "minimum" if d.rule is Rule.MINIMUM else "predicted minimum"
    due = "" if d.rule is Rule.MINIMUM else "a recurring peak is due: "
    if replicas > d.current:
        return f"{due}raised to the {bound} {replicas}"
    return f"{down}, {due}held at the {bound} {replicas}"


def numbers(d: Decision) -> str:
    """The decision's figures, the same in every event: the scale-up window's load and needs,
    the scale-down window's highest need by arrivals, a burst's hold, the share planned for."""
    f, cfg = d.figures, d.figures.config
    if d.rule is Rule.NO_DATA:
        return f"a decision needs {cfg.min_coverage:.0%} of the last {cfg.scale_up_window_s:g} s covered"
    waiting = f" + {f.queued:.1f} waiting" if f.queued else ""
    backlog = f", {f.backlog_mu:.1f} MU waiting at the router" if f.backlog_mu else ""
    text = (
        f"over the last {cfg.scale_up_window_s:g} s: {f.mu_per_minute:.1f} MU/min"
        f" (its busiest {min(cfg.peak_window_s, cfg.scale_up_window_s):g} s) and {f.in_flight:.1f}"
        f" in flight{waiting}{backlog}: {f.by_mu:.2f} replicas by MU, {f.by_requests:.2f} by requests;"
        f" over the last {cfg.scale_down_window_s:g} s, arrivals: up to {f.arrivals_need:.2f}"
    )
    if f.held > 0:
        text += f"; {_hold(f, f'{f.held:.2f}', the_last='')}"
    return f"{text}; {planning(f)}"


def planning(f: Figures) -> str:
    """The share of a replica planned for, and why where it is not the configured one."""
    cfg = f.config
    if f.calm:
        return f"calm for {cfg.calm_history_s:g} s: planned at a full replica"
    if f.calm_spell:  # why an operator's calm history keeps the margins
        kept = f"planned at {f.utilisation:.2f} of a replica, not a full one" if f.quiet else "margins kept"
        return (
            f"calm for {cfg.calm_history_s:g} s, but its work varies {f.spread:.2f} over"
            f" {cfg.burst_wait_s:g} s, above {cfg.calm_max_spread:g}: {kept}"
        )
    if f.quiet:
        return f"no burst for {cfg.quiet_after_s:g} s: planned at {f.utilisation:.2f} of a replica"
    if _carries(f):
        return f"a series of bursts carried: planned at {f.utilisation:.2f} of a replica"
    if f.recurring:
        return f"bursts recur: planned at {f.utilisation:.2f} of a replica, the hold uncapped"
    return f"planned at {f.utilisation:.2f} of a replica"


def detail(d: Decision) -> dict[str, Any]:
    """The decision's figures for an Event's detail (JSON), beside its words."""
    f = d.figures
    return {
        "rule": d.rule.value,
        "need": d.need,
        "down_need": d.down_need,
        "window_s": f.config.scale_up_window_s,
        "down_window_s": f.config.scale_down_window_s,
        "by_mu": f.by_mu,
        "by_requests": f.by_requests,
        "arrivals_need": f.arrivals_need,
        "burst_hold": f.held,
        "recurring": f.recurring,
        "series_held": f.carried,
        "utilisation": f.utilisation,
        "reason": explain(d),
    }


def _plan(f: Figures) -> str:
    """The mechanism that set the share of a replica a need is planned at, where not the margin."""
    if f.calm:
        return " (calm history)"
    if _carries(f):
        return " (a series carried)"
    if f.recurring:
        return " (bursts recur)"
    return " (quiet margin)" if f.quiet else ""


def _hold(f: Figures, figure: str, the_last: str = "the last ") -> str:
    """What holds replicas past the scale-down window, with its figure."""
    memory = f"{f.config.burst_memory_s:g} s"
    if _carries(f):
        return f"a series of bursts at one level holds {figure} for {memory} after its last"
    if f.recurring:
        return f"bursts recurring within {the_last}{memory} hold {figure}"
    return f"a burst within {the_last}{memory} holds {figure}"


def _carries(f: Figures) -> bool:
    """A series carried past the memory is what holds (its level, not the memory's own hold)."""
    return f.carried > 0 and f.carried >= f.held


def _tenths(x: float | None) -> str:
    """Rounded up to a tenth: 2.29 -> "2.3", 3.01 -> "3.1" (never below what the decider asked)."""
    return f"{math.ceil((x or 0.0) * 10 - 1e-9) / 10:.1f}"
