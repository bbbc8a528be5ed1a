"""Request waiting-time (RWT) estimator, after QLM eqs. 1-5.

A request with q-1 requests ahead of it waits for their output tokens to be generated. Output
lengths are independent with mean mu_o and variance sigma_o^2, so the tokens ahead are
approximately Normal((q-1) mu_o, (q-1) sigma_o^2); dividing by the instance's token
throughput Theta gives the waiting time. Two refinements (see README.md):

* continuous batching: B requests run at once, so a request waits for the decode work of the
  first max(0, q - B) requests of its model run, not all q - 1 of them (B = 1 is the paper);
* a model change between consecutive groups adds the profile's load time, and the new model
  starts only when all earlier work has drained (no overlap across a swap).

TTFT adds the prefill of every request admitted ahead and of the request itself; completion adds
the request's own decode time. Means and a percentile (mean + z * std) are reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from qlm.config import EstimatorConfig
from qlm.engine.model.tiers import StandbyTier
from qlm.grouping.group import RequestGroup
from qlm.perf.profile import Profile
from qlm.types import Fleet, Instance

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ServiceRates:
    """How one group runs on one instance: the inputs of eqs. 1-5."""

    batch_size: int  # B: sequences decoding together
    throughput_tokens_per_s: float  # Theta at B
    decode_step_s: float  # one iteration at B
    output_tokens_mean: float  # mu_o
    output_tokens_std: float  # sigma_o
    prefill_s: float  # one member's prompt
    load_s: float  # model load time on this instance

    @property
    def decode_work_mean_s(self) -> float:
        """Instance time one request's output takes out of the shared throughput."""
        return self.output_tokens_mean / self.throughput_tokens_per_s

    @property
    def decode_work_var_s2(self) -> float:
        return (self.output_tokens_std / self.throughput_tokens_per_s) ** 2

    @property
    def alignment_s(self) -> float:
        """Extra wait when a batch starts together on an idle engine (after a swap, or on an
        empty engine): slots then free later than in steady state by the renewal offset
        mu (1 - CV^2) / 2 decode steps; zero for CV >= 1."""
        mu, sigma = self.output_tokens_mean, self.output_tokens_std
        return max(0.0, (mu * mu - sigma * sigma) / (2.0 * mu)) * self.decode_step_s


@dataclass(frozen=True, slots=True)
class GroupCost:
    """Per group x instance quantities the planner needs (differ by GPU type).

    occupancy_s: how long the group keeps the instance busy (prefill plus decode work).
    ttft_lag_s / completion_lag_s: from the moment the work ahead of the group has drained to
    the percentile TTFT / completion of the group's last request.
    """

    group_id: str
    instance_id: str
    occupancy_s: float
    ttft_lag_s: float
    completion_lag_s: float
    load_s: float


@dataclass(frozen=True, slots=True)
class GroupEstimate:
    """Estimates for one group at its position in a virtual queue (seconds from now)."""

    group_id: str
    start_s: float  # when its first member is admitted, mean
    ttft_mean_s: float  # last member
    ttft_p_s: float  # last member, at the configured percentile
    completion_mean_s: float
    completion_p_s: float
    swap_before: bool  # the model changes just before this group
    decode_step_s: float = 0.0  # one decode iteration of its batch on this instance


@dataclass(frozen=True, slots=True)
class QueueEstimate:
    """A virtual queue's estimates: per group, and per request in queue order."""

    instance_id: str
    percentile: float
    groups: tuple[GroupEstimate, ...]
    request_ids: tuple[str, ...]
    ttft_mean_s: FloatArray
    ttft_p_s: FloatArray
    completion_mean_s: FloatArray
    completion_p_s: FloatArray

    @property
    def swaps(self) -> int:
        return sum(g.swap_before for g in self.groups)


@dataclass(frozen=True, slots=True)
class Violation:
    group_id: str
    instance_id: str
    target: str  # "ttft" or "completion"
    predicted_at_s: float
    deadline_at_s: float

    @property
    def late_s(self) -> float:
        return self.predicted_at_s - self.deadline_at_s


