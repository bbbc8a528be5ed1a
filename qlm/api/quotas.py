"""Per-tenant admission quotas: a request-rate bucket and a token bucket per tenant.

A token bucket refills at `rate` per second up to `capacity`; a request takes its amount
when the bucket holds it, else it is refused with the time until it would (Retry-After).
An amount larger than the capacity is admitted from a full bucket and leaves it in debt, so
a large request is never refused forever and the long-run rate still holds. Tokens are
charged at admission as prompt tokens plus the output cap (the most the request can use);
nothing is refunded when a request ends early, only when the queue refuses it.

Buckets live in this API process, on the injected clock's monotonic time: with N replicas
behind a load balancer, a tenant gets up to N times its quota. Buckets of idle tenants (full
again) are dropped when many tenants are tracked, so anonymous `user` values cannot grow
memory without bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qlm.api.errors import ApiError
from qlm.clock import Clock
from qlm.config.api_settings import ApiAppConfig, QuotaConfig

_PRUNE_ABOVE = 10_000  # tracked tenants before idle buckets are dropped


@dataclass(slots=True)
class TokenBucket:
    rate_per_s: float
    capacity: float
    level: float
    at_s: float

    @classmethod
    def full(cls, rate_per_s: float, capacity: float, now_s: float) -> TokenBucket:
        return cls(rate_per_s, capacity, capacity, now_s)

    def refill(self, now_s: float) -> None:
        if now_s > self.at_s:
            self.level = min(self.capacity, self.level + (now_s - self.at_s) * self.rate_per_s)
            self.at_s = now_s

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` can be taken (0: now). Call after refill."""
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate_per_s

    def is_full(self, now_s: float) -> bool:
        self.refill(now_s)
        return self.level >= self.capacity


@dataclass(frozen=True, slots=True)
class Charge:
    """What one admission took, so a refused enqueue can give it back."""

    tenant: str
    requests: int
    tokens: int


class _TenantBuckets:
    def __init__(self, quota: QuotaConfig, now_s: float) -> None:
        self.requests = _bucket(quota.requests_per_s, quota.burst_requests, 1.0, now_s)
        tokens_per_s = None if quota.tokens_per_min is None else quota.tokens_per_min / 60.0
        self.tokens = _bucket(tokens_per_s, quota.burst_tokens, 60.0, now_s)

    def buckets(self) -> tuple[TokenBucket, ...]:
        return tuple(b for b in (self.requests, self.tokens) if b is not None)


def _bucket(
    rate_per_s: float | None, burst: int | None, default_window_s: float, now_s: float
) -> TokenBucket | None:
    if rate_per_s is None:
        return None
    capacity = float(burst) if burst is not None else max(1.0, rate_per_s * default_window_s)
    return TokenBucket.full(rate_per_s, capacity, now_s)


class TenantQuotas:
    """Charges admissions against each tenant's buckets."""

    def __init__(self, settings: ApiAppConfig, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._tenants: dict[str, _TenantBuckets] = {}
        self.enabled = settings.api.quota.limited or any(
            q.limited for q in settings.api.tenant_quotas.values()
        )

    def charge(self, tenant: str, tokens: int) -> Charge | None:
        """Take one request and `tokens` from the tenant's buckets, or raise ApiError 429 with
        Retry-After (and take nothing). None when the tenant has no quota."""
        if not self.enabled:
            return None
        now_s = self._clock.monotonic_s()
        state = self._tenants.get(tenant)
        if state is None:
            quota = self._settings.api.quota_of(tenant)
            if not quota.limited:
                return None
            self._prune(now_s)
            state = self._tenants[tenant] = _TenantBuckets(quota, now_s)
        requests, tokens_bucket = state.requests, state.tokens
        wait_s, what = 0.0, ""
        if requests is not None:
            requests.refill(now_s)
            wait_s, what = requests.wait_s(1), "request rate"
        if tokens_bucket is not None:
            tokens_bucket.refill(now_s)
            tokens_wait_s = tokens_bucket.wait_s(tokens)
            if tokens_wait_s > wait_s:
                wait_s, what = tokens_wait_s, "token"
        if wait_s > 0:
            raise _over_quota(tenant, what, wait_s)
        if requests is not None:
            requests.level -= 1
        if tokens_bucket is not None:
            tokens_bucket.level -= tokens
        return Charge(tenant, 1, tokens)

    def refund(self, charge: Charge | None) -> None:
        """Give back what `charge` took (the queue refused the request)."""
        state = None if charge is None else self._tenants.get(charge.tenant)
        if charge is None or state is None:
            return
        if state.requests is not None:
            state.requests.level = min(state.requests.capacity, state.requests.level + 1)
        if state.tokens is not None:
            state.tokens.level = min(state.tokens.capacity, state.tokens.level + charge.tokens)

    def _prune(self, now_s: float) -> None:
        if len(self._tenants) < _PRUNE_ABOVE:
            return
        idle = [
            t
            for t, state in self._tenants.items()
            if all(b.is_full(now_s) for b in state.buckets())
        ]
        for tenant in idle:
            del self._tenants[tenant]


def _over_quota(tenant: str, what: str, wait_s: float) -> ApiError:
    retry_after_s = max(1, math.ceil(wait_s))
    return ApiError(
        429,
        f"Tenant {tenant!r} is over its {what} quota; retry in {retry_after_s} s.",
        type="rate_limit_error",
        code="rate_limit_exceeded" if what == "request rate" else "token_quota_exceeded",
        headers={"retry-after": str(retry_after_s)},
    )
