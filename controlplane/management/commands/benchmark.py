"""python manage.py benchmark --model M --gpu G [--engine-url URL | --simulated PROFILE]
[--create-model] [--json]

A model with no profile on that GPU type is refused, naming the models it has, unless
--create-model says to make one: a published fit makes the pair sellable, so a typo must not.
--simulated PROFILE measures that simulated engine profile (python -m dataplane.runtime.sim
--list-profiles) in-process on a virtual clock: SIMULATED, and labelled so in the record's
engine field and the JSON's; the machine's load does not change its numbers."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from capacity.benchmark.drivers import SimulatedDriver
from capacity.benchmark.results import shape_name
from controlplane import profile_benchmarks
from controlplane.capacity.models import GpuType, ModelProfile, ProfileFit
from engine_model.profiles import get_profile


class Command(BaseCommand):
    help = (
        "Benchmark one model x GPU pair now: prints the shapes, rates and the fit. With --json the last"
        " line is one JSON object (alpha, beta, gamma, r2, heldout_mape, samples, published, ...)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", required=True, help="model name, as endpoints and profiles name it")
        parser.add_argument("--gpu", required=True, help="GPU type name, e.g. h100-80gb")
        parser.add_argument("--engine-url", help="an OpenAI-compatible engine serving the model on that GPU")
        parser.add_argument(
            "--simulated",
            metavar="PROFILE",
            help="measure this SIMULATED engine profile in-process on a virtual clock (no GPU)",
        )
        parser.add_argument(
            "--create-model",
            action="store_true",
            help="make a profile for a model the GPU type has none of (published when its fit passes)",
        )
        parser.add_argument("--json", action="store_true", help="end with one JSON line")

    def handle(
        self,
        model: str,
        gpu: str,
        engine_url: str | None,
        simulated: str | None,
        create_model: bool,
        json: bool,
        **options: Any,
    ) -> None:
        if engine_url and simulated:
            raise CommandError("give --engine-url or --simulated, not both")
        driver = None
        if simulated:
            try:
                driver = SimulatedDriver(get_profile(simulated))
            except ValueError as error:
                raise CommandError(f"--simulated: {error}") from None
        gpu_type = GpuType.objects.filter(name=gpu).first()
        if gpu_type is None:
            known = ", ".join(GpuType.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"unknown GPU type {gpu!r} (known: {known})")
        profile = ModelProfile.objects.filter(model=model, gpu_type=gpu_type).first()
        if profile is None:
            if not create_model:
                models = ModelProfile.objects.filter(gpu_type=gpu_type).order_by("model")
                known = ", ".join(models.values_list("model", flat=True)) or "none"
                raise CommandError(
                    f"unknown model {model!r} on {gpu} (its models: {known}); --create-model makes a"
                    " profile for it, published and sellable when its fit passes"
                )
            profile = ModelProfile(model=model, gpu_type=gpu_type, alpha=0, beta=0, gamma=0)
        elif not profile_benchmarks.claim(profile.pk, timezone.now(), only_if_due=False):
            raise CommandError(f"a benchmark of {profile} is already running")
        where = engine_url or (f"SIMULATED profile {simulated} (virtual clock)" if simulated else None)
        self.stderr.write(f"Benchmarking {model} on {gpu} at {where or 'the configured engine'} ...")
        record = profile_benchmarks.run_benchmark(profile, engine_url=engine_url, driver=driver)
        self.stdout.write(_table(record))
        # Shapes this machine's client could not drive to the engine's capacity: left out of the
        # fit and its held-out error (capacity.benchmark.checks.client_bound).
        client_bound = [
            shape_name(r["input_tokens"], r["output_tokens"]) for r in record.shapes if r.get("client_bound")
        ]
        if client_bound:
            self.stdout.write(
                "client-bound, not priced from (the client could not offer the engine's rate): "
                + ", ".join(client_bound)
            )
        summary = {
            "alpha": record.alpha,
            "beta": record.beta,
            "gamma": record.gamma,
            "delta": record.delta or 0.0,  # MU per image token (capacity.units); 0: no vision
            "delta_unit": "MU per image token",
            "cached_token_factor": record.cached_token_factor,  # measured share of alpha; None: not
            "delta_heldout_mape": record.extras.get("delta", {}).get("heldout_mape"),
            "cached_token_factor_heldout_mape": record.extras.get("cached_token_factor", {}).get(
                "heldout_mape"
            ),
            "rho": record.rho,
            "kappa": record.kappa,
            "r2": record.r2,
            "heldout_mape": record.heldout_mape,
            "samples": record.samples,
            "client_bound": client_bound,
            "published": record.status == ProfileFit.Status.PUBLISHED,
            "status": record.status,
            "reason": record.reason,
            "engine": record.engine,
            "simulated": record.engine.startswith("simulated"),
            "worst_underprice": min(
                (row["residual"] for row in record.shapes if row.get("residual", "") != ""), default=None
            ),
            "beta_over_alpha": (record.beta / record.alpha)
            if record.alpha and record.beta is not None
            else None,
            "seconds": round((record.finished_at - record.started_at).total_seconds(), 1),
        }
        self.stdout.write(f"{record.status}: {record.reason}")
        if json:
            self.stdout.write(_json.dumps(summary))
        if record.status == ProfileFit.Status.FAILED and not json:
            raise CommandError(record.reason)


_json = json


def _table(record: ProfileFit) -> str:
    lines = [f"{'in':>6} {'out':>5} {'solo s':>8} {'req/min':>11} {'cost MU':>10} {'fit MU':>10}  note"]
    for row in record.shapes:
        cost = f"{row['cost_mu']:>10.5f}" if row["cost_mu"] != "" else f"{'-':>10}"
        lines.append(
            f"{row['input_tokens']:>6} {row['output_tokens']:>5} {row['solo_latency_s']:>8.3f}"
            f" {row['requests_per_minute']:>11.1f} {cost} {row['fitted_mu']:>10.5f}  {row['note']}"
        )
    if record.alpha is not None:
        lines.append(
            f"alpha {record.alpha:.6g} MU/input token, beta {record.beta:.6g} MU/output token,"
            f" gamma {record.gamma:.6g} MU/request (long requests: rho {record.rho or 0:.3g},"
            f" kappa {record.kappa or 0:.3g}); R^2 {record.r2:.4f},"
            f" held-out MAPE {record.heldout_mape:.2%}, {record.samples} shapes"
        )
    return "\n".join(lines)