class RwtEstimator:
    """The QLM waiting-time estimator over a fleet's profiles."""

    def __init__(self, config: EstimatorConfig, fleet: Fleet) -> None:
        self.config = config
        self.fleet = fleet
        self.z = NormalDist().inv_cdf(config.percentile)

    def rates(self, group: RequestGroup, instance: Instance) -> ServiceRates | None:
        """Service rates of a group on an instance; None if the instance cannot serve it."""
        if not self.fleet.can_serve(instance, group.model):
            return None
        profile = self.fleet.profile(group.model, instance)
        assert profile is not None
        return _rates(profile, group, instance)

    def group_cost(self, group: RequestGroup, instance: Instance) -> GroupCost | None:
        rates = self.rates(group, instance)
        if rates is None:
            return None
        n = group.size
        waited = max(0, n - rates.batch_size)  # members whose decode work the last one waits on
        ttft_mean = n * rates.prefill_s + waited * rates.decode_work_mean_s
        ttft_std = math.sqrt(waited * rates.decode_work_var_s2)
        own_mean = rates.output_tokens_mean * rates.decode_step_s
        own_std = rates.output_tokens_std * rates.decode_step_s
        completion_std = math.sqrt(ttft_std**2 + own_std**2)
        return GroupCost(
            group_id=group.id,
            instance_id=instance.id,
            occupancy_s=n * (rates.prefill_s + rates.decode_work_mean_s),
            ttft_lag_s=ttft_mean + self.z * ttft_std,
            completion_lag_s=ttft_mean + own_mean + self.z * completion_std,
            load_s=rates.load_s,
        )

    def estimate_queue(
        self, queue: Sequence[RequestGroup], instance: Instance, busy_s: float = 0.0
    ) -> QueueEstimate:
        """Estimate every request of a virtual queue. busy_s is work already in the engine."""
        builder = _QueueWalk(instance.loaded_model, busy_s, self.z)
        tier = StandbyTier(instance.standby_capacity, instance.standby_models)
        model = instance.loaded_model
        for group in queue:
            rates = self.rates(group, instance)
            if rates is None:
                raise ValueError(f"instance {instance.id} cannot serve model {group.model}")
            if group.model != model:  # the tier as the engine keeps it (engine/model/core.py)
                warm = tier.wake(group.model)
                if model is not None:
                    tier.sleep(model)
                profile = self.fleet.profile(group.model, instance)
                assert profile is not None
                rates = replace(rates, load_s=profile.load_time_s(warm))
                model = group.model
            builder.add(group, rates)
        return builder.result(instance.id, self.config.percentile)

    def violations(
        self,
        queue: Sequence[RequestGroup],
        estimate: QueueEstimate,
        now_s: float,
    ) -> tuple[Violation, ...]:
        """Groups whose percentile TTFT or completion would miss their deadline."""
        found: list[Violation] = []
        for group, est in zip(queue, estimate.groups, strict=True):
            ttft_at = now_s + est.ttft_p_s
            if ttft_at > group.ttft_deadline_at_s:
                found.append(
                    Violation(
                        group.id, estimate.instance_id, "ttft", ttft_at, group.ttft_deadline_at_s
                    )
                )
            done_at = now_s + est.completion_p_s
            deadline = group.completion_deadline_at_s
            if deadline is not None and done_at > deadline:
                found.append(
                    Violation(group.id, estimate.instance_id, "completion", done_at, deadline)
                )
        return tuple(found)


def _rates(profile: Profile, group: RequestGroup, instance: Instance) -> ServiceRates:
    """Expected output is the profile's mean capped by the requests' max_tokens; the spread
    scales with it (a documented approximation of a truncated distribution). An engine that
    shares its GPUs (qlm/sim/sharing.py) is priced as if it ran alone on them."""
    mu = min(profile.output_tokens_mean, group.output_cap_mean)
    sigma = profile.output_tokens_std * mu / profile.output_tokens_mean
    batch = profile.batch_size_for(instance.gpu_memory_bytes, group.prompt_tokens_mean + mu)
    step_s = profile.decode_step_s_at(batch)
    return ServiceRates(
        batch_size=batch,
        throughput_tokens_per_s=batch / step_s,
        decode_step_s=step_s,
        output_tokens_mean=mu,
        output_tokens_std=sigma,
        prefill_s=profile.prefill_s(group.prompt_tokens_mean),
        load_s=profile.load_time_s(group.model in instance.standby_models),
    )


