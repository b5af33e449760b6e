"""What a benchmark sweep records: every step (Step), each shape's sustainable rate
(ShapeResult) and the whole sweep (SweepResult, which fits its price); BenchmarkError when the
engine fails, naming the shape. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from capacity.fitting import DEFAULT_MAX_UNDERPRICE, Fit, Measurement, fit
from capacity.units import MU_PER_REPLICA_MINUTE


def shape_name(input_tokens: int, output_tokens: int) -> str:
    """How a shape is named in tables, notes and JSON: "16x1" is 16 tokens in, 1 out."""
    return f"{input_tokens}x{output_tokens}"


@dataclass(frozen=True)
class Step:
    mode: str  # "closed" (concurrency held) or "open" (Poisson arrivals)
    concurrency: int  # closed: requests held in flight; open: 0
    offered_per_s: float  # open: the arrival rate; closed: 0. Engine time
    sent: int  # requests sent (fewer than planned when the step stopped early)
    completed: int
    throughput_per_s: float  # completions per engine second
    p99_e2e_s: float | None  # engine seconds
    saturated: bool  # stopped early: too many in flight
    met_slo: bool
    # Closed, timed by the engine's own histogram: the share of the C requests the client meant
    # to hold that the engine held, by Little's law on the engine's latencies (their sum / (C x
    # duration)); the rest of each request's time was spent in the client or on the wire.
    # None: open, or timed by the client's clock (which counts its own time too).
    held_share: float | None = None


@dataclass(frozen=True)
class ShapeResult:
    input_tokens: int
    output_tokens: int
    sustainable_per_minute: float  # highest rate that met the SLO; 0 if not even one request does
    solo_latency_s: float  # one request alone, engine seconds
    steps: tuple[Step, ...]
    note: str = ""  # why a shape was skipped or gave 0
    # The client, not the engine, bounded the rate (capacity.benchmark.checks.client_bound):
    # not the engine's capacity, so the fit leaves it out.
    client_bound: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_tokens, self.output_tokens

    def measurement(self) -> Measurement:
        return Measurement(self.input_tokens, self.output_tokens, self.sustainable_per_minute)


@dataclass(frozen=True)
class SweepResult:
    engine_url: str
    model: str
    shapes: tuple[ShapeResult, ...]
    wall_s: float  # how long the sweep took

    def measurements(self) -> list[Measurement]:
        """What the fit prices from: the measured shapes, less those the client bounded."""
        return [s.measurement() for s in self.shapes if s.sustainable_per_minute > 0 and not s.client_bound]

    @property
    def client_bound(self) -> list[str]:
        """The shapes this machine's client could not drive to the engine's capacity, "16x1"."""
        return [shape_name(*s.shape) for s in self.shapes if s.client_bound]

    def fit(
        self,
        mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE,
        max_underprice: float = DEFAULT_MAX_UNDERPRICE,
    ) -> Fit:
        return fit(self.measurements(), mu_per_replica_minute, max_underprice)


class BenchmarkError(Exception):
    """The engine failed a sweep. `unreachable`: the engine itself could not be reached (down,
    refusing connections, its pod never ready), not merely answering errors or slowly."""

    def __init__(self, shape: tuple[int, int] | None, message: str, unreachable: bool = False):
        self.shape = shape
        self.unreachable = unreachable
        where = f"shape ({shape[0]} in, {shape[1]} out): " if shape else ""
        super().__init__(f"{where}{message}")