class _QueueWalk:
    """Walks a virtual queue group by group, keeping the work ahead as (mean, variance)."""

    def __init__(self, loaded_model: str | None, busy_s: float, z: float) -> None:
        self.model = loaded_model
        self.z = z
        self.fresh = busy_s <= 0.0  # the current run starts on an idle engine
        self.alignment_s = 0.0
        self.drained_mean_s = busy_s  # all work before the current model run
        self.drained_var_s2 = 0.0
        self.run_prefill_s = 0.0  # prefill of requests admitted in the current run
        self.run_decode: list[tuple[float, float]] = []  # per-group (mean, var) decode work
        self.run_decode_counts: list[int] = []
        self.groups: list[GroupEstimate] = []
        self.ids: list[str] = []
        self.columns: list[tuple[FloatArray, FloatArray, FloatArray, FloatArray]] = []

    def add(self, group: RequestGroup, rates: ServiceRates) -> None:
        swap = self.model != group.model
        if swap:
            self._close_run(rates.load_s)
            self.model = group.model
        n = group.size
        ahead_in_run = sum(self.run_decode_counts)
        if ahead_in_run == 0 and self.fresh:
            self.alignment_s = rates.alignment_s
        index = np.arange(n, dtype=np.float64) + ahead_in_run  # requests ahead within the run
        waited = np.maximum(0.0, index - rates.batch_size + 1)  # decode work waited on
        dec_mean, dec_var = self._decode_ahead(waited, rates)
        dec_mean += np.where(waited > 0, self.alignment_s, 0.0)
        prefill = self.run_prefill_s + (np.arange(n) + 1) * rates.prefill_s
        ttft_mean = self.drained_mean_s + prefill + dec_mean
        ttft_std = np.sqrt(self.drained_var_s2 + dec_var)
        own_mean = rates.output_tokens_mean * rates.decode_step_s
        own_var = (rates.output_tokens_std * rates.decode_step_s) ** 2
        done_mean = ttft_mean + own_mean
        done_std = np.sqrt(ttft_std**2 + own_var)
        cols = (ttft_mean, ttft_mean + self.z * ttft_std, done_mean, done_mean + self.z * done_std)
        self.columns.append(cols)
        self.ids.extend(group.request_ids)
        self.groups.append(
            GroupEstimate(
                group_id=group.id,
                start_s=float(ttft_mean[0] - rates.prefill_s),
                ttft_mean_s=float(cols[0][-1]),
                ttft_p_s=float(cols[1][-1]),
                completion_mean_s=float(cols[2][-1]),
                completion_p_s=float(cols[3][-1]),
                swap_before=swap,
                decode_step_s=rates.decode_step_s,
            )
        )
        self.run_prefill_s += n * rates.prefill_s
        self.run_decode.append((rates.decode_work_mean_s, rates.decode_work_var_s2))
        self.run_decode_counts.append(n)

    def _decode_ahead(
        self, waited: FloatArray, rates: ServiceRates
    ) -> tuple[FloatArray, FloatArray]:
        """Mean and variance of the decode work of the first `waited` requests of the run,
        where earlier groups of the run contribute at their own rates."""
        mean = np.zeros_like(waited)
        var = np.zeros_like(waited)
        remaining = waited.copy()
        for (m, v), count in zip(self.run_decode, self.run_decode_counts, strict=True):
            take = np.minimum(remaining, count)
            mean += take * m
            var += take * v
            remaining -= take
        mean += remaining * rates.decode_work_mean_s
        var += remaining * rates.decode_work_var_s2
        return mean, var

    def _close_run(self, load_s: float) -> None:
        """A swap waits for everything admitted so far to finish, then loads the model."""
        self.drained_mean_s += self.run_prefill_s + load_s
        for (m, v), count in zip(self.run_decode, self.run_decode_counts, strict=True):
            self.drained_mean_s += count * m
            self.drained_var_s2 += count * v
        self.run_prefill_s = 0.0
        self.run_decode = []
        self.run_decode_counts = []
        self.fresh = True

    def result(self, instance_id: str, percentile: float) -> QueueEstimate:
        def stack(k: int) -> FloatArray:
            if not self.columns:
                return np.zeros(0)
            return np.concatenate([c[k] for c in self.columns])

        return QueueEstimate(
            instance_id=instance_id,
            percentile=percentile,
            groups=tuple(self.groups),
            request_ids=tuple(self.ids),
            ttft_mean_s=stack(0),
            ttft_p_s=stack(1),
            completion_mean_s=stack(2),
            completion_p_s=stack(3),
        )
